//! The agent role: the node's pool, the allocations it holds, and the
//! sessions of local applications.
//!
//! The agent is the source of truth for the memory it holds. It reserves and
//! releases extents when the master says so and tracks which local sessions
//! are open. It never decides placement and never speaks gRPC itself (the
//! `grpc` module calls in).

pub mod held;
pub mod lease;
pub mod membership;

use std::sync::Arc;

use dashmap::DashMap;
use oncilla_proto::pb;
use oncilla_proto::wire::KEY_LEN;

use crate::error::CoreError;
use crate::pool::Pool;
use held::{Held, HeldExtent, HeldTable};
use lease::Leases;

/// A local application's session.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub id: String,
    pub pid: u32,
    pub program: String,
}

/// The agent core.
pub struct Agent {
    node: pb::NodeInfo,
    pool: Arc<Pool>,
    held: HeldTable,
    leases: Arc<Leases>,
    sessions: DashMap<String, SessionInfo>,
}

impl Agent {
    pub fn new(node: pb::NodeInfo, pool: Arc<Pool>) -> Self {
        Self {
            node,
            pool,
            held: HeldTable::default(),
            leases: Arc::default(),
            sessions: DashMap::new(),
        }
    }

    /// What this node tells the master about itself.
    pub fn node(&self) -> &pb::NodeInfo {
        &self.node
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The table the data path reads.
    pub fn held(&self) -> HeldTable {
        Arc::clone(&self.held)
    }

    /// Local processes mapping allocations held here.
    pub fn leases(&self) -> Arc<Leases> {
        Arc::clone(&self.leases)
    }

    /// Reserves pool memory for `ranges` (`(alloc_offset, len)`) of
    /// `alloc_id`, packed densely into as few pool extents as the pool
    /// gives. Blocks while the pool waits for its scrubber; call it off
    /// async executors.
    ///
    /// # Errors
    /// [`CoreError::InvalidArgument`] for a bad key, empty or overlapping
    /// ranges, or ranges already held; pool exhaustion.
    pub fn reserve(
        &self,
        alloc_id: u64,
        key: &[u8],
        ranges: &[(u64, u64)],
    ) -> Result<Vec<pb::Piece>, CoreError> {
        let key: [u8; KEY_LEN] = key.try_into().map_err(|_| {
            CoreError::InvalidArgument(format!("access key must be {KEY_LEN} bytes"))
        })?;
        let mut ranges = ranges.to_vec();
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
        let memory: Vec<Arc<_>> = self
            .pool
            .reserve(total)?
            .into_iter()
            .map(Arc::new)
            .collect();
        let mut extents = Vec::new();
        let (mut piece, mut used) = (0, 0);
        for &(offset, len) in &ranges {
            let mut done = 0;
            while done < len {
                let Some(m) = memory.get(piece) else {
                    return Err(CoreError::Internal("pool gave less than asked".into()));
                };
                let n = (len - done).min(m.len() - used);
                extents.push(Arc::new(HeldExtent {
                    alloc_offset: offset + done,
                    len: n,
                    memory: Arc::clone(m),
                    at: used,
                }));
                done += n;
                used += n;
                if used == m.len() {
                    piece += 1;
                    used = 0;
                }
            }
        }
        let pieces = extents
            .iter()
            .map(|e| pb::Piece {
                alloc_offset: e.alloc_offset,
                len: e.len,
                pool_offset: e.memory.offset() + e.at,
            })
            .collect();
        let mut entry = self.held.entry(alloc_id).or_insert_with(|| {
            Arc::new(Held {
                key,
                extents: Vec::new(),
            })
        });
        check_joinable(alloc_id, entry.value(), &key, &ranges)?;
        let mut all = entry.value().extents.clone();
        all.extend(extents);
        all.sort_by_key(|e| e.alloc_offset);
        *entry.value_mut() = Arc::new(Held { key, extents: all });
        tracing::debug!(alloc_id, ranges = ranges.len(), total, "reserved");
        Ok(pieces)
    }

    /// The pool's accounting, as reported to the master.
    pub fn usage(&self) -> pb::PoolUsage {
        let s = self.pool.stats();
        pb::PoolUsage {
            used: s.used,
            scrubbing: s.scrubbing,
            free: s.free,
            largest_free: s.largest_free,
        }
    }

    /// Forgets `alloc_id` and tells local processes mapping it. The memory
    /// goes to the scrubber when the returned entry, every in-flight copy
    /// and every local mapping of it are gone.
    pub fn release(&self, alloc_id: u64) -> Option<Arc<Held>> {
        let held = self.held.remove(&alloc_id).map(|(_, h)| h);
        self.leases.revoke(alloc_id);
        held
    }

    /// Number of allocations with memory on this node.
    pub fn allocations(&self) -> usize {
        self.held.len()
    }

    /// Registers a new local session.
    pub fn open_session(&self, pid: u32, program: String) -> SessionInfo {
        let id = format!("{}-{:016x}", self.node.name, rand::random::<u64>());
        let info = SessionInfo { id, pid, program };
        self.sessions.insert(info.id.clone(), info.clone());
        tracing::info!(session = %info.id, pid, program = %info.program, "session opened");
        info
    }

    /// Looks up an open session.
    ///
    /// # Errors
    /// [`CoreError::NoSuchSession`].
    pub fn session(&self, id: &str) -> Result<SessionInfo, CoreError> {
        self.sessions
            .get(id)
            .map(|s| s.value().clone())
            .ok_or_else(|| CoreError::NoSuchSession(id.to_string()))
    }

    /// Forgets a session (its stream closed).
    pub fn close_session(&self, id: &str) -> Option<SessionInfo> {
        self.sessions.remove(id).map(|(_, s)| s)
    }

    pub fn sessions(&self) -> usize {
        self.sessions.len()
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
    if current.key != *key {
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
mod tests {
    use super::*;
    use crate::pool::{HugePages, PoolSpec};

    fn agent() -> Agent {
        let node = pb::NodeInfo {
            name: "n1".into(),
            ..Default::default()
        };
        let spec = PoolSpec {
            capacity: 64 * 4096,
            huge_pages: HugePages::Off,
            slab: 16 * 4096,
        };
        Agent::new(node, Arc::new(Pool::new(spec).unwrap()))
    }

    #[test]
    fn reserve_and_release() {
        let a = agent();
        a.reserve(1, &[3; KEY_LEN], &[(0, 5000)]).unwrap();
        a.reserve(1, &[3; KEY_LEN], &[(5000, 100)]).unwrap();
        assert_eq!(a.pool().stats().used, 3 * 4096);
        assert!(
            a.reserve(1, &[3; KEY_LEN], &[(4000, 10)]).is_err(),
            "overlap"
        );
        assert!(
            a.reserve(1, &[4; KEY_LEN], &[(9000, 10)]).is_err(),
            "other key"
        );
        assert!(a.reserve(2, &[4; 3], &[(0, 10)]).is_err(), "short key");
        assert!(
            a.reserve(3, &[4; KEY_LEN], &[(0, 10), (5, 10)]).is_err(),
            "self-overlap"
        );
        assert!(a.reserve(3, &[4; KEY_LEN], &[]).is_err(), "nothing");
        let held = a.release(1).unwrap();
        assert_eq!(held.extents.len(), 2);
        drop(held);
        assert_eq!(a.pool().stats().used, 0);
        assert!(a.release(1).is_none());
    }

    #[test]
    fn splits_over_slabs_into_pieces() {
        let a = agent();
        // 20 pages do not fit one 16-page slab: two pieces tiling the range.
        let pieces = a
            .reserve(9, &[1; KEY_LEN], &[(100, 20 * 4096 - 5)])
            .unwrap();
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces[0].alloc_offset, 100);
        assert_eq!(pieces[0].len, 16 * 4096);
        assert_eq!(pieces[1].alloc_offset, 100 + 16 * 4096);
        assert_eq!(pieces[1].len, 4 * 4096 - 5);
        let held = a.held().get(&9).unwrap().value().clone();
        assert_eq!(held.extent_for(100, 16 * 4096), Some(0));
        assert_eq!(held.extent_for(100 + 16 * 4096, 10), Some(1));
        assert_eq!(a.usage().used, 20 * 4096);
    }

    #[test]
    fn striped_ranges_pack_into_one_pool_extent() {
        let a = agent();
        let ranges = [(0, 4096), (3 * 4096, 4096), (6 * 4096, 100)];
        let pieces = a.reserve(5, &[1; KEY_LEN], &ranges).unwrap();
        let got: Vec<(u64, u64)> = pieces.iter().map(|p| (p.alloc_offset, p.len)).collect();
        assert_eq!(got, ranges);
        // Densely packed: consecutive pool offsets, three pages in all.
        assert_eq!(pieces[1].pool_offset, pieces[0].pool_offset + 4096);
        assert_eq!(pieces[2].pool_offset, pieces[0].pool_offset + 2 * 4096);
        assert_eq!(a.usage().used, 3 * 4096);
        let held = a.held().get(&5).unwrap().value().clone();
        assert_eq!(held.extent_for(3 * 4096 + 10, 100), Some(1));
        assert_eq!(held.extent_for(4096, 1), None, "a gap held elsewhere");
    }

    #[test]
    fn sessions() {
        let a = agent();
        let s = a.open_session(7, "prog".into());
        assert!(s.id.starts_with("n1-"));
        assert_eq!(a.session(&s.id).unwrap().pid, 7);
        a.close_session(&s.id);
        assert!(matches!(a.session(&s.id), Err(CoreError::NoSuchSession(_))));
    }
}
