//! The allocations this node holds, as the data path sees them.
//!
//! Each entry is immutable and shared (`Arc`): a data request clones the
//! entry for its duration, so a concurrent release cannot recycle memory that
//! a copy is still touching — the extents go back to the pool (scrubbed) when
//! the last clone drops. This module never talks to the network.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;
use oncilla_model::alloc::{Allocation, RdmaRegion, KEY_LEN};
use oncilla_model::Fabric;

use oncilla_cuda::DeviceMem;

use super::copying::Copying;
use super::keys::{GpuRegistration, Keys};
use crate::pool::PoolExtent;

/// What an extent's bytes are.
#[derive(Clone)]
pub enum Backing {
    /// Host memory of the pool.
    Pool(Arc<PoolExtent>),
    /// Device memory this agent allocated (`REMOTE_GPU`).
    Gpu(Arc<GpuMemory>),
    /// Device memory in the process that asked for it (`LOCAL_GPU`): the
    /// agent keeps only the record, so a restarted master learns of it.
    InProcess { gpu: u32 },
}

/// Device memory of a `REMOTE_GPU` extent and, where GPUDirect RDMA works,
/// its registrations with the node's RDMA ports.
pub struct GpuMemory {
    /// Declared before `mem`: fields drop in order, so the HCA lets go of
    /// the memory before the driver frees it.
    pub rdma: Option<GpuRegistration>,
    pub mem: DeviceMem,
}

/// One extent of an allocation: a range of its bytes, placed inside memory
/// the allocation owns (several extents of one allocation may share a pool
/// extent when its ranges are striped).
pub struct HeldExtent {
    /// Where the extent starts inside the allocation.
    pub alloc_offset: u64,
    /// Length in bytes.
    pub len: u64,
    pub memory: Backing,
    /// Where the extent starts inside `memory`.
    pub at: u64,
    /// Its memory as registered with the node's RDMA ports (one region per
    /// port, addressing the extent's first byte); empty where verbs does
    /// not reach it.
    pub rdma: Vec<RdmaRegion>,
    /// Which copy of the allocation's bytes it holds (0: the primary,
    /// which takes writes; a replica takes them only from its primary).
    pub copy: u32,
    /// 0: a whole copy. Otherwise the ticket of the reservation that made
    /// it a new copy to be filled, until the master confirms it
    /// (`agent::filling`).
    pub filling: AtomicU64,
}

impl HeldExtent {
    /// The same memory as copy `copy` (a replica promoted to primary: the
    /// master promotes only a whole copy, so it is confirmed).
    pub fn as_copy(&self, copy: u32) -> Self {
        let filling = if copy == 0 {
            0
        } else {
            self.filling.load(Ordering::SeqCst)
        };
        Self {
            alloc_offset: self.alloc_offset,
            len: self.len,
            memory: self.memory.clone(),
            at: self.at,
            rdma: self.rdma.clone(),
            copy,
            filling: AtomicU64::new(filling),
        }
    }

    /// The same memory, no longer reached over RDMA (its keys were
    /// revoked: the allocation is moving off a drained node).
    pub fn without_rdma(&self) -> Self {
        Self {
            rdma: Vec::new(),
            ..self.as_copy(self.copy)
        }
    }

    /// The pool memory behind the extent; `None` for GPU memory.
    pub fn pool(&self) -> Option<&Arc<PoolExtent>> {
        match &self.memory {
            Backing::Pool(m) => Some(m),
            Backing::Gpu(_) | Backing::InProcess { .. } => None,
        }
    }

    /// The GPU holding the extent, if it is device memory.
    pub fn gpu(&self) -> Option<u32> {
        match &self.memory {
            Backing::Pool(_) => None,
            Backing::Gpu(m) => Some(m.mem.gpu().index()),
            Backing::InProcess { gpu } => Some(*gpu),
        }
    }

    /// Where the extent starts in the pool (0 for device memory).
    pub fn pool_offset(&self) -> u64 {
        self.pool().map_or(0, |m| m.offset() + self.at)
    }
}

/// An allocation's extents on this node, with its access key and the
/// master's record of it (reported back when a master restarts).
pub struct Held {
    /// The remote keys of its host memory on this node. Declared before
    /// `extents`: fields drop in order, so the keys stop working before the
    /// memory can return to the pool; release revokes them at once.
    pub keys: Keys,
    pub key: [u8; KEY_LEN],
    /// Ordered by `alloc_offset`, never overlapping.
    pub extents: Vec<Arc<HeldExtent>>,
    /// The allocation as the master described it at reservation (no
    /// extents, key or attachments).
    pub record: Allocation,
    /// The fabric its creator uses for this node.
    pub fabric: Fabric,
    /// Its copying: where writes to its primary ranges here go (nowhere
    /// for one copy, until a drain moves it), in one order.
    pub copying: Arc<Copying>,
}

impl Held {
    /// The same allocation with `extents` in place of its own: the keys
    /// move over (still revoked before the memory goes), the rest is kept.
    pub fn with_extents(&self, extents: Vec<Arc<HeldExtent>>) -> Held {
        let keys = Keys::none();
        keys.absorb(&self.keys);
        Held {
            keys,
            key: self.key,
            extents,
            record: self.record.clone(),
            fabric: self.fabric,
            copying: Arc::clone(&self.copying),
        }
    }

    /// Index of the extent that contains all of `[offset, offset + len)`, if
    /// one does (a binary search: striped allocations have many extents).
    pub fn extent_for(&self, offset: u64, len: u64) -> Option<usize> {
        let end = offset.checked_add(len)?;
        let i = self
            .extents
            .partition_point(|e| e.alloc_offset <= offset)
            .checked_sub(1)?;
        let e = &self.extents[i];
        (end <= e.alloc_offset + e.len).then_some(i)
    }

    /// The extents that together hold exactly `[offset, offset + len)`,
    /// one after another with no gap (a replica's pieces need not match
    /// its primary's), if they do.
    pub fn span_for(&self, offset: u64, len: u64) -> Option<std::ops::Range<usize>> {
        if len == 0 {
            return None;
        }
        let end = offset.checked_add(len)?;
        let first = self
            .extents
            .partition_point(|e| e.alloc_offset <= offset)
            .checked_sub(1)?;
        let mut at = offset;
        let mut i = first;
        while at < end {
            let e = self.extents.get(i)?;
            if e.alloc_offset > at || e.alloc_offset + e.len <= at {
                return None;
            }
            at = e.alloc_offset + e.len;
            i += 1;
        }
        Some(first..i.max(first + 1))
    }

    /// Its allocation is gone: its RDMA keys stop working now, and its
    /// pool memory counts as on its way back even while a TCP copy or a
    /// local mapping that began before still holds it.
    pub fn release(&self) {
        self.keys.revoke();
        for e in &self.extents {
            if let Some(m) = e.pool() {
                m.release();
            }
        }
    }

    /// Constant-time check of a presented access key.
    pub fn key_matches(&self, presented: &[u8; KEY_LEN]) -> bool {
        oncilla_model::secret::ct_eq(&self.key, presented)
    }
}

/// Allocation id -> what this node holds of it, and who "this node" is, so
/// a request for something not held can say why it may be missing.
pub struct Holdings {
    map: DashMap<u64, Arc<Held>>,
    node: String,
    started: Instant,
}

impl Holdings {
    pub fn new(node: String) -> Self {
        Self {
            map: DashMap::new(),
            node,
            started: Instant::now(),
        }
    }

    /// The message for a request naming an allocation not held here.
    pub fn not_held(&self, id: u64) -> String {
        format!(
            "no such allocation on {}: {id} (this agent started {} s ago with an empty pool: \
             the allocation was freed, or its bytes were lost when the agent restarted)",
            self.node,
            self.started.elapsed().as_secs()
        )
    }
}

impl Deref for Holdings {
    type Target = DashMap<u64, Arc<Held>>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

/// Shared by the agent and the data servers.
pub type HeldTable = Arc<Holdings>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{Access, HugePages, Pool, PoolSpec};

    #[test]
    fn finds_only_fully_covering_extent() {
        let pool = Pool::new(PoolSpec::new(8 * 4096, HugePages::Off)).unwrap();
        let held = Held {
            keys: Keys::none(),
            key: [1; KEY_LEN],
            extents: vec![
                Arc::new(HeldExtent {
                    alloc_offset: 0,
                    len: 100,
                    memory: Backing::Pool(Arc::new(
                        pool.reserve(100, None, Access::Mapped).unwrap().remove(0),
                    )),
                    at: 0,
                    rdma: Vec::new(),
                    copy: 0,
                    filling: AtomicU64::new(0),
                }),
                Arc::new(HeldExtent {
                    alloc_offset: 300,
                    len: 100,
                    memory: Backing::Pool(Arc::new(
                        pool.reserve(100, None, Access::Mapped).unwrap().remove(0),
                    )),
                    at: 0,
                    rdma: Vec::new(),
                    copy: 0,
                    filling: AtomicU64::new(0),
                }),
            ],
            record: Allocation::new(0, 400, oncilla_model::Kind::RemoteHost),
            fabric: Fabric::Auto,
            copying: Arc::default(),
        };
        assert_eq!(held.span_for(0, 100), Some(0..1));
        assert_eq!(held.span_for(350, 50), Some(1..2));
        assert!(held.span_for(50, 300).is_none(), "a gap");
        assert!(held.span_for(399, 2).is_none());
        assert!(held.span_for(150, 0).is_none(), "nothing to hold");
        assert!(held.span_for(500, 0).is_none());
        assert_eq!(held.extent_for(350, 50), Some(1));
        assert!(held.extent_for(50, 100).is_none());
        assert!(held.extent_for(150, 10).is_none());
        assert!(held.extent_for(399, 2).is_none());
        assert!(held.extent_for(u64::MAX, 2).is_none());
        assert!(held.key_matches(&[1; KEY_LEN]));
        assert!(!held.key_matches(&[2; KEY_LEN]));
    }
}
