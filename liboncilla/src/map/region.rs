//! The virtual range a mapping of remote memory occupies: private anonymous
//! memory reserved without backing (`MAP_NORESERVE`), so a range the size of
//! a huge allocation costs nothing until its pages are filled. It owns the
//! range (unmapped when dropped), drops pages on request, and seals pages
//! that can never be filled so that touching them raises SIGBUS: they are
//! mapped over by an empty memory file, whose pages all lie past its end
//! (this works on every kernel, where `UFFDIO_POISON` needs Linux 6.6). It
//! never decides which pages, and never fills them (the pager does, through
//! userfaultfd).

use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{madvise, mmap, mmap_anonymous, munmap, MapFlags, MmapAdvise, ProtFlags};

use crate::error::{Error, Result};

/// One reserved range, readable and writable, unmapped on drop.
pub(crate) struct Region {
    base: NonNull<u8>,
    len: usize,
    /// An empty memory file: mapped over pages to seal them.
    empty: OwnedFd,
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
        let empty = match memfd_create("oncilla-unfetchable", MFdFlags::MFD_CLOEXEC) {
            Ok(fd) => fd,
            Err(e) => {
                // SAFETY: the range just mapped, not handed out yet.
                let _ = unsafe { munmap(raw, len) };
                return Err(Error::Map(format!("cannot make a memory file: {e}")));
            }
        };
        // Transparent huge pages would fill 2 MiB at a time behind
        // userfaultfd's back: blocks are filled whole, by UFFDIO_COPY.
        // SAFETY: the range just mapped; advice changes no contents.
        let _ = unsafe { madvise(raw, len, MmapAdvise::MADV_NOHUGEPAGE) };
        Ok(Self {
            base: raw.cast(),
            len,
            empty,
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

    /// Seals the pages of `[offset, offset + len)` (inside the range, whole
    /// pages): from now on touching them raises SIGBUS, for every thread,
    /// until the range is unmapped. Threads already waiting on a fault
    /// there must be woken to take the signal.
    pub(crate) fn seal(&self, offset: usize, len: usize) -> Result<()> {
        debug_assert!(offset + len <= self.len);
        let size =
            NonZeroUsize::new(len).ok_or_else(|| Error::Internal("sealing no pages".into()))?;
        // SAFETY: the address is inside this range (callers pass whole
        // blocks of it), which only this Region maps and nothing in Rust
        // references; MAP_FIXED replaces exactly those pages with a shared
        // mapping of an empty file, so any access to them raises SIGBUS.
        unsafe {
            let at = NonNull::new_unchecked(self.base.as_ptr().add(offset));
            mmap(
                Some(NonZeroUsize::new_unchecked(at.as_ptr() as usize)),
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
                &self.empty,
                0,
            )
        }
        .map(|_| ())
        .map_err(|e| Error::Map(format!("cannot seal mapped pages: {e}")))
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
