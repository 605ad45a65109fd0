//! Memory for the raw TCP baseline's server made the way an agent makes a
//! pool slab: a memfd of 4 KiB pages, mapped shared, pre-faulted
//! (`MAP_POPULATE`) and locked, so `bench copy --raw-memory slab` can tell
//! what pool memory costs apart from what Oncilla's own code costs. It
//! owns the mapping and hands out only a borrowed byte slice; it never
//! shares the fd and is never used by a daemon.

use std::ffi::CStr;
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mlock, mmap, munmap, MapFlags, ProtFlags};

/// Which step of making the mapping failed.
#[derive(Debug, thiserror::Error)]
pub enum PagesError {
    #[error("memfd_create: {0}")]
    Memfd(#[source] nix::Error),
    #[error("ftruncate: {0}")]
    Truncate(#[source] nix::Error),
    #[error("mmap: {0}")]
    Map(#[source] nix::Error),
    #[error("mlock: {0}")]
    Lock(#[source] nix::Error),
}

/// A locked, pre-faulted, memfd-backed shared mapping of `len` bytes.
pub struct SharedPages {
    /// Keeps the memfd open for the mapping's life, as a slab does.
    _fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping belongs to this value alone for its whole life and is
// reached only through `bytes(&mut self)`, so moving it to another thread
// moves the only way to touch it.
unsafe impl Send for SharedPages {}

impl SharedPages {
    /// Makes the mapping.
    ///
    /// # Errors
    /// The step that failed (locking fails under a low `RLIMIT_MEMLOCK`).
    pub fn new(len: usize) -> Result<Self, PagesError> {
        const NAME: &CStr = c"oncilla-raw-baseline";
        let fd = memfd_create(NAME, MFdFlags::MFD_CLOEXEC).map_err(PagesError::Memfd)?;
        let off = i64::try_from(len).map_err(|_| PagesError::Truncate(nix::Error::EFBIG))?;
        nix::unistd::ftruncate(&fd, off).map_err(PagesError::Truncate)?;
        let size = NonZeroUsize::new(len).ok_or(PagesError::Map(nix::Error::EINVAL))?;
        // SAFETY: a fresh shared mapping of a memfd we own, at an address
        // the kernel picks; it aliases no Rust object.
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
        .map_err(PagesError::Map)?;
        // SAFETY: `ptr`/`len` describe the mapping just created.
        if let Err(e) = unsafe { mlock(ptr, len) } {
            // SAFETY: unmapping the mapping we just created and never shared.
            let _ = unsafe { munmap(ptr, len) };
            return Err(PagesError::Lock(e));
        }
        Ok(Self {
            _fd: fd,
            base: ptr.cast(),
            len,
        })
    }

    /// The whole mapping.
    pub fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `base` is a live mapping of `len` bytes that this value
        // alone owns; the slice borrows `self` mutably, so nothing else
        // aliases it and the mapping outlives it.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }
}

impl Drop for SharedPages {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `new` with this length, and no
        // slice of it outlives `self`.
        let _ = unsafe { munmap(self.base.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_page_aligned_zeroed_and_writable() {
        let mut p = SharedPages::new(1 << 20).unwrap();
        let b = p.bytes();
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert!(b.iter().all(|&x| x == 0));
        b.fill(7);
        assert!(p.bytes().iter().all(|&x| x == 7));
    }
}
