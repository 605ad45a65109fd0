//! The agent role: the node's pool, the allocations it holds, and the
//! sessions of local applications.
//!
//! The agent is the source of truth for the memory it holds. It reserves and
//! releases extents when the master says so and tracks which local sessions
//! are open. It never decides placement and never speaks gRPC itself (the
//! `grpc` module calls in).

pub mod held;
pub mod membership;

use std::sync::Arc;

use dashmap::DashMap;
use oncilla_proto::pb;
use oncilla_proto::wire::KEY_LEN;

use crate::error::CoreError;
use crate::pool::Pool;
use held::{Held, HeldExtent, HeldTable};

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
    sessions: DashMap<String, SessionInfo>,
}

impl Agent {
    pub fn new(node: pb::NodeInfo, pool: Arc<Pool>) -> Self {
        Self {
            node,
            pool,
            held: HeldTable::default(),
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

    /// Reserves pool memory for one extent of `alloc_id`.
    ///
    /// # Errors
    /// [`CoreError::InvalidArgument`] for a bad key or an extent that
    /// overlaps one already held; pool exhaustion.
    pub fn reserve(
        &self,
        alloc_id: u64,
        key: &[u8],
        alloc_offset: u64,
        len: u64,
    ) -> Result<u64, CoreError> {
        let key: [u8; KEY_LEN] = key.try_into().map_err(|_| {
            CoreError::InvalidArgument(format!("access key must be {KEY_LEN} bytes"))
        })?;
        if len == 0 || alloc_offset.checked_add(len).is_none() {
            return Err(CoreError::InvalidArgument(format!(
                "bad extent: offset {alloc_offset}, length {len}"
            )));
        }
        let memory = self.pool.reserve(len)?;
        let pool_offset = memory.offset();
        let extent = Arc::new(HeldExtent {
            alloc_offset,
            len,
            memory,
        });
        let mut entry = self.held.entry(alloc_id).or_insert_with(|| {
            Arc::new(Held {
                key,
                extents: Vec::new(),
            })
        });
        let current = entry.value();
        if current.key != key {
            return Err(CoreError::InvalidArgument(format!(
                "allocation {alloc_id} is already held with another access key"
            )));
        }
        let overlaps = current
            .extents
            .iter()
            .any(|e| alloc_offset < e.alloc_offset + e.len && e.alloc_offset < alloc_offset + len);
        if overlaps {
            return Err(CoreError::InvalidArgument(format!(
                "extent at {alloc_offset} of allocation {alloc_id} is already held"
            )));
        }
        let mut extents = current.extents.clone();
        extents.push(extent);
        *entry.value_mut() = Arc::new(Held { key, extents });
        tracing::debug!(alloc_id, alloc_offset, len, pool_offset, "reserved extent");
        Ok(pool_offset)
    }

    /// Forgets `alloc_id`. The memory is scrubbed and freed when the returned
    /// entry and every in-flight copy using it are dropped; drop it off the
    /// async executor, since scrubbing a large extent takes time.
    pub fn release(&self, alloc_id: u64) -> Option<Arc<Held>> {
        self.held.remove(&alloc_id).map(|(_, h)| h)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> Agent {
        let node = pb::NodeInfo {
            name: "n1".into(),
            ..Default::default()
        };
        Agent::new(node, Pool::new(64 * 4096).unwrap())
    }

    #[test]
    fn reserve_and_release() {
        let a = agent();
        a.reserve(1, &[3; KEY_LEN], 0, 5000).unwrap();
        a.reserve(1, &[3; KEY_LEN], 5000, 100).unwrap();
        assert_eq!(a.pool().used(), 3 * 4096);
        assert!(a.reserve(1, &[3; KEY_LEN], 4000, 10).is_err(), "overlap");
        assert!(a.reserve(1, &[4; KEY_LEN], 9000, 10).is_err(), "other key");
        assert!(a.reserve(2, &[4; 3], 0, 10).is_err(), "short key");
        let held = a.release(1).unwrap();
        assert_eq!(held.extents.len(), 2);
        drop(held);
        assert_eq!(a.pool().used(), 0);
        assert!(a.release(1).is_none());
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
