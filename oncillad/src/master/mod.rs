//! The master role: cluster membership, placement and the allocation table.
//!
//! The master decides where memory goes and records every allocation; the
//! agents hold the memory. It reaches agents only through [`AgentLink`], so
//! this module never imports a transport and is tested with a fake link.
//! It never holds its lock across an await.

pub mod placement;

use std::collections::BTreeMap;
use std::future::Future;

use futures_util::future::join_all;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use oncilla_proto::fabric;
use oncilla_proto::pb::{self, MemKind, NodeState};
use oncilla_proto::wire::KEY_LEN;

use crate::error::CoreError;
use crate::pool::round_up;
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
    /// Bytes reserved on the node by allocations (page-rounded).
    reserved: u64,
    /// The pool as the node last reported it.
    pool: pb::PoolUsage,
    last_seen: Instant,
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

#[derive(Default)]
struct State {
    nodes: BTreeMap<String, Node>,
    allocs: BTreeMap<u64, pb::Allocation>,
    /// Name -> id of named allocations.
    names: BTreeMap<String, u64>,
    next_id: u64,
}

/// The master core.
pub struct Master<L> {
    link: L,
    heartbeat: Duration,
    state: Mutex<State>,
}

impl<L: AgentLink> Master<L> {
    /// A master expecting a heartbeat from each agent every `heartbeat`;
    /// a node that misses three is reported down and gets no new memory.
    pub fn new(link: L, heartbeat: Duration) -> Self {
        Self {
            link,
            heartbeat,
            state: Mutex::new(State {
                next_id: 1,
                ..State::default()
            }),
        }
    }

    /// Interval agents should heartbeat at.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat
    }

    /// Adds or refreshes a node.
    ///
    /// # Errors
    /// [`CoreError::InvalidArgument`] for a node without name, endpoints or capacity.
    pub fn register(&self, info: pb::NodeInfo) -> Result<(), CoreError> {
        if info.name.is_empty() || info.agent_addr.is_empty() || info.data_addr.is_empty() {
            return Err(CoreError::InvalidArgument(
                "a node needs a name, an agent address and a data address".into(),
            ));
        }
        if info.capacity == 0 {
            return Err(CoreError::InvalidArgument("a node needs capacity".into()));
        }
        let mut st = self.lock();
        let reserved = st.nodes.get(&info.name).map_or(0, |n| n.reserved);
        tracing::info!(node = %info.name, agent = %info.agent_addr, data = %info.data_addr, capacity = info.capacity, page = info.page_size, "node registered");
        if !info.pool_note.is_empty() {
            tracing::warn!(node = %info.name, "{}", info.pool_note);
        }
        let pool = pb::PoolUsage {
            free: info.capacity.saturating_sub(reserved),
            largest_free: info.capacity.saturating_sub(reserved),
            used: reserved,
            scrubbing: 0,
        };
        st.nodes.insert(
            info.name.clone(),
            Node {
                info,
                reserved,
                pool,
                last_seen: Instant::now(),
            },
        );
        Ok(())
    }

    /// Records a heartbeat and the pool usage it carries; false when the
    /// node is unknown and must register.
    pub fn heartbeat(&self, name: &str, pool: pb::PoolUsage) -> bool {
        let mut st = self.lock();
        match st.nodes.get_mut(name) {
            Some(n) => {
                n.last_seen = Instant::now();
                n.pool = pool;
                true
            }
            None => false,
        }
    }

    /// Places, reserves and records a new allocation.
    ///
    /// # Errors
    /// Invalid requests, taken names, unknown/down nodes, exhausted capacity,
    /// and agents that fail to reserve (whatever was reserved is released
    /// again).
    pub async fn allocate(&self, req: pb::AllocateRequest) -> Result<pb::Allocation, CoreError> {
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
        let preference = pb::Fabric::try_from(spec.fabric).unwrap_or(pb::Fabric::Auto);
        let placement = spec.placement.clone().unwrap_or_default();
        // Named allocations, and everything an operator makes, outlive their creator.
        let persistent = spec.persistent || !spec.name.is_empty() || req.requester.is_none();
        let key: [u8; KEY_LEN] = rand::random();
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
            let fabrics = plan
                .iter()
                .map(|p| fabric::choose(&p.node, &req.origin_node, preference))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| CoreError::InvalidArgument(e.to_string()))?;
            let id = st.next_id;
            st.next_id += 1;
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
                node.reserved += node.footprint(p.bytes());
                targets.push((p, node.info.agent_addr.clone(), node.info.data_addr.clone()));
            }
            (id, targets, fabrics)
        };

        let reserves = targets.iter().map(|(p, addr, _)| {
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
            self.rollback(id, &spec.name, &targets, &results).await;
            return Err(CoreError::Agent {
                node: failed,
                reason: err,
            });
        }

        let mut extents: Vec<pb::Extent> = Vec::new();
        for (((p, _, data), r), fabric) in targets.iter().zip(results).zip(&fabrics) {
            extents.extend(r.unwrap_or_default().into_iter().map(|piece| pb::Extent {
                node: p.node.clone(),
                alloc_offset: piece.alloc_offset,
                len: piece.len,
                pool_offset: piece.pool_offset,
                data_addr: data.clone(),
                fabric: *fabric as i32,
            }));
        }
        extents.sort_by_key(|e| e.alloc_offset);
        let (owner, attached) = match req.requester {
            Some(r) if persistent => (None, vec![r]),
            requester => (requester, Vec::new()),
        };
        let alloc = pb::Allocation {
            id,
            size: spec.size,
            kind: kind as i32,
            extents,
            access_key: key.to_vec(),
            owner,
            created_unix_ms: unix_ms(),
            name: spec.name,
            attached,
            placement: Some(placement),
        };
        tracing::info!(
            alloc_id = id,
            size = spec.size,
            name = %alloc.name,
            nodes = targets.len(),
            extents = alloc.extents.len(),
            "allocated"
        );
        self.lock().allocs.insert(id, alloc.clone());
        Ok(alloc)
    }

    async fn rollback(
        &self,
        id: u64,
        name: &str,
        targets: &[(Planned, String, String)],
        results: &[Result<Vec<pb::Piece>, String>],
    ) {
        let releases = targets
            .iter()
            .zip(results)
            .filter(|(_, r)| r.is_ok())
            .map(|((_, addr, _), _)| self.link.release(addr, id));
        for r in join_all(releases).await {
            if let Err(e) = r {
                tracing::warn!(alloc_id = id, error = %e, "release during rollback failed");
            }
        }
        let mut st = self.lock();
        st.names.remove(name);
        for (p, _, _) in targets {
            if let Some(n) = st.nodes.get_mut(&p.node) {
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
    /// session's allocation; [`CoreError::InUse`] without `force`.
    pub async fn free(
        &self,
        target: &pb::AllocRef,
        session: &str,
        force: bool,
    ) -> Result<(), CoreError> {
        let (id, holders) = {
            let mut st = self.lock();
            let id = resolve(&st, target)?;
            let alloc = st.allocs.get(&id).ok_or(CoreError::NoSuchAllocation(id))?;
            if let Some(owner) = &alloc.owner {
                if !session.is_empty() && owner.session_id != session {
                    return Err(CoreError::PermissionDenied(format!(
                        "allocation {id} belongs to another session ({})",
                        owner.session_id
                    )));
                }
            }
            let others: Vec<String> = alloc
                .attached
                .iter()
                .filter(|a| a.session_id != session)
                .map(describe)
                .collect();
            if !others.is_empty() && !force {
                return Err(CoreError::InUse {
                    id,
                    by: others.join(", "),
                });
            }
            let alloc = st
                .allocs
                .remove(&id)
                .ok_or(CoreError::NoSuchAllocation(id))?;
            st.names.remove(&alloc.name);
            // One Release per agent, and its footprint counted once: its
            // ranges were reserved together.
            let mut per_node: BTreeMap<&str, u64> = BTreeMap::new();
            for e in &alloc.extents {
                *per_node.entry(e.node.as_str()).or_default() += e.len;
            }
            let mut holders = Vec::with_capacity(per_node.len());
            for (node, len) in per_node {
                if let Some(n) = st.nodes.get_mut(node) {
                    n.reserved = n.reserved.saturating_sub(n.footprint(len));
                    holders.push((node.to_string(), n.info.agent_addr.clone()));
                }
            }
            (id, holders)
        };
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
                    tracing::warn!(alloc_id = id, node = %node, error = %e, "agent did not confirm release");
                }
            }
        }
        drop(st);
        tracing::info!(alloc_id = id, force, "freed");
        Ok(())
    }

    /// Attaches a process to a persistent allocation (by id or name).
    ///
    /// # Errors
    /// Unknown allocations; [`CoreError::InvalidArgument`] for one that
    /// belongs to a session (it ends with that session).
    pub fn attach(
        &self,
        target: &pb::AllocRef,
        who: pb::Owner,
    ) -> Result<pb::Allocation, CoreError> {
        let mut st = self.lock();
        let id = resolve(&st, target)?;
        let alloc = st
            .allocs
            .get_mut(&id)
            .ok_or(CoreError::NoSuchAllocation(id))?;
        if let Some(owner) = &alloc.owner {
            return Err(CoreError::InvalidArgument(format!(
                "allocation {id} belongs to {} and ends with it; only persistent allocations can be attached",
                describe(owner)
            )));
        }
        if !alloc
            .attached
            .iter()
            .any(|a| a.session_id == who.session_id)
        {
            alloc.attached.push(who);
        }
        tracing::info!(alloc_id = id, attached = alloc.attached.len(), "attached");
        Ok(alloc.clone())
    }

    /// Detaches a session from an allocation.
    ///
    /// # Errors
    /// [`CoreError::NoSuchAllocation`].
    pub fn detach(&self, id: u64, session: &str) -> Result<(), CoreError> {
        let mut st = self.lock();
        let alloc = st
            .allocs
            .get_mut(&id)
            .ok_or(CoreError::NoSuchAllocation(id))?;
        alloc.attached.retain(|a| a.session_id != session);
        Ok(())
    }

    /// Frees every allocation a session owns and detaches it from every
    /// other (its application exited).
    pub async fn end_session(&self, session: &str) -> u32 {
        let ids: Vec<u64> = {
            let mut st = self.lock();
            for a in st.allocs.values_mut() {
                a.attached.retain(|w| w.session_id != session);
            }
            st.allocs
                .values()
                .filter(|a| a.owner.as_ref().is_some_and(|o| o.session_id == session))
                .map(|a| a.id)
                .collect()
        };
        let mut freed = 0;
        for id in ids {
            let target = pb::AllocRef {
                id,
                name: String::new(),
            };
            if self.free(&target, session, false).await.is_ok() {
                freed += 1;
            }
        }
        tracing::info!(session, freed, "session ended");
        freed
    }

    /// Every node with its usage and state.
    pub fn nodes(&self) -> Vec<pb::NodeStatus> {
        let st = self.lock();
        st.nodes
            .values()
            .map(|n| pb::NodeStatus {
                info: Some(n.info.clone()),
                used: n.reserved,
                state: self.state_of(n) as i32,
                last_heartbeat_ms_ago: u64::try_from(n.last_seen.elapsed().as_millis())
                    .unwrap_or(u64::MAX),
                pool: Some(n.pool),
            })
            .collect()
    }

    /// Every allocation, by id.
    pub fn allocations(&self) -> Vec<pb::Allocation> {
        self.lock().allocs.values().cloned().collect()
    }

    /// One allocation, by id or name.
    ///
    /// # Errors
    /// [`CoreError::NoSuchAllocation`] / [`CoreError::NoSuchName`].
    pub fn allocation(&self, target: &pb::AllocRef) -> Result<pb::Allocation, CoreError> {
        let st = self.lock();
        let id = resolve(&st, target)?;
        st.allocs
            .get(&id)
            .cloned()
            .ok_or(CoreError::NoSuchAllocation(id))
    }

    fn state_of(&self, n: &Node) -> NodeState {
        if n.last_seen.elapsed() > self.heartbeat * 3 {
            NodeState::Down
        } else {
            NodeState::Up
        }
    }

    fn candidates(&self, st: &State) -> Vec<Candidate> {
        st.nodes
            .values()
            .map(|n| Candidate {
                name: n.info.name.clone(),
                free: n.info.capacity.saturating_sub(n.reserved),
                up: self.state_of(n) == NodeState::Up,
                page: n.page(),
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent before it can
        // panic, so a poisoned lock still guards valid data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
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

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
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
                });
                if r.len > first {
                    pieces.push(pb::Piece {
                        alloc_offset: r.alloc_offset + first,
                        len: r.len - first,
                        pool_offset: 8192,
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

    fn master(link: FakeLink) -> Master<FakeLink> {
        let m = Master::new(link, Duration::from_secs(60));
        m.register(node("a", 1 << 20)).unwrap();
        m.register(node("b", 1 << 20)).unwrap();
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
        let m = master(FakeLink::default());
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
        let m = master(FakeLink::default());
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
        let m = master(link.clone());
        let err = m
            .allocate(remote(10_000, &["a", "b"], None))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("agent b failed"), "{err}");
        assert_eq!(link.released.load(Ordering::SeqCst), 1);
        assert!(m.allocations().is_empty());
        assert!(m.nodes().iter().all(|n| n.used == 0));
    }

    #[tokio::test]
    async fn sessions_own_their_allocations() {
        let m = master(FakeLink::default());
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
        let m = master(FakeLink::default());
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
        let m = master(FakeLink::default());
        let mine = m.allocate(remote(100, &[], owner("s1"))).await.unwrap();
        let err = m.attach(&by_id(mine.id), owner("s2").unwrap()).unwrap_err();
        assert!(err.to_string().contains("only persistent"), "{err}");
    }

    #[tokio::test]
    async fn shm_preference_is_refused_for_other_nodes() {
        let m = master(FakeLink::default());
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

    #[tokio::test]
    async fn silent_nodes_go_down() {
        let m = Master::new(FakeLink::default(), Duration::from_millis(1));
        m.register(node("a", 1 << 20)).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(m.nodes()[0].state, NodeState::Down as i32);
        assert!(m.allocate(remote(1, &[], None)).await.is_err());
        assert!(m.heartbeat("a", pb::PoolUsage::default()));
        assert!(!m.heartbeat("zz", pb::PoolUsage::default()));
    }
}
