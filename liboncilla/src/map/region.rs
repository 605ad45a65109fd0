//! The virtual range a mapping of remote memory occupies: private anonymous
//! memory reserved without backing (`MAP_NORESERVE`), so a range the size of
//! a huge allocation costs nothing until its pages are filled. It owns the
//! range (unmapped when dropped) and drops pages on request; it never
//! decides which, and never fills them (the pager does, through
//! userfaultfd).

use std::num::NonZeroUsize;
use std::ptr::NonNull;

use nix::sys::mman::{madvise, mmap_anonymous, munmap, MapFlags, MmapAdvise, ProtFlags};

use crate::error::{Error, Result};

/// One reserved range, readable and writable, unmapped on drop.
pub(crate) struct Region {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region is an address range; every access to its bytes goes
// through raw pointers whose users (the pager, the application) order
// themselves through userfaultfd, never through a Rust reference to it.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only gives out the address and length.
unsafe impl Sync for Region {}

impl Region {
    /// Reserves `len` bytes (a multiple of the page size).
    pub(crate) fn new(len: usize) -> Result<Self> {
        let size = NonZeroUsize::new(len)
            .ok_or_else(|| Error::InvalidArgument("cannot map an empty allocation".into()))?;
        // SAFETY: a fresh private anonymous mapping at an address the kernel
        // picks; it aliases nothing.
        let raw = unsafe {
            mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }
        .map_err(|e| Error::Map(format!("cannot reserve {len} bytes of address space: {e}")))?;
        // Transparent huge pages would fill 2 MiB at a time behind
        // userfaultfd's back: blocks are filled whole, by UFFDIO_COPY.
        // SAFETY: the range just mapped; advice changes no contents.
        let _ = unsafe { madvise(raw, len, MmapAdvise::MADV_NOHUGEPAGE) };
        Ok(Self {
            base: raw.cast(),
            len,
        })
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Drops the pages of `[offset, offset + len)` (inside the range):
    /// their memory returns to the system, and the next touch faults.
    pub(crate) fn discard(&self, offset: usize, len: usize) -> Result<()> {
        debug_assert!(offset + len <= self.len);
        // SAFETY: `offset + len` is inside the range (callers pass whole
        // blocks of it), so the address is in this mapping and not null;
        // MADV_DONTNEED only drops private pages, whose next touch faults
        // through userfaultfd (no Rust reference to them exists).
        unsafe {
            let at = NonNull::new_unchecked(self.base.as_ptr().add(offset));
            madvise(at.cast(), len, MmapAdvise::MADV_DONTNEED)
        }
        .map_err(|e| Error::Map(format!("cannot drop mapped pages: {e}")))
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: exactly the range reserved in `new`, unmapped once; the
        // pager has stopped (it is dropped first) and the application's
        // handle to it is gone.
        if let Err(e) = unsafe { munmap(self.base.cast(), self.len) } {
            tracing::warn!(error = %e, "cannot unmap a mapped allocation's range");
        }
    }
}
