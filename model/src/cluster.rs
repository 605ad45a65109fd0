//! What the master and the agents say to each other, as domain values:
//! registration and heartbeats (membership, recovery) and reservation of
//! an allocation's ranges on an agent. Transports carry these; they never
//! reach the core as wire messages.

use crate::alloc::{AllocSpec, Allocation, Invalid, Owner, RdmaRegion, MAX_BATCH};
use crate::node::{NodeInfo, PoolUsage};
use crate::{Fabric, Kind};

/// A live session an agent reports, with what it is attached to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionReport {
    pub who: Owner,
    pub attached: Vec<u64>,
}

/// An agent joining (or re-joining) the master.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Registration {
    pub node: NodeInfo,
    /// This start of the agent (random, never 0).
    pub incarnation: u64,
    /// The master start it knew before, 0 for none.
    pub master_incarnation: u64,
    /// What it holds: each allocation's record, cut to its own extents.
    pub held: Vec<Allocation>,
    pub sessions: Vec<SessionReport>,
    /// Its next session number (sessions below it were opened).
    pub next_session_seq: u64,
    /// The largest allocation id it holds (0: none), in every part of a
    /// registration cut into several: the master never hands out an id a
    /// part still on its way reports.
    pub max_held_id: u64,
    /// More parts of this registration follow: the master settles the
    /// node's accounting and its ended sessions at the last part.
    pub more: bool,
    /// A master had it drained (as the last heartbeat reply said): the
    /// master it registers with keeps it so.
    pub draining: bool,
    /// The latest [`SetCopies::generation`] it applied, in every part: the
    /// master decides every later change above it.
    pub copies_generation: u64,
}

/// The master's answer to a registration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Registered {
    pub heartbeat_interval_ms: u64,
    pub master_incarnation: u64,
    /// Allocation ids to release (freed while the agent was away).
    pub release: Vec<u64>,
    /// The data addresses of every node the master knows: the only
    /// places this agent may pull bytes from for a client.
    pub peers: Vec<String>,
    /// Changes whenever `peers` does.
    pub peers_version: u64,
    /// The master's term when masters are elected (larger for every later
    /// leader), else 0: the agent refuses older terms from then on.
    pub term: u64,
}

/// An agent's periodic report.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Heartbeat {
    pub name: String,
    /// `None`: unchanged since the last report.
    pub pool: Option<PoolUsage>,
    pub incarnation: u64,
    /// Every id the agent holds, now and then; otherwise those it
    /// reserved since its last heartbeat went through.
    pub held: Vec<u64>,
    pub ended_sessions: Vec<String>,
    /// The version of the peer list the agent holds.
    pub peers_version: u64,
    /// Allocations of which the agent holds extents still `filling`.
    pub filling: Vec<u64>,
}

/// The master's answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeartbeatReply {
    /// False: register again (unknown node or a new start).
    pub known: bool,
    pub release: Vec<u64>,
    /// As [`Registered::peers`], sent only when `peers_version` differs
    /// from the agent's (empty otherwise).
    pub peers: Vec<String>,
    pub peers_version: u64,
    /// The next heartbeat should list every id held (the master has not
    /// heard the node for a while: copies may have been dropped meanwhile).
    pub want_full: bool,
    /// The node is being drained (it says so when it registers again).
    pub draining: bool,
    /// Of the heartbeat's `filling`, the allocations with nothing being
    /// reserved, filled or owed back on the node, each with the bytes the
    /// master lists there (merged, in order): the agent's extents inside
    /// them are whole copies.
    pub whole: Vec<Listed>,
}

/// The bytes of an allocation the master lists on one node (any copy),
/// merged and in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Listed {
    pub alloc_id: u64,
    pub ranges: Vec<Range>,
}

/// Bytes `[alloc_offset, alloc_offset + len)` of an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Range {
    pub alloc_offset: u64,
    pub len: u64,
}

impl Range {
    /// Whether `ranges` each hold a byte, end before 2^64, and come in
    /// order without overlapping (as every list of ranges on the wire must).
    pub fn in_order(ranges: &[Range]) -> bool {
        let mut end = 0u64;
        for (i, r) in ranges.iter().enumerate() {
            let Some(e) = r.alloc_offset.checked_add(r.len) else {
                return false;
            };
            if r.len == 0 || (i > 0 && r.alloc_offset < end) {
                return false;
            }
            end = e;
        }
        true
    }
}

/// The master asking an agent to hold ranges of an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub alloc_id: u64,
    pub access_key: Vec<u8>,
    pub ranges: Vec<Range>,
    /// The record the agent keeps, for a restarted master.
    pub record: Allocation,
    pub fabric: Fabric,
    pub gpu: Option<u32>,
    /// Which copy of the ranges this node holds (0: the primary).
    pub copy: u32,
    /// The primary's replicas: the data addresses it copies every write
    /// of these ranges to (empty for a replica or one copy).
    pub replicas: Vec<String>,
    /// A new copy of bytes that hold data (re-created, or moved off a
    /// drained node), filled from a live copy after this: the agent
    /// reports its extents `filling` until the master confirms them.
    pub fill: bool,
}

/// The master asking an agent to let go of an allocation's memory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Release {
    pub alloc_id: u64,
    /// Only these bytes, in order and never overlapping (a new copy given
    /// up on a node that keeps other bytes of the allocation); empty:
    /// everything the agent holds of it.
    pub ranges: Vec<Range>,
}

impl Release {
    /// Everything the agent holds of `alloc_id`.
    pub fn all(alloc_id: u64) -> Self {
        Self {
            alloc_id,
            ranges: Vec::new(),
        }
    }

    /// Only `ranges` (`(offset, len)`, in order, never overlapping) of
    /// `alloc_id`.
    pub fn part(alloc_id: u64, ranges: &[(u64, u64)]) -> Self {
        Self {
            alloc_id,
            ranges: ranges
                .iter()
                .map(|&(alloc_offset, len)| Range { alloc_offset, len })
                .collect(),
        }
    }
}

/// One replica of the bytes a node holds as primary: its data address and
/// which of those bytes it holds. A node that took over another's bytes
/// (a promoted replica) copies each write only to the replicas holding
/// its range, so its replicas need not hold all it holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicaShare {
    pub data_addr: String,
    /// In order, never overlapping.
    pub ranges: Vec<Range>,
}

impl ReplicaShare {
    /// A replica of every byte of `ranges`.
    pub fn of(data_addr: impl Into<String>, ranges: &[Range]) -> Self {
        Self {
            data_addr: data_addr.into(),
            ranges: ranges.to_vec(),
        }
    }

    /// The parts of `ranges` (each `(offset, len)`) this replica holds, in
    /// their order, one per range of its own: a part never spans two of
    /// its ranges (they may be of two copies, each stamped apart).
    pub fn parts_of(&self, ranges: impl IntoIterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
        let mut parts = Vec::new();
        for (offset, len) in ranges {
            let end = offset.saturating_add(len);
            parts.extend(self.ranges.iter().filter_map(|r| {
                let from = offset.max(r.alloc_offset);
                let until = end.min(r.alloc_offset.saturating_add(r.len));
                (from < until).then(|| (from, until - from))
            }));
        }
        parts
    }
}

/// A replicated allocation's new copies on one agent, after a copy's
/// node was lost.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SetCopies {
    pub alloc_id: u64,
    /// Ranges the agent held as a replica that are its primary share now.
    pub promote: Vec<Range>,
    /// The replicas of the bytes it holds as primary, each with the bytes
    /// it holds, replacing the ones it had.
    pub replicas: Vec<ReplicaShare>,
    /// New replicas among them (data addresses), to be sent every byte
    /// they hold before the agent answers (a copy re-created elsewhere).
    pub fill: Vec<String>,
    /// When the master decided it: larger for every later decision, also
    /// across master restarts. The agent keeps the replicas of the latest
    /// change it applied, whatever order changes arrive in.
    pub generation: u64,
}

impl SetCopies {
    /// Whether each replica is named once, by an address, with bytes in
    /// order, and every fill is of one of them (what an agent may apply).
    pub fn well_formed(&self) -> bool {
        let mut addrs = std::collections::BTreeSet::new();
        self.replicas.iter().all(|s| {
            !s.data_addr.is_empty()
                && !s.ranges.is_empty()
                && Range::in_order(&s.ranges)
                && addrs.insert(s.data_addr.as_str())
        }) && self.fill.iter().all(|a| addrs.contains(a.as_str()))
    }
}

/// Where an agent put part of a reserved range.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Piece {
    pub alloc_offset: u64,
    pub len: u64,
    pub pool_offset: u64,
    pub rdma: Vec<RdmaRegion>,
}

/// An agent's answer to a reservation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reserved {
    pub pieces: Vec<Piece>,
    pub pool: Option<PoolUsage>,
}

/// A request for a new allocation, as the master takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocateRequest {
    pub spec: AllocSpec,
    /// The asking process's node (empty for an operator off the cluster).
    pub origin_node: String,
    /// The asking session; `None` for an operator.
    pub requester: Option<Owner>,
}

impl AllocateRequest {
    /// A checked request.
    ///
    /// # Errors
    /// [`Invalid::LocalGpu`] for local GPU memory that is named,
    /// persistent, or asked for outside a session.
    pub fn new(
        spec: AllocSpec,
        origin_node: String,
        requester: Option<Owner>,
    ) -> Result<Self, Invalid> {
        if spec.kind == Kind::LocalGpu
            && (spec.persistent || !spec.name.is_empty() || requester.is_none())
        {
            return Err(Invalid::LocalGpu);
        }
        Ok(Self {
            spec,
            origin_node,
            requester,
        })
    }

    /// Whether it outlives its creator: named allocations and everything
    /// an operator makes do.
    pub fn persistent(&self) -> bool {
        self.spec.outlives_session() || self.requester.is_none()
    }
}

/// Allocations one caller frees together (`free_many`): 1 to
/// [`MAX_BATCH`] distinct ids, checked and removed from the table in one
/// hold of the master's lock, all or none, and released with one call
/// per agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeBatch {
    ids: Vec<u64>,
}

impl FreeBatch {
    /// A checked batch, in the order given.
    ///
    /// # Errors
    /// [`Invalid::FreeCount`] outside 1 to [`MAX_BATCH`]; [`Invalid::Id`]
    /// for an id above [`MAX_ID`](crate::alloc::MAX_ID) (or 0);
    /// [`Invalid::FreeTwice`] for an id given twice.
    pub fn new(ids: Vec<u64>) -> Result<Self, Invalid> {
        if ids.is_empty() || ids.len() > MAX_BATCH as usize {
            return Err(Invalid::FreeCount(ids.len() as u64));
        }
        let mut seen = std::collections::BTreeSet::new();
        for &id in &ids {
            if id == 0 || id > crate::alloc::MAX_ID {
                return Err(Invalid::Id(id));
            }
            if !seen.insert(id) {
                return Err(Invalid::FreeTwice(id));
            }
        }
        Ok(Self { ids })
    }

    pub fn ids(&self) -> &[u64] {
        &self.ids
    }
}

/// `count` allocations of one spec for one session, made together: placed
/// in one hold of the master's lock, reserved in one call per agent, and
/// recorded all or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocateBatch {
    pub request: AllocateRequest,
    pub count: u32,
}

impl AllocateBatch {
    /// A checked batch.
    ///
    /// # Errors
    /// [`Invalid::BatchCount`] outside 1 to [`MAX_BATCH`];
    /// [`Invalid::BatchPersistent`] for a named or persistent spec, or a
    /// request from outside a session (such allocations outlive their
    /// caller, so one lost answer would leave a batch nobody holds).
    pub fn new(request: AllocateRequest, count: u64) -> Result<Self, Invalid> {
        let count = u32::try_from(count)
            .ok()
            .filter(|c| (1..=MAX_BATCH).contains(c))
            .ok_or(Invalid::BatchCount(count))?;
        if request.persistent() {
            return Err(Invalid::BatchPersistent);
        }
        Ok(Self { request, count })
    }
}
