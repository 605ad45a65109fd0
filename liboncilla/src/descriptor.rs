//! A validated allocation descriptor: what the data path needs to reach
//! every byte of an allocation. Built once from the cluster's record of it
//! (`oncilla_model::alloc::Allocation`, which the gRPC edge converts from
//! the wire), so copies never re-check its shape. It knows nothing of
//! protobuf.

use oncilla_model::alloc::{Allocation as Record, KEY_LEN};

use crate::error::{Error, Result};

pub use oncilla_model::alloc::RdmaRegion;
pub use oncilla_model::Kind;

/// One extent: bytes `[alloc_offset, alloc_offset + len)` live on `node`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Extent {
    pub node: String,
    pub alloc_offset: u64,
    pub len: u64,
    /// TCP data endpoint of the node.
    pub data_addr: String,
    /// Agent gRPC endpoint of the node (RDMA connection setup).
    pub agent_addr: String,
    /// Where the extent starts in the node's pool (RDMA addressing).
    pub pool_offset: u64,
    /// Set for device memory: the GPU index on `node`.
    pub gpu: Option<u32>,
    /// The extent's memory registered with the node's RDMA ports for this
    /// allocation alone (host pool memory, and device memory with GPUDirect
    /// RDMA), one region per port; empty where verbs cannot reach it.
    pub rdma: Vec<RdmaRegion>,
    /// A process on `node` may map it: the allocation is persistent or its
    /// session is on `node`, and has one copy
    /// ([`oncilla_model::alloc::mappable_on`]); otherwise it is copied even
    /// there.
    pub mappable: bool,
}

impl Extent {
    /// What the extent's bytes are, for [`oncilla_model::fabric::choose`].
    pub fn memory(&self) -> oncilla_model::fabric::Memory {
        let rdma = !self.rdma.is_empty();
        match self.gpu {
            None if self.mappable => oncilla_model::fabric::Memory::Host { rdma },
            None => oncilla_model::fabric::Memory::Unmappable { rdma },
            Some(_) => oncilla_model::fabric::Memory::Gpu { rdma },
        }
    }
}

/// Everything needed to copy to and from an allocation.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Descriptor {
    pub id: u64,
    pub size: u64,
    pub kind: Kind,
    pub extents: Vec<Extent>,
    pub(crate) key: [u8; KEY_LEN],
    /// Session that owns it; `None` when persistent.
    pub owner: Option<String>,
    /// Set for named allocations.
    pub name: Option<String>,
}

impl Descriptor {
    /// Validates an allocation's record: a full-length key, and extents
    /// that tile `[0, size)` in order without gaps.
    ///
    /// # Errors
    /// [`Error::Internal`] naming the defect.
    pub fn from_record(a: Record) -> Result<Self> {
        let bad = |why: &str| Error::Internal(format!("malformed allocation {}: {why}", a.id));
        let key: [u8; KEY_LEN] = a
            .access_key
            .as_slice()
            .try_into()
            .map_err(|_| bad("bad key"))?;
        let mut next = 0u64;
        for e in &a.extents {
            if e.alloc_offset != next || e.len == 0 {
                return Err(bad("extents do not tile the allocation"));
            }
            next = next
                .checked_add(e.len)
                .ok_or_else(|| bad("extent overflow"))?;
        }
        if next != a.size {
            return Err(bad("extents do not cover the allocation"));
        }
        let owner = a.owner.map(|o| o.session_id);
        let copies = a.placement.copies();
        Ok(Self {
            id: a.id,
            size: a.size,
            kind: a.kind,
            extents: a
                .extents
                .into_iter()
                .map(|e| Extent {
                    mappable: oncilla_model::alloc::mappable_on(owner.as_deref(), &e.node, copies),
                    node: e.node,
                    alloc_offset: e.alloc_offset,
                    len: e.len,
                    data_addr: e.data_addr,
                    agent_addr: e.agent_addr,
                    pool_offset: e.pool_offset,
                    gpu: e.gpu,
                    rdma: e.rdma,
                })
                .collect(),
            key,
            owner,
            name: (!a.name.is_empty()).then_some(a.name),
        })
    }

    /// Checks that `[offset, offset + len)` lies inside the allocation.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`].
    pub fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::OutOfBounds {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Splits `[offset, offset + len)` into per-extent pieces: `(extent
    /// index, extent, offset in allocation, offset in caller's buffer,
    /// length)`.
    pub(crate) fn pieces(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Iterator<Item = (usize, &Extent, u64, usize, u64)> + '_ {
        let end = offset + len;
        // Extents are ordered: start at the one holding `offset`.
        let first = self
            .extents
            .partition_point(|e| e.alloc_offset + e.len <= offset);
        self.extents[first..]
            .iter()
            .enumerate()
            .take_while(move |(_, e)| e.alloc_offset < end)
            .filter_map(move |(i, e)| {
                let start = offset.max(e.alloc_offset);
                let stop = end.min(e.alloc_offset + e.len);
                (start < stop).then(|| {
                    let buf_at = usize::try_from(start - offset).unwrap_or(usize::MAX);
                    (first + i, e, start, buf_at, stop - start)
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(extents: &[(u64, u64)], size: u64) -> Record {
        let mut a = Record::new(1, size, Kind::RemoteHost);
        a.access_key = vec![0; KEY_LEN];
        a.extents = extents
            .iter()
            .map(|&(o, l)| oncilla_model::alloc::Extent {
                node: format!("n{o}"),
                alloc_offset: o,
                len: l,
                ..Default::default()
            })
            .collect();
        a
    }

    #[test]
    fn validates_tiling() {
        assert!(Descriptor::from_record(record(&[(0, 10), (10, 5)], 15)).is_ok());
        assert!(Descriptor::from_record(record(&[(0, 10), (11, 4)], 15)).is_err());
        assert!(Descriptor::from_record(record(&[(0, 10)], 15)).is_err());
        let mut short_key = record(&[(0, 1)], 1);
        short_key.access_key = vec![1];
        assert!(Descriptor::from_record(short_key).is_err());
    }

    #[test]
    fn splits_ranges_over_extents() {
        let d = Descriptor::from_record(record(&[(0, 10), (10, 10), (20, 10)], 30)).unwrap();
        let p: Vec<_> = d
            .pieces(5, 20)
            .map(|(i, e, a, b, l)| (i, e.alloc_offset, a, b, l))
            .collect();
        assert_eq!(
            p,
            vec![(0, 0, 5, 0, 5), (1, 10, 10, 5, 10), (2, 20, 20, 15, 5)]
        );
        assert!(d.check_range(25, 5).is_ok());
        assert!(matches!(
            d.check_range(25, 6),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(d.check_range(u64::MAX, 2).is_err());
    }
}
