//! Allocating: plan where the bytes go, reserve them on every agent at
//! once, then commit the record, or roll every reservation back. Requests
//! arrive checked (`AllocateRequest`); this module decides, it never
//! parses.

use std::collections::{BTreeMap, HashMap};

use futures_util::future::join_all;
use futures_util::StreamExt;
use oncilla_model::alloc::{
    AllocSpec, Allocation, Extent, Invalid, KEY_LEN, MAX_BATCH, MAX_EXTENTS, MAX_ID,
};
use oncilla_model::cluster::{AllocateBatch, AllocateRequest, Piece, Range, Release, Reservation};
use oncilla_model::fabric::{self, Memory, Rdma};
use oncilla_model::node::PoolUsage;
use oncilla_model::quota::{self, Charge};
use oncilla_model::{Fabric, Kind};

use super::node::unix_ms;
use super::placement::{self, Candidate, Planned};
use super::state::{Record, State, Target};
use super::{AgentLink, Master};
use crate::error::{CoreError, LinkError};

impl<L: AgentLink> Master<L> {
    /// Places, reserves and records a new allocation.
    ///
    /// # Errors
    /// Taken names, unknown/down nodes, exhausted capacity, a fabric the
    /// creator asked for that cannot reach a node, a master still
    /// recovering, and agents that fail to reserve (whatever was reserved
    /// is released again).
    pub async fn allocate(&self, req: AllocateRequest) -> Result<Allocation, CoreError> {
        self.make(req, 1)
            .await?
            .pop()
            .ok_or_else(|| CoreError::Internal("an allocation made nothing".into()))
    }

    /// Places, reserves and records a batch of allocations of one spec,
    /// all or none: planned in one hold of the table's lock, reserved in
    /// one call per agent (of at most [`MAX_BATCH`] reservations), and
    /// recorded in one more hold.
    ///
    /// # Errors
    /// As [`Master::allocate`], for any allocation of the batch;
    /// [`Invalid::BatchExtents`] when the batch's extents would not fit
    /// one message.
    pub async fn allocate_many(&self, batch: AllocateBatch) -> Result<Vec<Allocation>, CoreError> {
        self.make(batch.request, batch.count).await
    }

    /// Makes `count` allocations of `req`'s spec (see
    /// [`Master::allocate_many`]), and counts what it came to.
    async fn make(&self, req: AllocateRequest, count: u32) -> Result<Vec<Allocation>, CoreError> {
        let made = self.make_uncounted(req, count).await;
        match &made {
            Ok(list) => self.refusals.made(list.len() as u64),
            Err(e) => self.refusals.refused(e),
        }
        made
    }

    async fn make_uncounted(
        &self,
        req: AllocateRequest,
        count: u32,
    ) -> Result<Vec<Allocation>, CoreError> {
        self.check_serving()?;
        let persistent = req.persistent();
        let AllocateRequest {
            spec,
            origin_node,
            requester,
        } = req;
        let user = requester.as_ref().and_then(|r| r.uid);
        let (owner, creator) = match requester {
            Some(r) if persistent => (None, Some(r)),
            requester => (requester, None),
        };
        // What every holder keeps, so a restarted master can rebuild it.
        let mut base = Allocation::new(0, spec.size, spec.kind);
        base.owner = owner;
        base.user = user;
        base.shared = spec.shared;
        base.created_unix_ms = unix_ms();
        base.name = spec.name.clone();
        base.placement = spec.placement.clone();
        base.origin_node = origin_node.clone();

        let mut pending: Vec<Pending> = Vec::with_capacity(count as usize);
        let planned = {
            let mut st = self.lock();
            // Taken once, then kept up to date with what each allocation
            // holds: a batch costs one pass over the nodes, not one each.
            let mut room = Room::of(self.candidates(&st));
            // Every range becomes at least one extent: a batch whose
            // ranges could not travel in one message stops being planned
            // as soon as it passes the bound, before any memory is
            // reserved.
            let mut ranges = 0;
            (0..count).try_for_each(|_| {
                let p = self.plan(&mut st, &mut room, &spec, &base, persistent)?;
                ranges += p.ranges();
                pending.push(p);
                if ranges > MAX_EXTENTS {
                    return Err(too_many(ranges, count));
                }
                Ok(())
            })
        };
        let mut unwind = Unwind {
            master: self,
            name: &spec.name,
            pending,
            committed: false,
        };
        planned?;
        let pending = &mut unwind.pending;

        let pieces = match self.reserve(pending).await {
            Ok(pieces) => pieces,
            Err((node, err)) => {
                tracing::warn!(first = pending.first().map_or(0, |p| p.alloc.id), count, node = %node, error = %err, "reserve failed; rolling back");
                self.release_all(pending).await;
                return Err(CoreError::Agent { node, source: err });
            }
        };
        let mut extents = 0;
        for (p, got) in pending.iter_mut().zip(pieces) {
            p.take_pieces(got, spec.fabric);
            extents += p.alloc.extents.len() + p.alloc.replicas.len();
        }
        if extents > MAX_EXTENTS {
            // The pools were too fragmented to give the planned ranges in
            // few enough pieces: no message could carry the records.
            tracing::warn!(count, extents, "reserved in too many pieces; rolling back");
            self.release_all(pending).await;
            return Err(too_many(extents, count));
        }
        match pending.as_slice() {
            [p] => tracing::info!(
                alloc_id = p.alloc.id,
                size = spec.size,
                name = %p.alloc.name,
                nodes = p.targets.len(),
                extents = p.alloc.extents.len(),
                "allocated"
            ),
            all => tracing::info!(
                first = all.first().map_or(0, |p| p.alloc.id),
                last = all.last().map_or(0, |p| p.alloc.id),
                count,
                size = spec.size,
                "allocated a batch"
            ),
        }
        // Nothing fails from here on: the records take over.
        unwind.committed = true;
        let pending = std::mem::take(&mut unwind.pending);
        let mut st = self.lock();
        let mut made = Vec::with_capacity(pending.len());
        for p in pending {
            let id = p.alloc.id;
            st.reserving.remove(&id);
            st.unreserve_gpus(&p.targets);
            if let Some(who) = &creator {
                st.attach_session(who.clone(), id);
            }
            let record = Record {
                alloc: p.alloc,
                lost: BTreeMap::new(),
                adopted: false,
            };
            made.push(self.render(&st, &record));
            // Counted against its user when it was planned.
            st.insert(record, true);
        }
        Ok(made)
    }

    /// Plans one allocation of `spec` and takes its room (in the table and
    /// in `candidates`), its name and its user's charge (`base`: its
    /// record so far).
    fn plan(
        &self,
        st: &mut State,
        room: &mut Room,
        spec: &AllocSpec,
        base: &Allocation,
        persistent: bool,
    ) -> Result<Pending, CoreError> {
        if let Some(&taken) = st.names.get(&spec.name) {
            return Err(CoreError::NameTaken(spec.name.clone(), taken));
        }
        let origin = base.origin_node.as_str();
        let primary = placement::plan(
            &placement::Request {
                size: spec.size,
                kind: spec.kind,
                placement: &spec.placement,
                origin,
            },
            &room.candidates,
        )?;
        let replicas = placement::replicas(&primary, spec.placement.copies(), &room.candidates)?;
        // Every write of a replicated allocation goes through its
        // primary's agent, which copies it on: TCP (the spec refused the
        // other fabrics).
        let preference = if replicas.is_empty() {
            spec.fabric
        } else {
            Fabric::Tcp
        };
        let shares = primary.len();
        let plan: Vec<Planned> = primary
            .into_iter()
            .chain(replicas.into_iter().flatten())
            .collect();
        let fabrics = plan
            .iter()
            .map(|p| creator_fabric(st, p, spec.kind, origin, preference))
            .collect::<Result<Vec<_>, _>>()?;
        if st.next_id > MAX_ID {
            // Never wraps: an id is never used twice.
            return Err(CoreError::CapacityExhausted {
                requested: spec.size,
                detail: format!("allocation ids are used up (the last is {MAX_ID})"),
            });
        }
        // The user's quota, with what is being reserved counted too, so
        // concurrent requests (and the rest of a batch) cannot pass it
        // together.
        let charge = base.user.map(|uid| {
            let bytes = spec.size.saturating_mul(u64::from(spec.placement.copies()));
            (uid, plan_charge(&plan, bytes, persistent))
        });
        if let Some((uid, c)) = &charge {
            let usage = st.usage.get(uid).cloned().unwrap_or_default();
            quota::check(*uid, st.quotas.of(*uid), &usage, c)?;
        }
        let targets = hold(st, plan)?;
        room.took(st, &targets);
        if let Some((uid, c)) = &charge {
            st.charge(*uid, c, true);
        }
        let mut alloc = base.clone();
        alloc.id = self.take_id(st);
        alloc.access_key = rand::random::<[u8; KEY_LEN]>().to_vec();
        if !spec.name.is_empty() {
            // Held from now on, so a concurrent request cannot take it.
            st.names.insert(spec.name.clone(), alloc.id);
        }
        Ok(Pending {
            alloc,
            targets,
            fabrics,
            charge,
            shares,
        })
    }

    /// Reserves every target of `pending` with one call per agent (split
    /// at [`MAX_BATCH`] reservations). Per allocation, per target, the
    /// pieces the agent gave; or the node of the first target that
    /// failed, and why (the caller releases everything).
    async fn reserve(
        &self,
        pending: &[Pending],
    ) -> Result<Vec<Vec<Vec<Piece>>>, (String, LinkError)> {
        let mut by_agent: BTreeMap<&str, Vec<(usize, usize)>> = BTreeMap::new();
        for (a, p) in pending.iter().enumerate() {
            for (t, (_, addr, _)) in p.targets.iter().enumerate() {
                by_agent.entry(addr.as_str()).or_default().push((a, t));
            }
        }
        let calls: Vec<(&str, &[(usize, usize)])> = by_agent
            .iter()
            .flat_map(|(addr, all)| all.chunks(MAX_BATCH as usize).map(|c| (*addr, c)))
            .collect();
        let replies = join_all(calls.iter().map(|(addr, which)| {
            let reservations = which
                .iter()
                .map(|&(a, t)| pending[a].reservation(t))
                .collect();
            self.link.reserve(addr, reservations)
        }))
        .await;
        let mut out: Vec<Vec<Vec<Piece>>> = pending
            .iter()
            .map(|p| vec![Vec::new(); p.targets.len()])
            .collect();
        let mut failed = None;
        let mut pools = Vec::new();
        for ((_, which), reply) in calls.iter().zip(replies) {
            let node = |&(a, t): &(usize, usize)| pending[a].targets[t].0.node.clone();
            let reply = reply.and_then(|r| {
                if r.len() == which.len() {
                    Ok(r)
                } else {
                    Err(LinkError::BadReply(format!(
                        "{} reservations answered for {} asked",
                        r.len(),
                        which.len()
                    )))
                }
            });
            let reply = match reply {
                Ok(r) => r,
                Err(e) => {
                    failed = failed.or_else(|| which.first().map(|w| (node(w), e)));
                    continue;
                }
            };
            for (w, r) in which.iter().zip(reply) {
                if let Some(pool) = r.pool {
                    pools.push((node(w), pool));
                }
                match check_pieces(&pending[w.0].targets[w.1].0, r.pieces) {
                    Ok(pieces) => out[w.0][w.1] = pieces,
                    Err(e) => failed = failed.or_else(|| Some((node(w), e))),
                }
            }
        }
        self.note_pools(pools);
        match failed {
            Some(f) => Err(f),
            None => Ok(out),
        }
    }

    /// A fresh id (the caller checked it is at most [`MAX_ID`]), never
    /// used before by this master or any allocation an agent reported to
    /// it, marked as being reserved.
    fn take_id(&self, st: &mut State) -> u64 {
        let id = st.next_id;
        st.next_id = id.saturating_add(1);
        st.reserving.insert(id);
        id
    }

    /// Records the pool usage the agents reported with their reservations
    /// (the last report of a node wins).
    fn note_pools(&self, pools: Vec<(String, PoolUsage)>) {
        let mut st = self.lock();
        for (node, pool) in pools {
            if let Some(n) = st.nodes.get_mut(&node) {
                n.pool = pool;
            }
        }
    }

    /// Releases every target of allocations that failed, the failed ones
    /// too: a reservation that timed out may still have happened. The
    /// table's side is undone by the allocations' [`Unwind`].
    async fn release_all(&self, pending: &[Pending]) {
        let mut releases = Vec::new();
        for p in pending {
            for (_, addr, _) in &p.targets {
                releases.push(self.link.release(addr, Release::all(p.alloc.id)));
            }
        }
        // A batch's worth of releases, a bounded number in flight at once.
        let mut done = futures_util::stream::iter(releases).buffer_unordered(RELEASES_IN_FLIGHT);
        while let Some(r) = done.next().await {
            if let Err(e) = r {
                tracing::warn!(error = %e, "release during rollback failed; the node's next heartbeat reconciles it");
            }
        }
    }
}

/// Releases a rollback sends at once.
const RELEASES_IN_FLIGHT: usize = 64;

/// The error for `n` extents that no message could carry.
fn too_many(n: usize, count: u32) -> CoreError {
    if count > 1 {
        Invalid::BatchExtents(n).into()
    } else {
        Invalid::Extents(n).into()
    }
}

/// One allocation between its planning and its record: what the table
/// holds for it, where its shares go, and its record so far.
struct Pending {
    /// Its record (id and key set); the extents come with the pieces.
    alloc: Allocation,
    /// Target `i` holds copy `i / shares` of the primary share `i % shares`.
    targets: Vec<Target>,
    fabrics: Vec<Fabric>,
    charge: Option<(u32, Charge)>,
    shares: usize,
}

impl Pending {
    /// Ranges planned over all its targets.
    fn ranges(&self) -> usize {
        self.targets.iter().map(|(p, _, _)| p.ranges.len()).sum()
    }

    /// Which copy target `i` holds.
    fn copy_of(&self, i: usize) -> u32 {
        u32::try_from(i / self.shares.max(1)).unwrap_or(u32::MAX)
    }

    /// What target `i`'s agent is asked to reserve.
    fn reservation(&self, i: usize) -> Reservation {
        let (p, _, _) = &self.targets[i];
        // A primary share copies every write to the targets holding the
        // other copies of the same share.
        let replicas = if i < self.shares {
            self.targets
                .iter()
                .skip(self.shares + i)
                .step_by(self.shares.max(1))
                .map(|(_, _, data)| data.clone())
                .collect()
        } else {
            Vec::new()
        };
        let mut record = self.alloc.clone();
        record.access_key = Vec::new();
        Reservation {
            alloc_id: self.alloc.id,
            access_key: self.alloc.access_key.clone(),
            ranges: p
                .ranges
                .iter()
                .map(|&(alloc_offset, len)| Range { alloc_offset, len })
                .collect(),
            record,
            fabric: self.fabrics[i],
            gpu: p.gpu,
            copy: self.copy_of(i),
            replicas,
            // Zeroed like every other copy of a new allocation: whole.
            fill: false,
        }
    }

    /// Turns the agents' pieces (per target) into the record's extents.
    fn take_pieces(&mut self, pieces: Vec<Vec<Piece>>, asked: Fabric) {
        for (i, ((p, agent, data), got)) in self.targets.iter().zip(pieces).enumerate() {
            let copy = self.copy_of(i);
            let fabric = self.fabrics[i];
            let into = if copy == 0 {
                &mut self.alloc.extents
            } else {
                &mut self.alloc.replicas
            };
            into.extend(got.into_iter().map(|piece| Extent {
                node: p.node.clone(),
                alloc_offset: piece.alloc_offset,
                len: piece.len,
                pool_offset: piece.pool_offset,
                data_addr: data.clone(),
                // An agent whose HCA refused the registration returns no
                // region: `auto` then reaches the piece over TCP.
                fabric: if fabric == Fabric::Verbs && piece.rdma.is_empty() && asked == Fabric::Auto
                {
                    Fabric::Tcp
                } else {
                    fabric
                },
                agent_addr: agent.clone(),
                gpu: p.gpu,
                rdma: piece.rdma,
                copy,
                filling: false,
            }));
        }
        self.alloc.extents.sort_by_key(|e| e.alloc_offset);
        self.alloc
            .replicas
            .sort_by_key(|e| (e.copy, e.alloc_offset));
    }
}

/// The table's side of allocations that are being reserved: undone on
/// drop unless committed, so allocations that fail, or whose request goes
/// away mid-reservation (a client gone, a deadline passed: the future is
/// dropped at an await), give back their name, their room on the nodes,
/// their user's charge and their ids' "reserving" mark (the agents' next
/// heartbeats then release whatever they reserved).
struct Unwind<'a, L: AgentLink> {
    master: &'a Master<L>,
    name: &'a str,
    pending: Vec<Pending>,
    committed: bool,
}

impl<L: AgentLink> Drop for Unwind<'_, L> {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        let mut st = self.master.lock();
        for p in &self.pending {
            let id = p.alloc.id;
            st.reserving.remove(&id);
            st.unreserve_gpus(&p.targets);
            if st.names.get(self.name) == Some(&id) {
                st.names.remove(self.name);
            }
            if let Some((uid, c)) = &p.charge {
                st.charge(*uid, c, false);
            }
            for (t, _, _) in &p.targets {
                if let (Some(n), None) = (st.nodes.get_mut(&t.node), t.gpu) {
                    n.reserved = n.reserved.saturating_sub(n.footprint(t.bytes()));
                }
            }
        }
    }
}

/// What the creator on `origin` will use for the share `p`, refused up
/// front when its preference cannot reach the node.
fn creator_fabric(
    st: &State,
    p: &Planned,
    kind: Kind,
    origin: &str,
    preference: Fabric,
) -> Result<Fabric, CoreError> {
    if kind == Kind::LocalGpu {
        // In the creator's own process: no fabric reaches it.
        return Ok(Fabric::Auto);
    }
    let verbs = |node: &str| st.nodes.get(node).is_some_and(|n| n.info.has_verbs());
    let rdma = if verbs(&p.node) && verbs(origin) {
        Rdma::Both
    } else {
        Rdma::Unavailable(
            format!(
                "{} or {} has no usable RDMA port (see `ocmctl nodes`)",
                p.node,
                if origin.is_empty() {
                    "the caller"
                } else {
                    origin
                }
            )
            .into(),
        )
    };
    let memory = match p.gpu {
        // Registered at reservation on a node with verbs.
        None => Memory::Host { rdma: true },
        Some(_) => Memory::Gpu {
            rdma: st
                .nodes
                .get(&p.node)
                .is_some_and(|n| !n.info.gpu_rdma.is_empty()),
        },
    };
    fabric::choose(&p.node, memory, origin, preference, &rdma)
        .map_err(|e| CoreError::InvalidArgument(e.to_string()))
}

/// What a planned allocation counts against its user: the bytes planned
/// on each node (the agents' pieces tile them exactly, so the record's
/// extents give back the same when it is freed).
fn plan_charge(plan: &[Planned], size: u64, persistent: bool) -> Charge {
    let mut nodes: BTreeMap<String, u64> = BTreeMap::new();
    for p in plan {
        *nodes.entry(p.node.clone()).or_default() += p.bytes();
    }
    Charge {
        bytes: size,
        nodes,
        persistent,
    }
}

/// Takes the planned shares out of their nodes' free room (host bytes, or
/// a GPU's while the reservation is in flight); returns them with their
/// agents' addresses.
fn hold(st: &mut State, plan: Vec<Planned>) -> Result<Vec<Target>, CoreError> {
    let mut targets = Vec::with_capacity(plan.len());
    for p in plan {
        let node = st
            .nodes
            .get_mut(&p.node)
            .ok_or_else(|| CoreError::NodeDown(p.node.clone()))?;
        if p.gpu.is_none() {
            node.reserved += node.footprint(p.bytes());
        }
        let (agent, data) = (node.info.agent_addr.clone(), node.info.data_addr.clone());
        if let Some(g) = p.gpu {
            *st.gpu_reserving.entry((p.node.clone(), g)).or_default() += p.bytes();
        }
        targets.push((p, agent, data));
    }
    Ok(targets)
}

/// The candidates a batch is placed on, kept current as it holds room.
struct Room {
    candidates: Vec<Candidate>,
    /// Each candidate's place in `candidates`, by node name.
    by_name: HashMap<String, usize>,
}

impl Room {
    fn of(candidates: Vec<Candidate>) -> Self {
        let by_name = candidates
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        Self {
            candidates,
            by_name,
        }
    }

    /// Takes what `targets` hold out of the candidates' room, as
    /// [`Master::candidates`] would count it from the table now.
    fn took(&mut self, st: &State, targets: &[Target]) {
        for (p, _, _) in targets {
            let (Some(&i), Some(node)) = (self.by_name.get(&p.node), st.nodes.get(&p.node)) else {
                continue;
            };
            let c = &mut self.candidates[i];
            match p.gpu {
                None => c.free = c.free.saturating_sub(node.footprint(p.bytes())),
                Some(g) => {
                    if let Some(room) = c.gpus.iter_mut().find(|r| r.index == g) {
                        room.free = room.free.saturating_sub(p.bytes());
                    }
                }
            }
        }
    }
}

/// Checks that an agent's pieces tile the planned ranges exactly.
pub(super) fn check_pieces(p: &Planned, pieces: Vec<Piece>) -> Result<Vec<Piece>, LinkError> {
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
            return Err(LinkError::BadReply(format!(
                "agent returned pieces that do not tile [{offset}, {})",
                offset + len
            )));
        }
    }
    if next.peek().is_some() {
        return Err(LinkError::BadReply(
            "agent returned pieces outside the requested ranges".into(),
        ));
    }
    Ok(pieces)
}
