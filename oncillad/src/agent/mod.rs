//! The agent role: the node's pool, the allocations it holds, and the
//! sessions of local applications.
//!
//! The agent is the source of truth for the memory it holds. It reserves and
//! releases extents when the master says so, keeps the master's record of
//! each allocation it holds, and tracks which local sessions are open and
//! which have ended, so that a restarted master can rebuild its table from
//! the agents' reports. It never decides placement and never speaks gRPC
//! itself (the `grpc` module calls in).

mod copies;
pub mod cpu;
mod filling;
mod fresh;
pub mod membership;
mod release;
mod sessions;

pub use membership::MasterPort;
pub use sessions::SessionInfo;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use oncilla_model::alloc::{mappable_on, Allocation, Extent, RdmaRegion, KEY_LEN};
use oncilla_model::cluster::{
    Piece, Range, Registration, ReplicaShare, Reservation, SessionReport,
};
use oncilla_model::node::{NodeInfo, PoolUsage};
use oncilla_model::Kind;
use tokio::sync::Notify;

use crate::error::CoreError;
use crate::hca::Rdma;
use crate::memory::held::{Backing, GpuMemory, Held, HeldExtent, HeldTable, Holdings};
use crate::memory::keys::Keys;
use crate::memory::lease::Leases;
use crate::peers::Peers;
use crate::pool::{Access, Pool};

/// The agent core.
pub struct Agent {
    node: NodeInfo,
    /// Random per start, never 0: tells the master this is a new, empty pool.
    incarnation: u64,
    pool: Arc<Pool>,
    held: HeldTable,
    leases: Arc<Leases>,
    sessions: DashMap<String, SessionInfo>,
    next_session: AtomicU64,
    /// Sessions that ended and that the master has not acknowledged.
    ended: Mutex<Vec<String>>,
    /// Wakes the membership loop to report ended sessions at once.
    wake: Notify,
    /// The master incarnation this agent last registered with.
    master_incarnation: AtomicU64,
    /// The master has this node drained (its last heartbeat reply said):
    /// reported when registering, so a new master keeps it so.
    draining: AtomicBool,
    /// The latest copy change's generation applied here: reported when
    /// registering, so a new master decides every later change above it.
    copies_generation: AtomicU64,
    /// The largest master term this agent has met (0 while masters are
    /// not elected): anything from an older term is refused.
    term: AtomicU64,
    /// The node's RDMA ports: device memory is registered there.
    rdma: Arc<Rdma>,
    /// Set when what `info` reports changed (an RDMA port went away): the
    /// membership loop registers again so the master learns it.
    info_changed: AtomicBool,
    /// The cluster's data addresses, as the master last said (the data
    /// server pulls only from these).
    peers: Arc<Peers>,
    /// How long the session credentials this agent gives are good for.
    credential_lifetime: std::time::Duration,
    /// Sessions that ended here: refused at once by this node's listeners.
    ended_here: Arc<crate::listen::ended::Ended>,
    /// Ids reserved since the last heartbeat went through.
    fresh: fresh::Fresh,
    /// New copies not yet confirmed whole by the master.
    filling: filling::Filling,
}

impl Agent {
    /// An agent for `node` exporting `pool`; its sessions' credentials
    /// are good for `credential_lifetime`.
    pub fn new(
        node: NodeInfo,
        pool: Arc<Pool>,
        rdma: Arc<Rdma>,
        credential_lifetime: std::time::Duration,
    ) -> Self {
        Self {
            credential_lifetime,
            ended_here: crate::listen::ended::Ended::for_credentials(credential_lifetime),
            rdma,
            held: Arc::new(Holdings::new(node.name.clone())),
            node,
            incarnation: rand::random::<u64>().max(1),
            pool,
            leases: Arc::default(),
            sessions: DashMap::new(),
            next_session: AtomicU64::new(0),
            ended: Mutex::new(Vec::new()),
            wake: Notify::new(),
            master_incarnation: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            copies_generation: AtomicU64::new(0),
            term: AtomicU64::new(0),
            info_changed: AtomicBool::new(false),
            peers: Arc::default(),
            fresh: fresh::Fresh::default(),
            filling: filling::Filling::default(),
        }
    }

    /// The cluster's data addresses, kept current by the membership loop.
    pub fn peers(&self) -> Arc<Peers> {
        Arc::clone(&self.peers)
    }

    /// This start of the agent (see [`Registration::incarnation`]).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// This node as it started (name, addresses, capacity); see
    /// [`Agent::info`] for what it reports now.
    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    /// What this node tells the master about itself now: its RDMA ports
    /// and fabrics as they are (a port may have gone away since start).
    pub fn info(&self) -> NodeInfo {
        let mut info = self.node.clone();
        let (ports, note) = self.rdma.report();
        info.rdma = ports;
        info.rdma_note = note;
        if !self.rdma.available() {
            info.fabrics.retain(|f| f != "verbs");
        }
        info
    }

    /// Whether [`Agent::info`] changed since the last call.
    pub fn take_info_changed(&self) -> bool {
        self.info_changed.swap(false, Ordering::SeqCst)
    }

    /// Lets go of every RDMA port whose device went away (see
    /// [`Rdma::sweep`]): every registration on it, in every allocation
    /// held, so nothing of this process holds the device any more; the
    /// master hears of it at once. Blocking verbs calls: off the executor.
    pub fn sweep_rdma(&self) {
        let gone = self.rdma.sweep();
        for (port, label) in &gone {
            // Said first: dropping the last registration lets the device
            // go, and whoever removed it may look for this line then.
            tracing::warn!(
                port = %label,
                "RDMA port went away: its queue pairs and registrations are dropped; clients reach this node over tcp"
            );
            for e in self.held.iter() {
                forget_port(e.value(), *port);
            }
        }
        if !gone.is_empty() {
            self.info_changed.store(true, Ordering::SeqCst);
            self.wake.notify_one();
        }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The node's RDMA state (queue pairs for clients, GPU registrations).
    pub fn rdma(&self) -> &Arc<Rdma> {
        &self.rdma
    }

    /// The table the data path reads.
    pub fn held(&self) -> HeldTable {
        Arc::clone(&self.held)
    }

    /// Local processes mapping allocations held here.
    pub fn leases(&self) -> Arc<Leases> {
        Arc::clone(&self.leases)
    }

    /// Reserves pool memory for the reservation's ranges, packed densely
    /// into as few pool extents as the pool gives. Blocks while the pool
    /// waits for its refiller; call it off async executors.
    ///
    /// Its `record` is the master's description of the allocation, kept
    /// for reports; `fabric` what its creator uses for this node; `copy`
    /// which copy of the ranges this is, and for the primary the replicas
    /// it copies every write to.
    ///
    /// # Errors
    /// [`CoreError::InvalidArgument`] for a bad key, empty or overlapping
    /// ranges, or ranges already held; pool exhaustion.
    pub fn reserve(&self, r: Reservation) -> Result<Vec<Piece>, CoreError> {
        let Reservation {
            alloc_id,
            access_key,
            ranges,
            record,
            fabric,
            gpu,
            copy,
            replicas,
            fill,
        } = r;
        let key: [u8; KEY_LEN] = access_key.as_slice().try_into().map_err(|_| {
            CoreError::InvalidArgument(format!("access key must be {KEY_LEN} bytes"))
        })?;
        let mut ranges: Vec<(u64, u64)> = ranges.iter().map(|g| (g.alloc_offset, g.len)).collect();
        ranges.sort_unstable();
        let mut end = 0;
        for &(offset, len) in &ranges {
            if len == 0 || offset < end || offset.checked_add(len).is_none() {
                return Err(CoreError::InvalidArgument(format!(
                    "bad or overlapping range: offset {offset}, length {len}"
                )));
            }
            end = offset + len;
        }
        let Some(total) = ranges.iter().try_fold(0u64, |t, r| t.checked_add(r.1)) else {
            return Err(CoreError::InvalidArgument("ranges too large".into()));
        };
        if total == 0 {
            return Err(CoreError::InvalidArgument("no range to reserve".into()));
        }
        // Check before reserving so a refused request costs no memory; the
        // check is repeated under the entry lock below.
        if let Some(current) = self.held.get(&alloc_id) {
            check_joinable(alloc_id, current.value(), &key, &ranges)?;
        }
        let (keys, mut extents) = match gpu {
            Some(index) => (
                Keys::none(),
                vec![gpu_extent(alloc_id, &ranges, index, &record, &self.rdma)?],
            ),
            None => {
                let owner = record.owner.as_ref().map(|o| o.session_id.as_str());
                let access = if mappable_on(owner, &self.node.name, record.placement.copies()) {
                    Access::Mapped
                } else {
                    Access::Copied
                };
                // A replicated allocation is never registered for RDMA: a
                // one-sided write would bypass the primary's copying.
                let register = record.placement.copies() <= 1;
                self.pool_extents(&ranges, total, record.user, access, register)?
            }
        };
        let ticket = if fill { self.filling.ticket() } else { 0 };
        for e in &mut extents {
            e.copy = copy;
            e.filling = AtomicU64::new(ticket);
            for r in &mut e.rdma {
                r.incarnation = self.incarnation;
            }
        }
        let pieces = extents
            .iter()
            .map(|e| Piece {
                alloc_offset: e.alloc_offset,
                len: e.len,
                pool_offset: e.pool_offset(),
                rdma: e.rdma.clone(),
            })
            .collect();
        let mut entry = self.held.entry(alloc_id).or_insert_with(|| {
            Arc::new(Held {
                keys: Keys::none(),
                key,
                extents: Vec::new(),
                record: Allocation::new(alloc_id, record.size, record.kind),
                fabric,
                copying: Arc::default(),
            })
        });
        check_joinable(alloc_id, entry.value(), &key, &ranges)?;
        let mut all = entry.value().extents.clone();
        all.extend(extents.into_iter().map(Arc::new));
        all.sort_by_key(|e| e.alloc_offset);
        keys.absorb(&entry.value().keys);
        // One copying state per allocation here, whichever share came
        // first; the primary's share brings its replicas (set below, once
        // the table's entry is let go: the order lock never waits inside
        // it).
        let copying = entry.value().copying.clone();
        let held = Arc::new(Held {
            keys,
            key,
            extents: all,
            record,
            fabric,
            copying,
        });
        *entry.value_mut() = Arc::clone(&held);
        drop(entry);
        if !replicas.is_empty() {
            // Unless a copy change came first: it was decided later.
            let mut order = held.copying.order();
            if order.generation == 0 {
                let of: Vec<Range> = ranges
                    .iter()
                    .map(|&(alloc_offset, len)| Range { alloc_offset, len })
                    .collect();
                let replicas = replicas
                    .into_iter()
                    .map(|a| ReplicaShare::of(a, &of))
                    .collect();
                order.copy_to(replicas, &[]);
            }
        }
        // A port may have gone while this registered on it: the sweep took
        // it out before walking the table, so one of the two sees the other.
        for port in self.rdma.removed_ports() {
            forget_port(&held, port);
        }
        self.fresh.note(alloc_id);
        if fill {
            self.filling.note(alloc_id);
            tracing::info!(
                alloc_id,
                copy,
                bytes = total,
                "reserved a new copy to be filled"
            );
        } else {
            tracing::debug!(alloc_id, ranges = ranges.len(), total, ?gpu, "reserved");
        }
        Ok(pieces)
    }

    /// Reserves a batch, all or none: when one reservation fails, the
    /// allocations the batch brought here are released again (one that
    /// was held before the batch is left to the master's rollback, which
    /// releases every allocation of a failed batch anyway).
    ///
    /// # Errors
    /// As [`Agent::reserve`], for the first reservation that fails.
    pub fn reserve_many(&self, batch: Vec<Reservation>) -> Result<Vec<Vec<Piece>>, CoreError> {
        let mut made = Vec::with_capacity(batch.len());
        let mut fresh = Vec::new();
        for r in batch {
            let id = r.alloc_id;
            let new = !self.held.contains_key(&id);
            match self.reserve(r) {
                Ok(pieces) => {
                    made.push(pieces);
                    if new {
                        fresh.push(id);
                    }
                }
                Err(e) => {
                    for id in fresh {
                        drop(self.release(id));
                    }
                    return Err(e);
                }
            }
        }
        Ok(made)
    }

    /// Pool memory for `ranges` (sorted, `total` bytes), packed densely,
    /// reachable as `access` says, and registered with the node's RDMA
    /// ports: each pool extent once per port, its keys for this allocation
    /// alone.
    fn pool_extents(
        &self,
        ranges: &[(u64, u64)],
        total: u64,
        user: Option<u32>,
        access: Access,
        register: bool,
    ) -> Result<(Keys, Vec<HeldExtent>), CoreError> {
        let memory: Vec<Arc<_>> = self
            .pool
            .reserve(total, user, access)?
            .into_iter()
            .map(Arc::new)
            .collect();
        let spans: Vec<_> = memory.iter().map(|m| (m.ptr(0), m.len())).collect();
        let registered = if register {
            // SAFETY: each span is a whole pool extent reserved just above;
            // the keys go into the allocation's `Held` beside the extents
            // and are dropped (or revoked) before them.
            unsafe { self.rdma.register_host(&spans) }
        } else {
            Ok((Keys::none(), vec![Vec::new(); spans.len()]))
        };
        let (keys, regions) = match registered {
            Ok(r) => r,
            Err(why) => {
                // Still served over TCP; clients see no region and do not
                // try verbs for it.
                tracing::warn!("allocation memory not registered for RDMA: {why}");
                (Keys::none(), vec![Vec::new(); spans.len()])
            }
        };
        let mut extents = Vec::new();
        let (mut piece, mut used) = (0, 0);
        for &(offset, len) in ranges {
            let mut done = 0;
            while done < len {
                let Some(m) = memory.get(piece) else {
                    return Err(CoreError::Internal("pool gave less than asked".into()));
                };
                let n = (len - done).min(m.len() - used);
                let rdma = regions[piece]
                    .iter()
                    .map(|r| RdmaRegion {
                        addr: r.addr + used,
                        ..r.clone()
                    })
                    .collect();
                extents.push(HeldExtent {
                    alloc_offset: offset + done,
                    len: n,
                    memory: Backing::Pool(Arc::clone(m)),
                    at: used,
                    rdma,
                    copy: 0,
                    filling: AtomicU64::new(0),
                });
                done += n;
                used += n;
                if used == m.len() {
                    piece += 1;
                    used = 0;
                }
            }
        }
        Ok((keys, extents))
    }

    /// The pool's accounting, as reported to the master.
    pub fn usage(&self) -> PoolUsage {
        let s = self.pool.stats();
        PoolUsage {
            used: s.used,
            scrubbing: s.scrubbing,
            free: s.free,
            largest_free: s.largest_free,
        }
    }

    /// Whether the master has this node drained, as it last said.
    pub fn set_draining(&self, draining: bool) {
        if self.draining.swap(draining, Ordering::SeqCst) != draining {
            tracing::info!(draining, "the master changed this node's drain");
        }
    }

    /// Device memory held here for `REMOTE_GPU` allocations: extents and
    /// bytes.
    pub fn gpu_held(&self) -> (u64, u64) {
        let mut out = (0, 0);
        for h in self.held.iter() {
            for e in &h.value().extents {
                if matches!(e.memory, crate::memory::held::Backing::Gpu(_)) {
                    out.0 += 1;
                    out.1 += e.len;
                }
            }
        }
        out
    }

    /// RDMA memory registrations held for allocations here.
    pub fn rdma_registrations(&self) -> usize {
        self.held.iter().map(|h| h.value().keys.count()).sum()
    }

    /// Number of allocations with memory on this node.
    pub fn allocations(&self) -> usize {
        self.held.len()
    }

    /// Ids of every allocation held here.
    /// The ids reserved since the last call, `None` when too many to list
    /// (see [`fresh::Fresh`]).
    pub fn take_fresh(&self) -> Option<Vec<u64>> {
        self.fresh.take()
    }

    pub fn held_ids(&self) -> Vec<u64> {
        self.held.iter().map(|e| *e.key()).collect()
    }

    pub fn set_master_incarnation(&self, m: u64) {
        self.master_incarnation.store(m, Ordering::SeqCst);
    }

    /// Follows the master that answered this agent's registration in
    /// `term` (fencing): from now on older terms are refused. The only
    /// place a term is learnt, so a caller that merely holds the cluster
    /// token cannot push an agent's term up by naming one in a call.
    ///
    /// # Errors
    /// [`CoreError::Deposed`] when `term` is older than one followed.
    pub fn follow_term(&self, term: u64) -> Result<(), CoreError> {
        let follows = self.term.fetch_max(term, Ordering::SeqCst).max(term);
        if term < follows {
            return Err(CoreError::Deposed { term, follows });
        }
        Ok(())
    }

    /// Admits a change asked by a master of `term` (fencing): refused when
    /// older than the term this agent follows, so a deposed master (cut
    /// off, paused, or not yet aware its lease ended) changes nothing
    /// here once a newer leader was met.
    ///
    /// # Errors
    /// [`CoreError::Deposed`] for an older term.
    pub fn admit_term(&self, term: u64) -> Result<(), CoreError> {
        let follows = self.term.load(Ordering::SeqCst);
        if term < follows {
            return Err(CoreError::Deposed { term, follows });
        }
        Ok(())
    }

    /// Everything this agent holds and serves, for (re-)registering; with
    /// the ended sessions it covers (acknowledged by a successful register).
    pub fn registration(&self) -> (Registration, Vec<String>) {
        // Ended sessions first: one that ends after this snapshot is still
        // in the list of open ones or queued again.
        let ended = self.ended_sessions();
        // Everything held goes below: what was reserved before is in it.
        drop(self.fresh.take());
        let next_session_seq = self.next_session.load(Ordering::SeqCst);
        let sessions = self
            .sessions
            .iter()
            .map(|s| SessionReport {
                who: self.owner_of(s.value()),
                attached: s.attached.iter().copied().collect(),
            })
            .collect();
        let held: Vec<Allocation> = self
            .held
            .iter()
            .map(|e| {
                let h = e.value();
                let mut record = h.record.clone();
                record.id = *e.key();
                record.access_key = h.key.to_vec();
                let (primary, replicas): (Vec<_>, Vec<_>) =
                    h.extents.iter().partition(|x| x.copy == 0);
                let report = |x: &Arc<HeldExtent>| Extent {
                    node: self.node.name.clone(),
                    alloc_offset: x.alloc_offset,
                    len: x.len,
                    pool_offset: x.pool_offset(),
                    data_addr: self.node.data_addr.clone(),
                    fabric: h.fabric,
                    agent_addr: self.node.agent_addr.clone(),
                    gpu: x.gpu(),
                    rdma: x.rdma.clone(),
                    copy: x.copy,
                    filling: x.filling.load(Ordering::SeqCst) != 0,
                };
                record.extents = primary.into_iter().map(report).collect();
                record.replicas = replicas.into_iter().map(report).collect();
                // As the master keeps them.
                record.replicas.sort_by_key(|e| (e.copy, e.alloc_offset));
                record
            })
            .collect();
        let max_held_id = held.iter().map(|a| a.id).max().unwrap_or(0);
        let req = Registration {
            max_held_id,
            node: self.info(),
            incarnation: self.incarnation,
            master_incarnation: self.master_incarnation.load(Ordering::SeqCst),
            held,
            sessions,
            next_session_seq,
            // The link cuts it into parts and marks all but the last.
            more: false,
            draining: self.draining.load(Ordering::SeqCst),
            copies_generation: self.copies_generation.load(Ordering::SeqCst),
        };
        (req, ended)
    }
}

/// Drops `h`'s registrations on RDMA port `port`: its host memory's keys
/// and its device memory's GPUDirect registrations.
fn forget_port(h: &Held, port: usize) {
    h.keys.drop_port(port);
    for x in &h.extents {
        if let Backing::Gpu(g) = &x.memory {
            if let Some(r) = &g.rdma {
                r.drop_port(port);
            }
        }
    }
}

/// The one extent of a GPU allocation: device memory this agent allocates
/// (`REMOTE_GPU`), or the record of memory in the asking process
/// (`LOCAL_GPU`). Blocks while the driver allocates and zeroes. Device
/// memory is registered with the node's RDMA ports where GPUDirect works.
fn gpu_extent(
    alloc_id: u64,
    ranges: &[(u64, u64)],
    index: u32,
    record: &Allocation,
    rdma: &Rdma,
) -> Result<HeldExtent, CoreError> {
    let &[(0, len)] = ranges else {
        return Err(CoreError::InvalidArgument(format!(
            "GPU allocation {alloc_id} must be one range from offset 0"
        )));
    };
    let (memory, rdma) = match record.kind {
        Kind::LocalGpu => (Backing::InProcess { gpu: index }, Vec::new()),
        Kind::RemoteGpu => {
            let mem = oncilla_cuda::Gpu::open(index)
                .and_then(|g| g.alloc(len))
                .map_err(gpu_error)?;
            // Without GPUDirect the extent is still served, over TCP.
            let rdma = rdma
                .register_gpu(&mem)
                .inspect_err(|why| {
                    tracing::debug!(
                        alloc_id,
                        gpu = index,
                        "device memory not registered for RDMA: {why}"
                    );
                })
                .ok();
            let regions = rdma.as_ref().map(|r| r.regions.clone()).unwrap_or_default();
            (Backing::Gpu(Arc::new(GpuMemory { rdma, mem })), regions)
        }
        _ => {
            return Err(CoreError::InvalidArgument(format!(
                "allocation {alloc_id} names GPU {index} but is not of a GPU kind"
            )))
        }
    };
    Ok(HeldExtent {
        alloc_offset: 0,
        len,
        memory,
        at: 0,
        rdma,
        copy: 0,
        filling: AtomicU64::new(0),
    })
}

/// A driver failure as the master and the client see it.
pub(crate) fn gpu_error(e: oncilla_cuda::CudaError) -> CoreError {
    use oncilla_cuda::CudaError as E;
    match e {
        E::NoDriver | E::Init(_) | E::NoSuchDevice { .. } => CoreError::NoGpu(e.to_string()),
        E::OutOfMemory {
            device,
            requested,
            free,
        } => CoreError::CapacityExhausted {
            requested,
            detail: format!(
                "GPU {device} has {} free",
                oncilla_model::size::HumanBytes(free)
            ),
        },
        other => CoreError::Internal(other.to_string()),
    }
}

/// Refuses new ranges of `alloc_id` under another key or over ranges
/// already held.
fn check_joinable(
    alloc_id: u64,
    current: &Held,
    key: &[u8; KEY_LEN],
    ranges: &[(u64, u64)],
) -> Result<(), CoreError> {
    if !oncilla_model::secret::ct_eq(&current.key, key) {
        return Err(CoreError::InvalidArgument(format!(
            "allocation {alloc_id} is already held with another access key"
        )));
    }
    for &(offset, len) in ranges {
        let overlaps = current
            .extents
            .iter()
            .any(|e| offset < e.alloc_offset + e.len && e.alloc_offset < offset + len);
        if overlaps {
            return Err(CoreError::InvalidArgument(format!(
                "range at {offset} of allocation {alloc_id} is already held"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
