//! The master role: cluster membership, placement and the allocation table.
//!
//! The master decides where memory goes and records every allocation; the
//! agents hold the memory and keep the master's record of each allocation
//! they hold, so the master is soft state: after a restart it rebuilds the
//! table from the agents' registrations (`recovery`). It reaches agents
//! only through [`AgentLink`], so this module never imports a transport and
//! is tested with a fake link. It never holds its lock across an await.

pub mod liveness;
pub mod placement;
mod recovery;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use oncilla_model::fabric;
use oncilla_proto::pb::{self, MemKind, NodeState};
use oncilla_proto::wire::KEY_LEN;

use crate::error::CoreError;
use crate::pool::round_up;
pub use liveness::Liveness;
use liveness::{state_name, unix_ms, Seen};
use placement::{Candidate, Planned};

/// Largest single allocation accepted (1 PiB): anything above is a typo.
pub const MAX_ALLOCATION: u64 = 1 << 50;

/// How the master reaches agents.
pub trait AgentLink: Send + Sync + 'static {
    /// Reserves a range of an allocation on the agent at `addr`; returns
    /// where its pieces went and the agent's pool usage.
    fn reserve(
        &self,
        addr: &str,
        req: pb::ReserveRequest,
    ) -> impl Future<Output = Result<pb::ReserveReply, String>> + Send;
    /// Releases everything the agent holds of `alloc_id`.
    fn release(
        &self,
        addr: &str,
        alloc_id: u64,
    ) -> impl Future<Output = Result<pb::ReleaseReply, String>> + Send;
}

struct Node {
    info: pb::NodeInfo,
    /// The agent's current start (a new one holds nothing from before).
    incarnation: u64,
    /// Bytes reserved on the node by allocations (page-rounded).
    reserved: u64,
    /// The pool as the node last reported it.
    pool: pb::PoolUsage,
    seen: Seen,
    /// The state last logged, to log each change once.
    logged: NodeState,
    /// Its sessions as of its registration, less those ended since.
    sessions: recovery::SessionsSeen,
}

impl Node {
    /// Bytes an extent of `len` takes on this node.
    fn footprint(&self, len: u64) -> u64 {
        round_up(len, self.page())
    }

    fn page(&self) -> u64 {
        match self.info.page_size {
            0 => oncilla_proto::PAGE,
            p => p,
        }
    }
}

/// An allocation as the master keeps it.
struct Record {
    /// Without attachments (derived from sessions) and health (derived from
    /// node states when listed).
    alloc: pb::Allocation,
    /// Nodes that restarted since, losing their extents: name -> unix ms.
    lost: BTreeMap<String, u64>,
    /// Rebuilt from an agent's report after a master restart.
    adopted: bool,
}

/// A process's session, known from its allocations and attachments.
struct SessionRec {
    who: pb::Owner,
    /// Persistent allocations it is attached to.
    attached: BTreeSet<u64>,
}

#[derive(Default)]
struct State {
    nodes: BTreeMap<String, Node>,
    allocs: BTreeMap<u64, Record>,
    /// Name -> id of named allocations.
    names: BTreeMap<String, u64>,
    sessions: BTreeMap<String, SessionRec>,
    /// Ids being reserved: agents already hold them, the table not yet.
    reserving: BTreeSet<u64>,
    /// Device memory of allocations being reserved, per (node, GPU): not
    /// in `allocs` yet, but no longer free for placement.
    gpu_reserving: BTreeMap<(String, u32), u64>,
    /// Adopted allocations freed since: a late report of one is released,
    /// not adopted again.
    freed_adopted: BTreeSet<u64>,
    next_id: u64,
}

/// The master core.
pub struct Master<L> {
    link: L,
    liveness: Liveness,
    /// Random per start, never 0; agents report which master they knew.
    incarnation: u64,
    started: Instant,
    /// How long after `started` the table stays frozen.
    recovery: Duration,
    state: Mutex<State>,
}

impl<L: AgentLink> Master<L> {
    /// A master expecting heartbeats as `liveness` says. It serves changes
    /// to the table only after [`Liveness::recovery`], once agents that
    /// knew a previous master have re-registered.
    pub fn new(link: L, liveness: Liveness) -> Self {
        Self {
            link,
            liveness,
            incarnation: rand::random::<u64>().max(1),
            started: Instant::now(),
            recovery: liveness.recovery(),
            state: Mutex::new(State {
                next_id: 1,
                ..State::default()
            }),
        }
    }

    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Time left before the master changes its table (0 once serving).
    pub fn recovering(&self) -> Duration {
        self.recovery.saturating_sub(self.started.elapsed())
    }

    fn check_serving(&self) -> Result<(), CoreError> {
        match self.recovering() {
            d if d.is_zero() => Ok(()),
            d => Err(CoreError::Recovering(d)),
        }
    }

    /// Places, reserves and records a new allocation.
    ///
    /// # Errors
    /// Invalid requests, taken names, unknown/down nodes, exhausted capacity,
    /// a master still recovering, and agents that fail to reserve (whatever
    /// was reserved is released again).
    pub async fn allocate(&self, req: pb::AllocateRequest) -> Result<pb::Allocation, CoreError> {
        self.check_serving()?;
        let spec = req.spec.unwrap_or_default();
        if spec.size > MAX_ALLOCATION {
            return Err(CoreError::InvalidArgument(format!(
                "size {} is above the limit of {MAX_ALLOCATION} bytes",
                spec.size
            )));
        }
        if !spec.name.is_empty() {
            validate_name(&spec.name)?;
        }
        let kind = MemKind::try_from(spec.kind).unwrap_or(MemKind::Unspecified);
        if kind == MemKind::LocalGpu
            && (spec.persistent || !spec.name.is_empty() || req.requester.is_none())
        {
            return Err(CoreError::InvalidArgument(
                "local GPU memory lives in the asking process and ends with it: it cannot be named or persistent, and only a session can ask for it (use remote-gpu)".into(),
            ));
        }
        let preference = pb::Fabric::try_from(spec.fabric).unwrap_or(pb::Fabric::Auto);
        let placement = spec.placement.clone().unwrap_or_default();
        // Named allocations, and everything an operator makes, outlive their creator.
        let persistent = spec.persistent || !spec.name.is_empty() || req.requester.is_none();
        let key: [u8; KEY_LEN] = rand::random();
        let (owner, creator) = match req.requester {
            Some(r) if persistent => (None, Some(r)),
            requester => (requester, None),
        };
        // What every holder keeps, so a restarted master can rebuild it.
        let mut alloc = pb::Allocation {
            size: spec.size,
            kind: kind as i32,
            owner,
            created_unix_ms: unix_ms(),
            name: spec.name.clone(),
            placement: Some(placement.clone()),
            origin_node: req.origin_node.clone(),
            ..pb::Allocation::default()
        };
        let (id, targets, fabrics) = {
            let mut st = self.lock();
            if let Some(&taken) = st.names.get(&spec.name) {
                return Err(CoreError::NameTaken(spec.name, taken));
            }
            let candidates = self.candidates(&st);
            let plan = placement::plan(
                &placement::Request {
                    size: spec.size,
                    kind,
                    placement: &placement,
                    origin: &req.origin_node,
                },
                &candidates,
            )?;
            // What the creator will use for each node, refused up front
            // when its preference cannot reach one.
            let verbs = |node: &str| {
                st.nodes
                    .get(node)
                    .is_some_and(|n| n.info.fabrics.iter().any(|f| f == "verbs"))
            };
            let fabrics = plan
                .iter()
                .map(|p| {
                    let rdma = if verbs(&p.node) && verbs(&req.origin_node) {
                        fabric::Rdma::Both
                    } else {
                        fabric::Rdma::Unavailable(
                            format!(
                                "{} or {} has no usable RDMA port (see `ocmctl nodes`)",
                                p.node,
                                if req.origin_node.is_empty() {
                                    "the caller"
                                } else {
                                    &req.origin_node
                                }
                            )
                            .into(),
                        )
                    };
                    if kind == MemKind::LocalGpu {
                        // In the creator's own process: no fabric reaches it.
                        return Ok(pb::Fabric::Auto);
                    }
                    let memory = match p.gpu {
                        // Registered at reservation on a node with verbs.
                        None => fabric::Memory::Host { rdma: true },
                        Some(_) => fabric::Memory::Gpu {
                            rdma: st
                                .nodes
                                .get(&p.node)
                                .is_some_and(|n| !n.info.gpu_rdma.is_empty()),
                        },
                    };
                    fabric::choose(&p.node, memory, &req.origin_node, preference.into(), &rdma)
                        .map(pb::Fabric::from)
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| CoreError::InvalidArgument(e.to_string()))?;
            let id = st.next_id;
            st.next_id += 1;
            st.reserving.insert(id);
            if !spec.name.is_empty() {
                // Held from now on, so a concurrent request cannot take it.
                st.names.insert(spec.name.clone(), id);
            }
            let mut targets = Vec::with_capacity(plan.len());
            for p in plan {
                let node = st
                    .nodes
                    .get_mut(&p.node)
                    .ok_or_else(|| CoreError::NodeDown(p.node.clone()))?;
                if p.gpu.is_none() {
                    node.reserved += node.footprint(p.bytes());
                }
                let addrs = (node.info.agent_addr.clone(), node.info.data_addr.clone());
                if let Some(g) = p.gpu {
                    *st.gpu_reserving.entry((p.node.clone(), g)).or_default() += p.bytes();
                }
                targets.push((p, addrs.0, addrs.1));
            }
            (id, targets, fabrics)
        };
        alloc.id = id;

        let reserves = targets.iter().zip(&fabrics).map(|((p, addr, _), fabric)| {
            self.link.reserve(
                addr,
                pb::ReserveRequest {
                    alloc_id: id,
                    access_key: key.to_vec(),
                    ranges: p
                        .ranges
                        .iter()
                        .map(|&(alloc_offset, len)| pb::Range { alloc_offset, len })
                        .collect(),
                    record: Some(alloc.clone()),
                    fabric: *fabric as i32,
                    gpu: p.gpu,
                },
            )
        });
        let results = join_all(reserves).await;
        {
            let mut st = self.lock();
            for (r, (p, _, _)) in results.iter().zip(&targets) {
                if let (Ok(reply), Some(n)) = (r, st.nodes.get_mut(&p.node)) {
                    n.pool = reply.pool.unwrap_or(n.pool);
                }
            }
        }
        let results: Vec<Result<Vec<pb::Piece>, String>> = results
            .into_iter()
            .zip(&targets)
            .map(|(r, (p, _, _))| r.and_then(|reply| check_pieces(p, reply.pieces)))
            .collect();
        if let Some((i, err)) = results
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.as_ref().err().map(|e| (i, e.clone())))
        {
            let failed = targets[i].0.node.clone();
            tracing::warn!(alloc_id = id, node = %failed, error = %err, "reserve failed; rolling back");
            self.rollback(id, &spec.name, &targets).await;
            return Err(CoreError::Agent {
                node: failed,
                reason: err,
            });
        }

        for (((p, agent, data), r), fabric) in targets.iter().zip(results).zip(&fabrics) {
            alloc
                .extents
                .extend(r.unwrap_or_default().into_iter().map(|piece| pb::Extent {
                    node: p.node.clone(),
                    alloc_offset: piece.alloc_offset,
                    len: piece.len,
                    pool_offset: piece.pool_offset,
                    data_addr: data.clone(),
                    // An agent whose HCA refused the registration returns no
                    // region: `auto` then reaches the piece over TCP.
                    fabric: if *fabric == pb::Fabric::Verbs
                        && piece.rdma.is_empty()
                        && preference == pb::Fabric::Auto
                    {
                        pb::Fabric::Tcp as i32
                    } else {
                        *fabric as i32
                    },
                    agent_addr: agent.clone(),
                    gpu: p.gpu,
                    rdma: piece.rdma,
                }));
        }
        alloc.extents.sort_by_key(|e| e.alloc_offset);
        alloc.access_key = key.to_vec();
        tracing::info!(
            alloc_id = id,
            size = spec.size,
            name = %alloc.name,
            nodes = targets.len(),
            extents = alloc.extents.len(),
            "allocated"
        );
        let mut st = self.lock();
        st.reserving.remove(&id);
        unreserve_gpus(&mut st, &targets);
        if let Some(who) = creator {
            attach_session(&mut st, who, id);
        }
        st.allocs.insert(
            id,
            Record {
                alloc,
                lost: BTreeMap::new(),
                adopted: false,
            },
        );
        self.view(&st, id)
    }

    /// Undoes a failed allocation. Every target is released, the failed
    /// ones too: a reservation that timed out may still have happened.
    async fn rollback(&self, id: u64, name: &str, targets: &[(Planned, String, String)]) {
        let releases = targets
            .iter()
            .map(|(_, addr, _)| self.link.release(addr, id));
        for r in join_all(releases).await {
            if let Err(e) = r {
                tracing::warn!(alloc_id = id, error = %e, "release during rollback failed; the node's next heartbeat reconciles it");
            }
        }
        let mut st = self.lock();
        st.reserving.remove(&id);
        unreserve_gpus(&mut st, targets);
        st.names.remove(name);
        for (p, _, _) in targets {
            if let (Some(n), None) = (st.nodes.get_mut(&p.node), p.gpu) {
                n.reserved = n.reserved.saturating_sub(n.footprint(p.bytes()));
            }
        }
    }

    /// Frees an allocation. `session` is the asking session, empty for
    /// operators. A persistent allocation that other processes are attached
    /// to is freed only with `force`; they then get "no such allocation"
    /// from every copy.
    ///
    /// # Errors
    /// [`CoreError::NoSuchAllocation`] / [`CoreError::NoSuchName`];
    /// [`CoreError::PermissionDenied`] when a session frees another
    /// session's allocation; [`CoreError::InUse`] without `force`;
    /// [`CoreError::Recovering`].
    pub async fn free(
        &self,
        target: &pb::AllocRef,
        session: &str,
        force: bool,
    ) -> Result<(), CoreError> {
        self.check_serving()?;
        let (id, holders) = {
            let mut st = self.lock();
            let id = resolve(&st, target)?;
            let rec = st.allocs.get(&id).ok_or(CoreError::NoSuchAllocation(id))?;
            if let Some(owner) = &rec.alloc.owner {
                if !session.is_empty() && owner.session_id != session {
                    return Err(CoreError::PermissionDenied(format!(
                        "allocation {id} belongs to another session ({})",
                        owner.session_id
                    )));
                }
            }
            let others: Vec<String> = attached_to(&st, id)
                .into_iter()
                .filter(|a| a.session_id != session)
                .map(describe)
                .collect();
            if !others.is_empty() && !force {
                return Err(CoreError::InUse {
                    id,
                    by: others.join(", "),
                });
            }
            let holders = remove(&mut st, id);
            (id, self.live_holders(&st, holders))
        };
        self.release_on(id, holders).await;
        tracing::info!(alloc_id = id, force, "freed");
        Ok(())
    }

    /// Tells every holder to release `id` and records their pool usage. A
    /// holder that cannot be reached drops it on its next heartbeat (it
    /// reports what it holds; the master answers with what to release).
    async fn release_on(&self, id: u64, holders: Vec<(String, String)>) {
        let replies = join_all(holders.iter().map(|(_, a)| self.link.release(a, id))).await;
        let mut st = self.lock();
        for ((node, _), r) in holders.iter().zip(replies) {
            match r {
                Ok(reply) => {
                    if let Some(n) = st.nodes.get_mut(node) {
                        n.pool = reply.pool.unwrap_or(n.pool);
                    }
                }
                Err(e) => {
                    tracing::warn!(alloc_id = id, node = %node, error = %e, "agent did not confirm release; its next heartbeat reconciles it");
                }
            }
        }
    }

    /// Attaches a process to a persistent allocation (by id or name).
    ///
    /// # Errors
    /// Unknown allocations; [`CoreError::InvalidArgument`] for one that
    /// belongs to a session (it ends with that session);
    /// [`CoreError::Recovering`].
    pub fn attach(
        &self,
        target: &pb::AllocRef,
        who: pb::Owner,
    ) -> Result<pb::Allocation, CoreError> {
        self.check_serving()?;
        let mut st = self.lock();
        let id = resolve(&st, target)?;
        let rec = st.allocs.get(&id).ok_or(CoreError::NoSuchAllocation(id))?;
        if let Some(owner) = &rec.alloc.owner {
            return Err(CoreError::InvalidArgument(format!(
                "allocation {id} belongs to {} and ends with it; only persistent allocations can be attached",
                describe(owner)
            )));
        }
        attach_session(&mut st, who, id);
        let alloc = self.view(&st, id)?;
        tracing::info!(alloc_id = id, attached = alloc.attached.len(), "attached");
        Ok(alloc)
    }

    /// Detaches a session from an allocation.
    ///
    /// # Errors
    /// [`CoreError::NoSuchAllocation`]; [`CoreError::Recovering`].
    pub fn detach(&self, id: u64, session: &str) -> Result<(), CoreError> {
        self.check_serving()?;
        let mut st = self.lock();
        if !st.allocs.contains_key(&id) {
            return Err(CoreError::NoSuchAllocation(id));
        }
        if let Some(s) = st.sessions.get_mut(session) {
            s.attached.remove(&id);
        }
        Ok(())
    }

    /// Frees every allocation a session owns and detaches it from every
    /// other (its application exited); returns how many were freed.
    pub async fn end_session(&self, session: &str) -> u32 {
        let freed: Vec<(u64, Vec<(String, String)>)> = {
            let mut st = self.lock();
            st.sessions.remove(session);
            let ids: Vec<u64> = st
                .allocs
                .values()
                .filter(|r| {
                    r.alloc
                        .owner
                        .as_ref()
                        .is_some_and(|o| o.session_id == session)
                })
                .map(|r| r.alloc.id)
                .collect();
            ids.into_iter()
                .map(|id| {
                    let holders = remove(&mut st, id);
                    (id, self.live_holders(&st, holders))
                })
                .collect()
        };
        let n = u32::try_from(freed.len()).unwrap_or(u32::MAX);
        for (id, holders) in freed {
            self.release_on(id, holders).await;
        }
        if n > 0 {
            tracing::info!(
                session,
                freed = n,
                "session ended; its allocations are freed"
            );
        }
        n
    }

    /// Every node with its usage and state.
    pub fn nodes(&self) -> Vec<pb::NodeStatus> {
        let st = self.lock();
        st.nodes
            .values()
            .map(|n| {
                let (state, since) = n.seen.state(&self.liveness);
                pb::NodeStatus {
                    info: Some(n.info.clone()),
                    used: n.reserved,
                    state: state as i32,
                    last_heartbeat_ms_ago: u64::try_from(n.seen.last.elapsed().as_millis())
                        .unwrap_or(u64::MAX),
                    pool: Some(n.pool),
                    state_since_unix_ms: since,
                    incarnation: n.incarnation,
                }
            })
            .collect()
    }

    /// Every allocation, by id, with attachments and health.
    pub fn allocations(&self) -> Vec<pb::Allocation> {
        let st = self.lock();
        // Attachments indexed once, not a scan of every session per allocation.
        let mut attached: BTreeMap<u64, Vec<pb::Owner>> = BTreeMap::new();
        for s in st.sessions.values() {
            for id in &s.attached {
                attached.entry(*id).or_default().push(s.who.clone());
            }
        }
        st.allocs
            .values()
            .map(|rec| {
                let who = attached.remove(&rec.alloc.id).unwrap_or_default();
                self.render(&st, rec, who)
            })
            .collect()
    }

    /// One allocation, by id or name.
    ///
    /// # Errors
    /// [`CoreError::NoSuchAllocation`] / [`CoreError::NoSuchName`].
    pub fn allocation(&self, target: &pb::AllocRef) -> Result<pb::Allocation, CoreError> {
        let st = self.lock();
        let id = resolve(&st, target)?;
        self.view(&st, id)
    }

    /// Logs every node whose state changed since the last call (call it
    /// about once per heartbeat interval).
    pub fn tick(&self) {
        let mut st = self.lock();
        let degraded_on = |st: &State, node: &str| {
            st.allocs
                .values()
                .filter(|r| r.alloc.extents.iter().any(|e| e.node == node))
                .count()
        };
        let mut changes = Vec::new();
        for n in st.nodes.values_mut() {
            let (state, _) = n.seen.state(&self.liveness);
            if state != n.logged {
                changes.push((n.info.name.clone(), n.logged, state));
                n.logged = state;
            }
        }
        for (node, from, to) in changes {
            let allocations = degraded_on(&st, &node);
            match to {
                NodeState::Up => {
                    tracing::info!(%node, from = state_name(from), "node up again");
                }
                NodeState::Down => tracing::warn!(
                    %node,
                    silent_ms = self.liveness.down_after.as_millis(),
                    degraded_allocations = allocations,
                    "node down: missed its heartbeats"
                ),
                _ => tracing::warn!(%node, to = state_name(to), "node missed heartbeats"),
            }
        }
    }

    /// The holders worth telling to release now: those that are up. The
    /// others learn it from the reply to their next heartbeat.
    fn live_holders(&self, st: &State, holders: Vec<(String, String)>) -> Vec<(String, String)> {
        holders
            .into_iter()
            .filter(|(node, _)| {
                st.nodes
                    .get(node)
                    .is_some_and(|n| n.seen.state(&self.liveness).0 == NodeState::Up)
            })
            .collect()
    }

    /// An allocation as clients see it: with attachments and health.
    fn view(&self, st: &State, id: u64) -> Result<pb::Allocation, CoreError> {
        let rec = st.allocs.get(&id).ok_or(CoreError::NoSuchAllocation(id))?;
        let attached = attached_to(st, id).into_iter().cloned().collect();
        Ok(self.render(st, rec, attached))
    }

    /// `rec` with the processes `attached` to it and its health.
    fn render(&self, st: &State, rec: &Record, attached: Vec<pb::Owner>) -> pb::Allocation {
        let mut a = rec.alloc.clone();
        a.attached = attached;
        let (health, notes) = self.health(st, rec);
        a.health = health as i32;
        a.health_notes = notes;
        a
    }

    /// LOST when a holder restarted since, DEGRADED when a holder is down or
    /// has not re-registered (or bytes are missing), else HEALTHY.
    fn health(&self, st: &State, rec: &Record) -> (pb::Health, Vec<String>) {
        let mut health = pb::Health::Healthy;
        let mut notes = Vec::new();
        let holders: BTreeSet<&str> = rec.alloc.extents.iter().map(|e| e.node.as_str()).collect();
        for node in holders {
            if let Some(&at) = rec.lost.get(node) {
                health = pb::Health::Lost;
                notes.push(format!(
                    "{node} restarted at unix ms {at}: its extents are gone"
                ));
                continue;
            }
            let state = st.nodes.get(node).map(|n| n.seen.state(&self.liveness));
            match state {
                Some((NodeState::Down, since)) => {
                    health = health.max(pb::Health::Degraded);
                    notes.push(format!("{node} down since unix ms {since}"));
                }
                None => {
                    health = health.max(pb::Health::Degraded);
                    notes.push(format!("{node} has not registered with this master"));
                }
                _ => {}
            }
        }
        if let Some((from, to)) = first_gap(&rec.alloc) {
            health = health.max(pb::Health::Degraded);
            notes.push(format!(
                "bytes {from}..{to} not reported yet: their node has not re-registered"
            ));
        }
        (health, notes)
    }

    fn candidates(&self, st: &State) -> Vec<Candidate> {
        // Device memory placed so far, per (node, device): counted from the
        // table each time, so no path that removes an allocation can leave
        // it wrong.
        // Extents on a node that restarted since are gone from its device
        // (its new report no longer counts them); reservations in flight
        // are not in the table yet.
        let mut on_gpu: BTreeMap<(&str, u32), u64> = BTreeMap::new();
        for r in st.allocs.values() {
            for e in &r.alloc.extents {
                if let (Some(g), false) = (e.gpu, r.lost.contains_key(&e.node)) {
                    *on_gpu.entry((e.node.as_str(), g)).or_default() += e.len;
                }
            }
        }
        for ((node, g), len) in &st.gpu_reserving {
            *on_gpu.entry((node.as_str(), *g)).or_default() += len;
        }
        st.nodes
            .values()
            .map(|n| Candidate {
                name: n.info.name.clone(),
                free: n.info.capacity.saturating_sub(n.reserved),
                up: n.seen.state(&self.liveness).0 == NodeState::Up,
                page: n.page(),
                gpus: n
                    .info
                    .gpu_devices
                    .iter()
                    .map(|g| placement::GpuRoom {
                        index: g.index,
                        free: g.free.saturating_sub(
                            on_gpu
                                .get(&(n.info.name.as_str(), g.index))
                                .copied()
                                .unwrap_or(0),
                        ),
                    })
                    .collect(),
                gpu_note: n.info.gpu_note.clone(),
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent before it can
        // panic, so a poisoned lock still guards valid data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Ends the device-memory reservations of `targets` (recorded or rolled back).
fn unreserve_gpus(st: &mut State, targets: &[(Planned, String, String)]) {
    for (p, _, _) in targets {
        let Some(g) = p.gpu else { continue };
        let key = (p.node.clone(), g);
        if let Some(left) = st.gpu_reserving.get_mut(&key) {
            *left = left.saturating_sub(p.bytes());
            if *left == 0 {
                st.gpu_reserving.remove(&key);
            }
        }
    }
}

/// Adds `who` to the processes attached to `id`.
fn attach_session(st: &mut State, who: pb::Owner, id: u64) {
    st.sessions
        .entry(who.session_id.clone())
        .or_insert_with(|| SessionRec {
            who,
            attached: BTreeSet::new(),
        })
        .attached
        .insert(id);
}

/// Processes attached to `id`, by session id.
fn attached_to(st: &State, id: u64) -> Vec<&pb::Owner> {
    st.sessions
        .values()
        .filter(|s| s.attached.contains(&id))
        .map(|s| &s.who)
        .collect()
}

/// Takes `id` out of the table and its nodes' accounting; returns the
/// holders to release it on (`(node, agent address)`), one per node.
fn remove(st: &mut State, id: u64) -> Vec<(String, String)> {
    let Some(rec) = st.allocs.remove(&id) else {
        return Vec::new();
    };
    if st.names.get(&rec.alloc.name) == Some(&id) {
        st.names.remove(&rec.alloc.name);
    }
    for s in st.sessions.values_mut() {
        s.attached.remove(&id);
    }
    if rec.adopted {
        st.freed_adopted.insert(id);
    }
    // One Release per agent, and its footprint counted once: its ranges
    // were reserved together.
    let mut per_node: BTreeMap<&str, u64> = BTreeMap::new();
    for e in &rec.alloc.extents {
        // GPU memory is not the host pool's: the node is a holder all the same.
        let host = if e.gpu.is_none() { e.len } else { 0 };
        *per_node.entry(e.node.as_str()).or_default() += host;
    }
    let mut holders = Vec::with_capacity(per_node.len());
    for (node, len) in per_node {
        if rec.lost.contains_key(node) {
            continue;
        }
        if let Some(n) = st.nodes.get_mut(node) {
            n.reserved = n.reserved.saturating_sub(n.footprint(len));
            holders.push((node.to_string(), n.info.agent_addr.clone()));
        }
    }
    holders
}

/// The first byte range of `a` that no extent covers, if any.
fn first_gap(a: &pb::Allocation) -> Option<(u64, u64)> {
    let mut at = 0;
    for e in &a.extents {
        if e.alloc_offset > at {
            return Some((at, e.alloc_offset));
        }
        at = at.max(e.alloc_offset + e.len);
    }
    (at < a.size).then_some((at, a.size))
}

/// The id an [`pb::AllocRef`] names.
fn resolve(st: &State, target: &pb::AllocRef) -> Result<u64, CoreError> {
    if target.id != 0 {
        return Ok(target.id);
    }
    if target.name.is_empty() {
        return Err(CoreError::InvalidArgument(
            "name an allocation by id or name".into(),
        ));
    }
    st.names
        .get(&target.name)
        .copied()
        .ok_or_else(|| CoreError::NoSuchName(target.name.clone()))
}

/// Names start with a letter and hold letters, digits, '.', '_' and '-'
/// (never only digits, so a name is never mistaken for an id).
fn validate_name(name: &str) -> Result<(), CoreError> {
    let ok = name.len() <= 128
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "bad name {name:?}: start with a letter; use letters, digits, '.', '_', '-'; at most 128 bytes"
        )))
    }
}

/// "pid 12 (prog@node-1)" for messages.
fn describe(o: &pb::Owner) -> String {
    format!("pid {} ({}@{})", o.pid, o.program, o.node)
}

/// Checks that an agent's pieces tile the planned ranges exactly.
fn check_pieces(p: &Planned, pieces: Vec<pb::Piece>) -> Result<Vec<pb::Piece>, String> {
    let mut next = pieces.iter().peekable();
    for &(offset, len) in &p.ranges {
        let mut at = offset;
        while at < offset + len {
            match next.next() {
                Some(piece) if piece.alloc_offset == at && piece.len > 0 => at += piece.len,
                _ => break,
            }
        }
        if at != offset + len {
            return Err(format!(
                "agent returned pieces that do not tile [{offset}, {})",
                offset + len
            ));
        }
    }
    if next.peek().is_some() {
        return Err("agent returned pieces outside the requested ranges".into());
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[derive(Default, Clone)]
    struct FakeLink {
        reserved: Arc<AtomicU64>,
        released: Arc<AtomicU64>,
        fail_on: Option<&'static str>,
    }

    impl AgentLink for FakeLink {
        async fn reserve(
            &self,
            addr: &str,
            req: pb::ReserveRequest,
        ) -> Result<pb::ReserveReply, String> {
            // Let other requests run meanwhile, as a real round trip does.
            tokio::task::yield_now().await;
            if Some(addr) == self.fail_on {
                return Err("pool exhausted".into());
            }
            self.reserved.fetch_add(1, Ordering::SeqCst);
            // Two pieces when a range is over a page, as a fragmented pool would.
            let mut pieces = Vec::new();
            for r in &req.ranges {
                let first = r.len.min(4096);
                pieces.push(pb::Piece {
                    alloc_offset: r.alloc_offset,
                    len: first,
                    pool_offset: 0,
                    rdma: Vec::new(),
                });
                if r.len > first {
                    pieces.push(pb::Piece {
                        alloc_offset: r.alloc_offset + first,
                        len: r.len - first,
                        pool_offset: 8192,
                        rdma: Vec::new(),
                    });
                }
            }
            Ok(pb::ReserveReply { pieces, pool: None })
        }
        async fn release(&self, _addr: &str, _id: u64) -> Result<pb::ReleaseReply, String> {
            self.released.fetch_add(1, Ordering::SeqCst);
            Ok(pb::ReleaseReply::default())
        }
    }

    fn node(name: &str, cap: u64) -> pb::NodeInfo {
        pb::NodeInfo {
            name: name.into(),
            agent_addr: format!("{name}:1"),
            data_addr: format!("{name}:2"),
            capacity: cap,
            ..Default::default()
        }
    }

    fn owner(s: &str) -> Option<pb::Owner> {
        Some(pb::Owner {
            session_id: s.into(),
            ..Default::default()
        })
    }

    /// A master that serves at once (no recovery window).
    fn bare(link: FakeLink, liveness: Liveness) -> Master<FakeLink> {
        let mut m = Master::new(link, liveness);
        m.recovery = Duration::ZERO;
        m
    }

    fn join(name: &str, cap: u64) -> pb::RegisterRequest {
        pb::RegisterRequest {
            node: Some(node(name, cap)),
            incarnation: 1,
            ..Default::default()
        }
    }

    async fn master(link: FakeLink) -> Master<FakeLink> {
        let m = bare(link, Liveness::from_heartbeat(Duration::from_secs(60)));
        m.register(join("a", 1 << 20)).await.unwrap();
        m.register(join("b", 1 << 20)).await.unwrap();
        m
    }

    fn spec(size: u64, nodes: &[&str]) -> pb::AllocSpec {
        pb::AllocSpec {
            size,
            kind: MemKind::RemoteHost as i32,
            placement: Some(pb::Placement {
                nodes: nodes
                    .iter()
                    .map(|s| pb::NodeShare {
                        node: s.to_string(),
                        weight: 1,
                    })
                    .collect(),
                ..pb::Placement::default()
            }),
            ..pb::AllocSpec::default()
        }
    }

    fn remote(size: u64, nodes: &[&str], requester: Option<pb::Owner>) -> pb::AllocateRequest {
        pb::AllocateRequest {
            spec: Some(spec(size, nodes)),
            origin_node: String::new(),
            requester,
        }
    }

    fn by_id(id: u64) -> pb::AllocRef {
        pb::AllocRef {
            id,
            name: String::new(),
        }
    }

    fn by_name(name: &str) -> pb::AllocRef {
        pb::AllocRef {
            id: 0,
            name: name.into(),
        }
    }

    #[tokio::test]
    async fn allocate_free_accounting() {
        let m = master(FakeLink::default()).await;
        let a = m.allocate(remote(10_000, &["a", "b"], None)).await.unwrap();
        // Two nodes (a takes whole pages), each answering with pieces, in
        // allocation order.
        let tiles: Vec<(u64, u64)> = a.extents.iter().map(|e| (e.alloc_offset, e.len)).collect();
        assert_eq!(tiles, [(0, 4096), (4096, 4096), (8192, 1808)]);
        assert_eq!(a.access_key.len(), KEY_LEN);
        let used: u64 = m.nodes().iter().map(|n| n.used).sum();
        assert_eq!(used, 8192 + 4096);
        m.free(&by_id(a.id), "", false).await.unwrap();
        assert!(m.nodes().iter().all(|n| n.used == 0));
        assert!(matches!(
            m.free(&by_id(a.id), "", false).await,
            Err(CoreError::NoSuchAllocation(_))
        ));
    }

    #[tokio::test]
    async fn striped_footprint_is_counted_once_per_node() {
        let m = master(FakeLink::default()).await;
        let mut s = spec(5 * 4096 + 10, &["a", "b"]);
        if let Some(p) = s.placement.as_mut() {
            p.stripe = 4096;
        }
        let req = pb::AllocateRequest {
            spec: Some(s),
            origin_node: String::new(),
            requester: None,
        };
        let a = m.allocate(req).await.unwrap();
        assert_eq!(a.extents.len(), 6);
        let nodes: Vec<&str> = a.extents.iter().map(|e| e.node.as_str()).collect();
        assert_eq!(nodes, ["a", "b", "a", "b", "a", "b"]);
        // a: 3 pages; b: 2 pages + 10 bytes -> 3 pages.
        assert_eq!(m.nodes().iter().map(|n| n.used).sum::<u64>(), 6 * 4096);
        m.free(&by_id(a.id), "", false).await.unwrap();
        assert!(m.nodes().iter().all(|n| n.used == 0));
    }

    #[tokio::test]
    async fn failed_reserve_rolls_back() {
        let link = FakeLink {
            fail_on: Some("b:1"),
            ..FakeLink::default()
        };
        let m = master(link.clone()).await;
        let err = m
            .allocate(remote(10_000, &["a", "b"], None))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("agent b failed"), "{err}");
        // Both released: a failed reserve may have happened (a timeout).
        assert_eq!(link.released.load(Ordering::SeqCst), 2);
        assert!(m.allocations().is_empty());
        assert!(m.nodes().iter().all(|n| n.used == 0));
    }

    /// Device memory is counted per GPU, never against the host pool, and
    /// a reservation still in flight already takes its room.
    #[tokio::test]
    async fn gpu_memory_is_counted_per_device_including_reservations_in_flight() {
        let m = master(FakeLink::default()).await;
        let mut g = join("g", 1 << 20);
        if let Some(info) = g.node.as_mut() {
            info.gpu_devices = vec![pb::GpuDevice {
                index: 0,
                name: "test GPU".into(),
                total: 1 << 20,
                free: 1 << 20,
            }];
        }
        m.register(g).await.unwrap();
        let gpu = |size: u64| {
            let mut s = spec(size, &[]);
            s.kind = MemKind::RemoteGpu as i32;
            pb::AllocateRequest {
                spec: Some(s),
                origin_node: String::new(),
                requester: None,
            }
        };
        // Two at once: the second sees the first's reservation.
        let (first, second) = tokio::join!(m.allocate(gpu(600 << 10)), m.allocate(gpu(600 << 10)));
        let first = first.unwrap();
        let err = second.unwrap_err();
        assert!(err.to_string().contains("g GPU 0"), "{err}");
        assert!(first
            .extents
            .iter()
            .all(|e| e.node == "g" && e.gpu == Some(0)));
        assert!(
            m.nodes().iter().all(|n| n.used == 0),
            "GPU bytes are not host pool bytes"
        );
        m.free(&by_id(first.id), "", false).await.unwrap();
        m.allocate(gpu(600 << 10)).await.unwrap();
        let err = m.allocate(gpu(600 << 10)).await.unwrap_err();
        assert!(matches!(err, CoreError::CapacityExhausted { .. }), "{err}");
    }

    #[tokio::test]
    async fn sessions_own_their_allocations() {
        let m = master(FakeLink::default()).await;
        let mine = m.allocate(remote(100, &[], owner("s1"))).await.unwrap();
        let _other = m.allocate(remote(100, &[], owner("s2"))).await.unwrap();
        let persistent = m.allocate(remote(100, &[], None)).await.unwrap();
        assert!(matches!(
            m.free(&by_id(mine.id), "s2", false).await,
            Err(CoreError::PermissionDenied(_))
        ));
        assert_eq!(m.end_session("s1").await, 1);
        let left: Vec<u64> = m.allocations().iter().map(|a| a.id).collect();
        assert_eq!(left.len(), 2);
        assert!(left.contains(&persistent.id));
    }

    #[tokio::test]
    async fn named_allocations_attach_and_refuse_free_while_attached() {
        let m = master(FakeLink::default()).await;
        let mut s = spec(100, &[]);
        s.name = "table".into();
        let req = pb::AllocateRequest {
            spec: Some(s.clone()),
            origin_node: "a".into(),
            requester: owner("s1"),
        };
        let a = m.allocate(req.clone()).await.unwrap();
        assert!(a.owner.is_none(), "named allocations are persistent");
        assert_eq!(a.attached.len(), 1);
        assert!(matches!(
            m.allocate(req).await,
            Err(CoreError::NameTaken(_, id)) if id == a.id
        ));
        let who = owner("s2").unwrap();
        let b = m.attach(&by_name("table"), who).unwrap();
        assert_eq!(b.id, a.id);
        assert_eq!(b.attached.len(), 2);
        // s1 cannot free it while s2 is attached; force can.
        let err = m.free(&by_name("table"), "s1", false).await.unwrap_err();
        assert!(matches!(err, CoreError::InUse { .. }), "{err}");
        m.detach(a.id, "s2").unwrap();
        assert_eq!(
            m.end_session("s1").await,
            0,
            "the creator leaving frees nothing"
        );
        assert!(m.allocation(&by_name("table")).unwrap().attached.is_empty());
        m.attach(&by_id(a.id), owner("s3").unwrap()).unwrap();
        m.free(&by_name("table"), "", true).await.unwrap();
        assert!(matches!(
            m.allocation(&by_name("table")),
            Err(CoreError::NoSuchName(_))
        ));
        // The name is free again.
        s.name = "table".into();
        let again = pb::AllocateRequest {
            spec: Some(s.clone()),
            origin_node: String::new(),
            requester: None,
        };
        assert!(m.allocate(again).await.is_ok());
        s.name = "9lives".into();
        let bad = pb::AllocateRequest {
            spec: Some(s),
            origin_node: String::new(),
            requester: None,
        };
        assert!(matches!(
            m.allocate(bad).await,
            Err(CoreError::InvalidArgument(_))
        ));
    }

    #[tokio::test]
    async fn session_allocations_cannot_be_attached() {
        let m = master(FakeLink::default()).await;
        let mine = m.allocate(remote(100, &[], owner("s1"))).await.unwrap();
        let err = m.attach(&by_id(mine.id), owner("s2").unwrap()).unwrap_err();
        assert!(err.to_string().contains("only persistent"), "{err}");
    }

    #[tokio::test]
    async fn shm_preference_is_refused_for_other_nodes() {
        let m = master(FakeLink::default()).await;
        let mut s = spec(100, &["b"]);
        s.fabric = pb::Fabric::Shm as i32;
        let req = pb::AllocateRequest {
            spec: Some(s),
            origin_node: "a".into(),
            requester: owner("s1"),
        };
        let err = m.allocate(req).await.unwrap_err();
        assert!(err.to_string().contains("fabric shm reaches only"), "{err}");
        let mut s = spec(100, &["a"]);
        s.fabric = pb::Fabric::Auto as i32;
        let req = pb::AllocateRequest {
            spec: Some(s),
            origin_node: "a".into(),
            requester: owner("s1"),
        };
        let a = m.allocate(req).await.unwrap();
        assert_eq!(a.extents[0].fabric, pb::Fabric::Shm as i32);
    }

    fn beat(name: &str, held: Vec<u64>, ended: &[&str]) -> pb::HeartbeatRequest {
        pb::HeartbeatRequest {
            name: name.into(),
            incarnation: 1,
            held,
            ended_sessions: ended.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn silent_nodes_go_down_and_their_allocations_degrade() {
        let l = Liveness {
            heartbeat: Duration::from_millis(1),
            suspect_after: Duration::from_millis(20),
            down_after: Duration::from_millis(40),
        };
        let m = bare(FakeLink::default(), l);
        m.register(join("a", 1 << 20)).await.unwrap();
        let a = m.allocate(remote(10, &["a"], None)).await.unwrap();
        assert_eq!(a.health, pb::Health::Healthy as i32);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(m.nodes()[0].state, NodeState::Down as i32);
        let seen = m.allocation(&by_id(a.id)).unwrap();
        assert_eq!(seen.health, pb::Health::Degraded as i32);
        assert!(
            seen.health_notes[0].starts_with("a down since"),
            "{:?}",
            seen.health_notes
        );
        assert!(m.allocate(remote(1, &[], None)).await.is_err());
        assert!(m.heartbeat(beat("a", vec![a.id], &[])).await.known);
        assert_eq!(m.nodes()[0].state, NodeState::Up as i32);
        assert!(!m.heartbeat(beat("zz", vec![], &[])).await.known);
        let mut other = beat("a", vec![], &[]);
        other.incarnation = 2;
        assert!(
            !m.heartbeat(other).await.known,
            "a restarted agent must register"
        );
    }

    #[tokio::test]
    async fn a_new_master_waits_for_agents_before_changing_the_table() {
        let m = Master::new(
            FakeLink::default(),
            Liveness::from_heartbeat(Duration::from_secs(1)),
        );
        m.register(join("a", 1 << 20)).await.unwrap();
        let err = m.allocate(remote(10, &[], None)).await.unwrap_err();
        assert!(err.to_string().starts_with("master recovering"), "{err}");
        assert!(m.recovering() > Duration::ZERO);
    }

    #[tokio::test]
    async fn heartbeats_free_ended_sessions_and_release_strays() {
        let m = master(FakeLink::default()).await;
        let mine = m.allocate(remote(100, &["a"], owner("s1"))).await.unwrap();
        let kept = m.allocate(remote(100, &["a"], None)).await.unwrap();
        let reply = m
            .heartbeat(beat("a", vec![mine.id, kept.id, 999], &["s1"]))
            .await;
        assert!(reply.known);
        assert_eq!(reply.release, [999]);
        let left: Vec<u64> = m.allocations().iter().map(|a| a.id).collect();
        assert_eq!(left, [kept.id]);
    }

    /// What agent `node` reports after a master restart: `allocs` as the old
    /// master recorded them, cut down to that node's extents.
    fn report(
        node_name: &str,
        allocs: &[pb::Allocation],
        sessions: Vec<pb::SessionReport>,
        next_session_seq: u64,
    ) -> pb::RegisterRequest {
        let held = allocs
            .iter()
            .filter(|a| a.extents.iter().any(|e| e.node == node_name))
            .map(|a| {
                let mut r = a.clone();
                r.attached.clear();
                r.extents.retain(|e| e.node == node_name);
                r
            })
            .collect();
        pb::RegisterRequest {
            node: Some(node(node_name, 1 << 20)),
            incarnation: 1,
            master_incarnation: 77,
            held,
            sessions,
            next_session_seq,
        }
    }

    fn session(id: &str, node: &str, seq: u64) -> pb::Owner {
        pb::Owner {
            session_id: id.into(),
            node: node.into(),
            agent_incarnation: 1,
            session_seq: seq,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_restarted_master_rebuilds_the_table_from_reports() {
        let old = master(FakeLink::default()).await;
        let live = session("a-live", "a", 0);
        let dead = session("a-dead", "a", 1);
        let mut s = spec(10_000, &["a", "b"]);
        s.name = "shared".into();
        let named = old
            .allocate(pb::AllocateRequest {
                spec: Some(s),
                origin_node: "a".into(),
                requester: Some(live.clone()),
            })
            .await
            .unwrap();
        let owned = old
            .allocate(remote(100, &["b"], Some(live.clone())))
            .await
            .unwrap();
        let orphan = old
            .allocate(remote(100, &["b"], Some(dead.clone())))
            .await
            .unwrap();
        let before = old.allocations();

        let m = bare(
            FakeLink::default(),
            Liveness::from_heartbeat(Duration::from_secs(60)),
        );
        // b first: it holds half of `named`, `owned` and the dead session's.
        let b = m.register(report("b", &before, vec![], 0)).await.unwrap();
        assert!(b.release.is_empty());
        let degraded = m.allocation(&by_name("shared")).unwrap();
        assert_eq!(
            degraded.health,
            pb::Health::Degraded as i32,
            "a's half is missing"
        );
        // a reports its live session (attached to `named`); a-dead is gone.
        let sessions = vec![pb::SessionReport {
            who: Some(live.clone()),
            attached: vec![named.id],
        }];
        m.register(report("a", &before, sessions, 2)).await.unwrap();
        let after = m.allocations();
        let ids: Vec<u64> = after.iter().map(|a| a.id).collect();
        assert_eq!(
            ids,
            [named.id, owned.id],
            "the dead session's allocation is freed"
        );
        assert_eq!(after[0], before[0], "rebuilt exactly");
        assert_eq!(after[1], before[1]);
        assert!(after.iter().all(|a| a.health == pb::Health::Healthy as i32));
        assert_eq!(
            m.nodes().iter().map(|n| n.used).sum::<u64>(),
            old.nodes().iter().map(|n| n.used).sum::<u64>() - 4096
        );
        // New ids continue after the adopted ones.
        let next = m.allocate(remote(1, &[], None)).await.unwrap();
        assert!(next.id > orphan.id);
        // Freed while b was away: b's late report is released, not adopted.
        m.free(&by_id(owned.id), "", false).await.unwrap();
        let again = m.register(report("b", &before, vec![], 0)).await.unwrap();
        assert!(again.release.contains(&owned.id), "{:?}", again.release);
    }

    #[tokio::test]
    async fn an_agent_that_restarted_loses_its_extents() {
        let m = master(FakeLink::default()).await;
        let a = m.allocate(remote(10_000, &["a", "b"], None)).await.unwrap();
        let mut fresh = join("b", 1 << 20);
        fresh.incarnation = 2;
        m.register(fresh).await.unwrap();
        let seen = m.allocation(&by_id(a.id)).unwrap();
        assert_eq!(seen.health, pb::Health::Lost as i32);
        assert!(
            seen.health_notes[0].starts_with("b restarted"),
            "{:?}",
            seen.health_notes
        );
        let b_used = m
            .nodes()
            .iter()
            .find(|n| n.info.as_ref().unwrap().name == "b")
            .unwrap()
            .used;
        assert_eq!(b_used, 0);
        m.free(&by_id(a.id), "", false).await.unwrap();
    }
}
