//! One slab: a memfd, mapped shared, pre-faulted and locked.
//!
//! A slab is the unit the rest of the system builds on: it is what gets
//! registered once with an RDMA device and what is shared with same-node
//! processes (its fd), so this module exposes exactly its fd, base address
//! and length. It never hands out parts of itself (the free list does that)
//! and never zeroes memory after creation (the scrubber does).
//!
//! The memfd is sealed against shrinking and growing before anyone else
//! sees it: a process it is shared with can map it but never truncate it,
//! so no access of the agent's to pool memory can fault (SIGBUS) because
//! of what a client did to the file.

use std::ffi::CString;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mlock, mmap, munmap, MapFlags, ProtFlags};

/// Which step of making a slab failed.
#[derive(Debug)]
pub enum SlabError {
    Memfd(nix::Error),
    Truncate(nix::Error),
    Map(nix::Error),
    Lock(nix::Error),
    Seal(nix::Error),
}

/// A locked, pre-faulted, memfd-backed mapping.
pub struct Slab {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: u64,
    start: u64,
}

// SAFETY: the mapping is shared memory owned by the slab for its whole life;
// the slab only hands out raw pointers, and whoever writes through them owns
// the range (the free list gives each range to one holder at a time).
unsafe impl Send for Slab {}
// SAFETY: as above; `&Slab` exposes no interior state.
unsafe impl Sync for Slab {}

impl Slab {
    /// Creates a slab of `len` bytes (a multiple of the page size in use)
    /// that starts at pool offset `start`, backed by huge pages if `huge`.
    pub fn create(start: u64, len: u64, huge: bool) -> Result<Self, SlabError> {
        let name = CString::new(format!("oncilla-slab-{start:x}"))
            .map_err(|_| SlabError::Memfd(nix::Error::EINVAL))?;
        let mut flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
        if huge {
            flags |= MFdFlags::MFD_HUGETLB;
        }
        let fd = memfd_create(name.as_c_str(), flags).map_err(SlabError::Memfd)?;
        let off = i64::try_from(len).map_err(|_| SlabError::Truncate(nix::Error::EFBIG))?;
        nix::unistd::ftruncate(&fd, off).map_err(SlabError::Truncate)?;
        // Its size is final: shared with clients later, it must never
        // shrink under the agent (or grow), and the seals themselves are
        // final too.
        nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_ADD_SEALS(
                nix::fcntl::SealFlag::F_SEAL_SHRINK
                    | nix::fcntl::SealFlag::F_SEAL_GROW
                    | nix::fcntl::SealFlag::F_SEAL_SEAL,
            ),
        )
        .map_err(SlabError::Seal)?;
        let size = usize::try_from(len)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or(SlabError::Map(nix::Error::EINVAL))?;
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
        .map_err(SlabError::Map)?;
        // SAFETY: `ptr`/`size` describe the mapping just created.
        if let Err(e) = unsafe { mlock(ptr, size.get()) } {
            // SAFETY: unmapping the mapping we just created and never shared.
            let _ = unsafe { munmap(ptr, size.get()) };
            return Err(SlabError::Lock(e));
        }
        Ok(Self {
            fd,
            base: ptr.cast(),
            len,
            start,
        })
    }

    /// The memfd behind the slab (to share with local processes or register
    /// with a device). Offsets into it are slab offsets.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Address of the slab's first byte in this process.
    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Length in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Pool offset of the slab's first byte.
    pub fn start(&self) -> u64 {
        self.start
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        let len = usize::try_from(self.len).unwrap_or(0);
        // SAFETY: the mapping was created in `create` with this length; the
        // pool drops slabs only when no extent refers to them.
        if let Err(e) = unsafe { munmap(self.base.cast(), len) } {
            tracing::error!(error = %e, "cannot unmap slab");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whoever_gets_the_fd_cannot_resize_it() {
        let slab = Slab::create(0, 4 << 12, false).unwrap();
        // What a client that received the fd would try.
        let fd = slab.fd().try_clone_to_owned().unwrap();
        assert_eq!(nix::unistd::ftruncate(&fd, 0), Err(nix::Error::EPERM));
        assert_eq!(nix::unistd::ftruncate(&fd, 1 << 30), Err(nix::Error::EPERM));
        let seals = nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_ADD_SEALS(nix::fcntl::SealFlag::empty()),
        );
        assert_eq!(seals, Err(nix::Error::EPERM), "the seals are final");
        // The whole slab is still there for the agent.
        // SAFETY: the slab's own mapping, 4 pages long; nothing else uses it.
        unsafe {
            slab.base().add((4 << 12) - 1).write(7);
            assert_eq!(slab.base().add((4 << 12) - 1).read(), 7);
        }
    }
}
