//! Leases: local processes that map an allocation's memory.
//!
//! A process maps extents over a map-socket connection that it keeps open
//! for as long as the mapping lives: the connection is its lease. While it
//! is open the agent keeps the allocation's extents (so a freed allocation's
//! memory is never scrubbed and handed to someone else under a live
//! mapping); when the allocation is released the agent writes one byte on
//! every lease, which the process checks before each copy and reports as
//! "freed". This module only keeps the registry; it never maps memory.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

/// The byte that tells a mapping process its allocation was released.
pub const REVOKED: u8 = 1;

/// Open leases by allocation id.
#[derive(Default)]
pub struct Leases {
    next: AtomicU64,
    by_alloc: DashMap<u64, Vec<(u64, UnixStream)>>,
}

impl Leases {
    /// Registers `stream` as a lease on `alloc_id`; returns its id.
    ///
    /// # Errors
    /// When the stream cannot be duplicated.
    pub fn add(&self, alloc_id: u64, stream: &UnixStream) -> std::io::Result<u64> {
        let writer = stream.try_clone()?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.by_alloc
            .entry(alloc_id)
            .or_default()
            .push((id, writer));
        Ok(id)
    }

    /// Forgets a lease whose process went away.
    pub fn remove(&self, alloc_id: u64, lease: u64) {
        if let Some(mut list) = self.by_alloc.get_mut(&alloc_id) {
            list.retain(|(id, _)| *id != lease);
        }
        self.by_alloc
            .remove_if(&alloc_id, |_, list| list.is_empty());
    }

    /// Whether a process maps `alloc_id`.
    pub fn holds(&self, alloc_id: u64) -> bool {
        self.by_alloc.contains_key(&alloc_id)
    }

    /// Tells every process mapping `alloc_id` that it was released.
    pub fn revoke(&self, alloc_id: u64) {
        let Some((_, list)) = self.by_alloc.remove(&alloc_id) else {
            return;
        };
        for (_, mut stream) in list {
            // Best effort and never blocking: a process that does not read
            // its lease still holds the memory until it unmaps.
            let _ = stream.set_nonblocking(true);
            if let Err(e) = stream.write_all(&[REVOKED]) {
                tracing::debug!(alloc_id, error = %e, "cannot notify a lease");
            }
        }
    }

    /// Number of open leases (reported by `Agent.Status`).
    pub fn len(&self) -> usize {
        self.by_alloc.iter().map(|e| e.value().len()).sum()
    }

    /// Whether no lease is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn revoke_notifies_every_lease_once() {
        let leases = Leases::default();
        let (a, mut a_peer) = UnixStream::pair().unwrap();
        let (b, mut b_peer) = UnixStream::pair().unwrap();
        leases.add(7, &a).unwrap();
        let gone = leases.add(7, &b).unwrap();
        leases.remove(7, gone);
        assert_eq!(leases.len(), 1);
        leases.revoke(7);
        leases.revoke(7);
        assert!(leases.is_empty());
        let mut byte = [0u8; 2];
        assert_eq!(a_peer.read(&mut byte).unwrap(), 1);
        assert_eq!(byte[0], REVOKED);
        b_peer.set_nonblocking(true).unwrap();
        assert!(b_peer.read(&mut byte).is_err(), "removed lease is not told");
    }
}
