//! The memory a mapping of remote memory occupies: a memory file (memfd)
//! the size of the allocation, mapped twice. The *view* is what the
//! application touches, registered with userfaultfd; the *stage* is the
//! pager's own window on the same pages, where fetched bytes are received
//! straight from the fabric (no copy after it: the fault is resolved by
//! mapping those very pages into the view, `UFFDIO_CONTINUE`). A file
//! costs nothing until its pages are written, so a range the size of a
//! huge allocation is free until used.
//!
//! It owns the file and both ranges (unmapped when dropped) and drops pages
//! on request; it never decides which, and never maps pages into the view
//! (the pager does, through userfaultfd).

use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use nix::fcntl::{fallocate, FallocateFlags};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{madvise, mmap, munmap, MapFlags, MmapAdvise, ProtFlags};

use crate::error::{Error, Result};

/// One memory file and its two mappings, unmapped on drop.
pub(crate) struct Region {
    view: NonNull<u8>,
    stage: NonNull<u8>,
    len: usize,
    file: OwnedFd,
}

// SAFETY: a Region is two address ranges over one file; every access to
// its bytes goes through raw pointers whose users (the pager, the
// application) order themselves through userfaultfd and the pager's block
// table, never through a Rust reference held across calls.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only gives out addresses and drops pages.
unsafe impl Sync for Region {}

impl Region {
    /// A file of `len` bytes (a multiple of the page size) and its two
    /// mappings.
    pub(crate) fn new(len: usize) -> Result<Self> {
        let size = NonZeroUsize::new(len)
            .ok_or_else(|| Error::InvalidArgument("cannot map an empty allocation".into()))?;
        let fail = |what: &str, e: nix::Error| Error::Map(format!("cannot {what}: {e}"));
        let file = memfd_create("oncilla-map", MFdFlags::MFD_CLOEXEC)
            .map_err(|e| fail("make the mapping's memory file", e))?;
        let file_len = libc::off_t::try_from(len)
            .map_err(|_| Error::InvalidArgument("allocation too large to map".into()))?;
        nix::unistd::ftruncate(&file, file_len)
            .map_err(|e| fail(&format!("size the mapping's memory file to {len} bytes"), e))?;
        let map = |what: &str| {
            // SAFETY: a fresh shared mapping of our own file at an address
            // the kernel picks: it aliases no Rust memory.
            let at = unsafe {
                mmap(
                    None,
                    size,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED | MapFlags::MAP_NORESERVE,
                    &file,
                    0,
                )
            }
            .map_err(|e| fail(&format!("map {len} bytes ({what})"), e))?;
            // Huge pages would fill 2 MiB at a time behind the pager's
            // back, and a child process must not share pages the pager
            // has not filled: neither applies to these ranges.
            for advice in [MmapAdvise::MADV_NOHUGEPAGE, MmapAdvise::MADV_DONTFORK] {
                // SAFETY: the range just mapped; advice changes no contents.
                let _ = unsafe { madvise(at, len, advice) };
            }
            Ok::<_, Error>(at.cast::<u8>())
        };
        let view = map("the view")?;
        let stage = match map("the stage") {
            Ok(stage) => stage,
            Err(e) => {
                // SAFETY: the view just mapped, not handed out yet.
                let _ = unsafe { munmap(view.cast(), len) };
                return Err(e);
            }
        };
        Ok(Self {
            view,
            stage,
            len,
            file,
        })
    }

    /// Where the application sees the bytes.
    pub(crate) fn base(&self) -> *mut u8 {
        self.view.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Where the pager sees the same bytes (the stage): it receives
    /// fetched blocks here and reads dirty ones back from here.
    pub(crate) fn stage(&self) -> *mut u8 {
        self.stage.as_ptr()
    }

    /// Gives `[offset, offset + len)` (inside the range) its pages now, in
    /// one call, rather than one fault per page as bytes arrive: what a
    /// fetch does before receiving into the stage. Best effort: a page this
    /// leaves out is made by its first write all the same.
    pub(crate) fn populate(&self, offset: usize, len: usize) {
        debug_assert!(offset + len <= self.len);
        // SAFETY: inside the stage mapping; MADV_POPULATE_WRITE only makes
        // pages of the file present (zeroed where new), which the caller
        // owns for its fetch.
        let _ = unsafe {
            madvise(
                NonNull::new_unchecked(self.stage.as_ptr().add(offset)).cast(),
                len,
                MmapAdvise::MADV_POPULATE_WRITE,
            )
        };
    }

    /// Drops the pages of `[offset, offset + len)` (inside the range): the
    /// file gives their memory back to the system and both mappings lose
    /// them, so the next touch of the view faults.
    pub(crate) fn discard(&self, offset: usize, len: usize) -> Result<()> {
        debug_assert!(offset + len <= self.len);
        let (at, n) = (libc::off_t::try_from(offset), libc::off_t::try_from(len));
        let (Ok(at), Ok(n)) = (at, n) else {
            return Err(Error::Internal("a block beyond the memory file".into()));
        };
        fallocate(
            &self.file,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            at,
            n,
        )
        .map_err(|e| Error::Map(format!("cannot drop mapped pages: {e}")))
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        for at in [self.view, self.stage] {
            // SAFETY: exactly the ranges mapped in `new`, unmapped once; the
            // pager has stopped (it is dropped first) and the application's
            // handle to the view is gone.
            if let Err(e) = unsafe { munmap(at.cast(), self.len) } {
                tracing::warn!(error = %e, "cannot unmap a mapped allocation's range");
            }
        }
    }
}
