//! The node's exported memory: one memfd-backed, pre-faulted, locked mapping,
//! and the extent allocator over it.
//!
//! The pool owns the mapping and the free list. An allocation is a
//! [`PoolExtent`], page-aligned; dropping it zeroes its bytes and returns them
//! to the free list, so no tenant ever sees another's data. This module never
//! decides *who* gets memory (that is placement, in the master) and never
//! touches the network.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mlock, mmap, munmap, MapFlags, ProtFlags};
use oncilla_proto::size::HumanBytes;
use oncilla_proto::PAGE;

/// Why the pool could not be created or could not satisfy a request.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("capacity must be at least one page ({PAGE} bytes)")]
    TooSmall,
    #[error("capacity {} exceeds this node's physical memory {}; choose a smaller --capacity", HumanBytes(*.requested), HumanBytes(*.physical))]
    AbovePhysical { requested: u64, physical: u64 },
    #[error("cannot create the pool's memfd: {0}")]
    Memfd(#[source] nix::Error),
    #[error("cannot size the pool to {}: {source}", HumanBytes(*.len))]
    Truncate {
        len: u64,
        #[source]
        source: nix::Error,
    },
    #[error("cannot map {} of pool memory: {source}", HumanBytes(*.len))]
    Map {
        len: u64,
        #[source]
        source: nix::Error,
    },
    #[error("cannot lock {} of pool memory ({source}); raise the locked-memory limit (`ulimit -l unlimited`, LimitMEMLOCK=infinity in systemd, or IPC_LOCK in a container) or lower --capacity", HumanBytes(*.len))]
    Lock {
        len: u64,
        #[source]
        source: nix::Error,
    },
    #[error("pool has {} free (largest hole {}), cannot reserve {}", HumanBytes(*.free), HumanBytes(*.largest), HumanBytes(*.requested))]
    Exhausted {
        requested: u64,
        free: u64,
        largest: u64,
    },
}

/// Rounds up to a whole number of pages.
pub fn page_round(len: u64) -> u64 {
    len.div_ceil(PAGE) * PAGE
}

struct FreeList {
    /// Holes by offset: offset -> length. Adjacent holes are always merged.
    holes: BTreeMap<u64, u64>,
    used: u64,
}

/// The locked memory a node exports.
pub struct Pool {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: u64,
    free: Mutex<FreeList>,
}

// SAFETY: the mapping is plain shared memory owned by the pool for its whole
// life; all bookkeeping is behind a Mutex, and access to the bytes goes
// through raw pointers whose ranges the allocator hands out exclusively.
unsafe impl Send for Pool {}
// SAFETY: as above; `&Pool` exposes no unsynchronised interior state.
unsafe impl Sync for Pool {}

impl Pool {
    /// Creates a pool of `capacity` bytes (rounded up to a page): memfd,
    /// mapped shared, pre-faulted and locked.
    ///
    /// # Errors
    /// [`PoolError`] when the capacity is impossible or the memory cannot be
    /// created, mapped or locked.
    pub fn new(capacity: u64) -> Result<Arc<Self>, PoolError> {
        let len = page_round(capacity);
        if len == 0 {
            return Err(PoolError::TooSmall);
        }
        let physical = physical_memory();
        if len > physical {
            return Err(PoolError::AbovePhysical {
                requested: len,
                physical,
            });
        }
        let name = CString::new("oncilla-pool").map_err(|_| PoolError::TooSmall)?;
        let fd = memfd_create(name.as_c_str(), MFdFlags::MFD_CLOEXEC).map_err(PoolError::Memfd)?;
        let off = i64::try_from(len).map_err(|_| PoolError::AbovePhysical {
            requested: len,
            physical,
        })?;
        nix::unistd::ftruncate(&fd, off).map_err(|source| PoolError::Truncate { len, source })?;
        let size = usize::try_from(len)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or(PoolError::TooSmall)?;
        // SAFETY: a fresh shared mapping of a memfd we own, at an address the
        // kernel picks; it aliases no Rust object.
        let ptr = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                &fd,
                0,
            )
        }
        .map_err(|source| PoolError::Map { len, source })?;
        // SAFETY: `ptr`/`size` describe the mapping just created.
        if let Err(source) = unsafe { mlock(ptr, size.get()) } {
            // SAFETY: unmapping the mapping we just created and never shared.
            let _ = unsafe { munmap(ptr, size.get()) };
            return Err(PoolError::Lock { len, source });
        }
        let mut holes = BTreeMap::new();
        holes.insert(0, len);
        Ok(Arc::new(Self {
            fd,
            base: ptr.cast(),
            len,
            free: Mutex::new(FreeList { holes, used: 0 }),
        }))
    }

    /// Total bytes in the pool.
    pub fn capacity(&self) -> u64 {
        self.len
    }

    /// Bytes currently reserved.
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// The memfd behind the pool (for same-node sharing).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Reserves `len` bytes (rounded up to a page) from the first hole that fits.
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] with the free space and the largest hole.
    pub fn reserve(self: &Arc<Self>, len: u64) -> Result<PoolExtent, PoolError> {
        let want = page_round(len.max(1));
        let mut fl = self.lock();
        let hit = fl
            .holes
            .iter()
            .find(|(_, &hole)| hole >= want)
            .map(|(&off, &hole)| (off, hole));
        let Some((off, hole)) = hit else {
            let free = self.len - fl.used;
            let largest = fl.holes.values().copied().max().unwrap_or(0);
            return Err(PoolError::Exhausted {
                requested: want,
                free,
                largest,
            });
        };
        fl.holes.remove(&off);
        if hole > want {
            fl.holes.insert(off + want, hole - want);
        }
        fl.used += want;
        Ok(PoolExtent {
            pool: Arc::clone(self),
            offset: off,
            len: want,
        })
    }

    /// Raw pointer to `offset` inside the pool.
    ///
    /// Callers must keep `offset + len` within an extent they hold.
    pub fn ptr(&self, offset: u64) -> *mut u8 {
        debug_assert!(offset <= self.len);
        let off = usize::try_from(offset).unwrap_or(usize::MAX);
        self.base.as_ptr().wrapping_add(off)
    }

    fn release(&self, offset: u64, len: u64) {
        // Scrub before the bytes can be handed out again.
        // SAFETY: [offset, offset+len) is an extent we handed out and whose
        // owner is being dropped, so nobody else reads or writes it now, and
        // it lies inside the mapping.
        unsafe {
            std::ptr::write_bytes(self.ptr(offset), 0, usize::try_from(len).unwrap_or(0));
        }
        let mut fl = self.lock();
        fl.used -= len;
        let mut start = offset;
        let mut size = len;
        if let Some((&prev, &plen)) = fl.holes.range(..offset).next_back() {
            if prev + plen == offset {
                fl.holes.remove(&prev);
                start = prev;
                size += plen;
            }
        }
        if let Some(&nlen) = fl.holes.get(&(offset + len)) {
            fl.holes.remove(&(offset + len));
            size += nlen;
        }
        fl.holes.insert(start, size);
    }

    fn lock(&self) -> MutexGuard<'_, FreeList> {
        // The free list stays consistent even if a holder panicked: every
        // mutation completes before the guard drops.
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn holes(&self) -> Vec<(u64, u64)> {
        self.lock().holes.iter().map(|(&a, &b)| (a, b)).collect()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let len = usize::try_from(self.len).unwrap_or(0);
        // SAFETY: the mapping was created in `new` with this length; every
        // extent holds an Arc to the pool, so none is alive now.
        if let Err(e) = unsafe { munmap(self.base.cast(), len) } {
            tracing::error!(error = %e, "cannot unmap pool");
        }
    }
}

/// A reserved, page-aligned range of the pool. Dropping it scrubs the bytes
/// and frees the range.
pub struct PoolExtent {
    pool: Arc<Pool>,
    offset: u64,
    len: u64,
}

impl PoolExtent {
    /// Offset of the extent inside the pool.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reserved length (a whole number of pages, never zero).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Pointer to byte `at` of the extent; `at + len` of any access must stay
    /// within [`Self::len`].
    pub fn ptr(&self, at: u64) -> *mut u8 {
        self.pool.ptr(self.offset + at.min(self.len))
    }
}

impl Drop for PoolExtent {
    fn drop(&mut self) {
        self.pool.release(self.offset, self.len);
    }
}

/// Physical memory of this node in bytes.
fn physical_memory() -> u64 {
    use nix::unistd::{sysconf, SysconfVar};
    let pages = sysconf(SysconfVar::_PHYS_PAGES).ok().flatten().unwrap_or(0);
    let size = sysconf(SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096);
    u64::try_from(pages.saturating_mul(size)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reserve_release_coalesces() {
        let pool = Pool::new(16 * PAGE).unwrap();
        let a = pool.reserve(1).unwrap();
        let b = pool.reserve(3 * PAGE).unwrap();
        let c = pool.reserve(PAGE + 1).unwrap();
        assert_eq!((a.offset(), a.len()), (0, PAGE));
        assert_eq!((b.offset(), b.len()), (PAGE, 3 * PAGE));
        assert_eq!((c.offset(), c.len()), (4 * PAGE, 2 * PAGE));
        assert_eq!(pool.used(), 6 * PAGE);
        drop(b);
        drop(a);
        drop(c);
        assert_eq!(pool.holes(), vec![(0, 16 * PAGE)]);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn exhausted_reports_free_and_largest() {
        let pool = Pool::new(4 * PAGE).unwrap();
        let _a = pool.reserve(PAGE).unwrap();
        let b = pool.reserve(PAGE).unwrap();
        let _c = pool.reserve(PAGE).unwrap();
        drop(b);
        match pool.reserve(2 * PAGE) {
            Err(PoolError::Exhausted { free, largest, .. }) => {
                assert_eq!((free, largest), (2 * PAGE, PAGE));
            }
            other => panic!("expected exhaustion, got {:?}", other.map(|e| e.offset())),
        }
    }

    #[test]
    fn freed_memory_is_scrubbed() {
        let pool = Pool::new(2 * PAGE).unwrap();
        let a = pool.reserve(PAGE).unwrap();
        // SAFETY: the extent is ours and one page long.
        unsafe { std::ptr::write_bytes(a.ptr(0), 0xAB, PAGE as usize) };
        drop(a);
        let b = pool.reserve(PAGE).unwrap();
        // SAFETY: the extent is ours and one page long.
        let bytes = unsafe { std::slice::from_raw_parts(b.ptr(0), PAGE as usize) };
        assert!(bytes.iter().all(|&x| x == 0));
    }

    #[test]
    fn refuses_more_than_physical() {
        assert!(matches!(
            Pool::new(u64::MAX / 2),
            Err(PoolError::AbovePhysical { .. })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn random_sequences_never_overlap_or_leak(ops in prop::collection::vec((any::<bool>(), 1u64..6 * PAGE), 1..80)) {
            let pool = Pool::new(64 * PAGE).unwrap();
            let mut live: Vec<PoolExtent> = Vec::new();
            for (alloc, len) in ops {
                if alloc || live.is_empty() {
                    if let Ok(e) = pool.reserve(len) {
                        for other in &live {
                            let disjoint = e.offset() + e.len() <= other.offset()
                                || other.offset() + other.len() <= e.offset();
                            prop_assert!(disjoint);
                        }
                        live.push(e);
                    }
                } else {
                    let i = (len as usize) % live.len();
                    live.swap_remove(i);
                }
                let held: u64 = live.iter().map(PoolExtent::len).sum();
                prop_assert_eq!(pool.used(), held);
            }
            live.clear();
            prop_assert_eq!(pool.holes(), vec![(0, 64 * PAGE)]);
        }
    }
}
