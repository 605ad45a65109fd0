//! One memfd of pool memory (a *file*): created sealed against resizing,
//! mapped by the pool into its own address range (populated and locked),
//! and punched when pages it holds are given up.
//!
//! A file is what a same-node process receives to map an allocation, so
//! what one file holds decides what a process can see: the pool
//! ([`super::carve`]) gives a process only files that back nothing but the
//! allocation it asked for. A file is *owned* while it backs (part of) one
//! allocation, and *shared* once it was handed to a process: a shared
//! file never backs anything else again. This module never decides which
//! file backs which range and never hands files out.

use std::ffi::CString;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use nix::fcntl::{fallocate, FallocateFlags};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mlock, mmap, MapFlags, ProtFlags};

/// Which step of making or using a file failed.
#[derive(Debug)]
pub enum FileError {
    Memfd(nix::Error),
    Truncate(nix::Error),
    Seal(nix::Error),
    Map(nix::Error),
    Lock(nix::Error),
}

/// Memory files open in this process: each holds a descriptor, and the
/// open-file limit is the process's.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// How many memory files this process holds open now.
pub fn open_files() -> usize {
    OPEN.load(Ordering::Relaxed)
}

/// A sealed memfd of pool memory.
pub struct MemFile {
    fd: OwnedFd,
    len: u64,
    /// Set while the file backs (part of) one allocation and nothing else.
    owned: AtomicBool,
    /// Set once the file was handed to a process: it then stays owned.
    shared: AtomicBool,
    /// Runs of it that extents nobody may map hold while the rest stays
    /// free memory's ([`Self::lend`]): while any is out, no allocation may
    /// take the whole file.
    lent: AtomicUsize,
}

impl MemFile {
    /// A memfd of `len` bytes (a multiple of the page size in use), huge
    /// pages if `huge`, sealed against shrinking and growing (and further
    /// sealing) before anyone else can see it: a process it is shared with
    /// can map it but never truncate it, so no access of the agent's can
    /// fault (SIGBUS) because of what a client did to the file.
    pub fn create(len: u64, huge: bool) -> Result<Self, FileError> {
        let name =
            CString::new("oncilla-pool").map_err(|_| FileError::Memfd(nix::Error::EINVAL))?;
        let mut flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
        if huge {
            flags |= MFdFlags::MFD_HUGETLB;
        }
        let fd = memfd_create(name.as_c_str(), flags).map_err(FileError::Memfd)?;
        let size = i64::try_from(len).map_err(|_| FileError::Truncate(nix::Error::EFBIG))?;
        nix::unistd::ftruncate(&fd, size).map_err(FileError::Truncate)?;
        nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_ADD_SEALS(
                nix::fcntl::SealFlag::F_SEAL_SHRINK
                    | nix::fcntl::SealFlag::F_SEAL_GROW
                    | nix::fcntl::SealFlag::F_SEAL_SEAL,
            ),
        )
        .map_err(FileError::Seal)?;
        OPEN.fetch_add(1, Ordering::Relaxed);
        Ok(Self {
            fd,
            len,
            owned: AtomicBool::new(false),
            shared: AtomicBool::new(false),
            lent: AtomicUsize::new(0),
        })
    }

    /// The memfd, to share with a local process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Length in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file backs an allocation, and nothing else.
    pub fn owned(&self) -> bool {
        self.owned.load(Ordering::Acquire)
    }

    /// Marks the file as backing one allocation.
    pub fn own(&self) {
        self.owned.store(true, Ordering::Release);
    }

    /// Marks a freed allocation's file, never handed out, as free memory's
    /// again (its bytes zeroed by the caller).
    pub fn disown(&self) {
        if !self.shared() {
            self.owned.store(false, Ordering::Release);
        }
    }

    /// Whether runs of the file are lent to extents ([`Self::lend`]).
    pub fn lent(&self) -> bool {
        self.lent.load(Ordering::Acquire) > 0
    }

    /// Lends a run of the file to an extent nobody may map: the file keeps
    /// backing free memory around it and is never handed to a process.
    pub fn lend(&self) {
        self.lent.fetch_add(1, Ordering::AcqRel);
    }

    /// A lent run came back (zeroed by the caller) as free memory.
    pub fn returned(&self) {
        let _ = self
            .lent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Whether the file was ever handed to a process.
    pub fn shared(&self) -> bool {
        self.shared.load(Ordering::Acquire)
    }

    /// Marks the file as handed to a process (before it is sent): it will
    /// never back anything but its allocation.
    pub fn share(&self) {
        self.shared.store(true, Ordering::Release);
    }

    /// Maps `[file_off, file_off + len)` of the file at `addr`, replacing
    /// whatever was mapped there, shared, populated and locked.
    ///
    /// # Safety
    /// `[addr, addr + len)` must lie inside an address range the caller
    /// owns (a [`super::slab::Slab`]), page-aligned, and nothing may access
    /// it during the call; `file_off` and `len` are page multiples within
    /// the file.
    pub unsafe fn map_at(
        &self,
        addr: NonNull<u8>,
        file_off: u64,
        len: u64,
    ) -> Result<(), FileError> {
        let size = usize::try_from(len)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or(FileError::Map(nix::Error::EINVAL))?;
        let off = i64::try_from(file_off).map_err(|_| FileError::Map(nix::Error::EINVAL))?;
        let at =
            NonZeroUsize::new(addr.as_ptr() as usize).ok_or(FileError::Map(nix::Error::EINVAL))?;
        // SAFETY: the caller owns [addr, addr + len) and nothing accesses
        // it now, so MAP_FIXED replaces only memory nobody is using; the
        // mapping aliases no Rust object (pool memory moves by raw pointer).
        let mapped = unsafe {
            mmap(
                Some(at),
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_FIXED | MapFlags::MAP_POPULATE,
                &self.fd,
                off,
            )
        };
        let ptr = match mapped {
            Ok(p) => p,
            Err(e) => {
                // A failed MAP_FIXED may have unmapped the range already:
                // reserve it again, so nothing else can be mapped there.
                // SAFETY: the same range the caller owns, inaccessible.
                let _ = unsafe {
                    nix::sys::mman::mmap_anonymous(
                        Some(at),
                        size,
                        ProtFlags::PROT_NONE,
                        MapFlags::MAP_PRIVATE | MapFlags::MAP_FIXED | MapFlags::MAP_NORESERVE,
                    )
                };
                return Err(FileError::Map(e));
            }
        };
        // SAFETY: `ptr`/`size` describe the mapping just made.
        unsafe { mlock(ptr, size.get()) }.map_err(FileError::Lock)
    }

    /// A new file of `len` bytes mapped whole at `addr` (see
    /// [`MemFile::map_at`]), as the run that backs that range.
    ///
    /// # Safety
    /// As [`MemFile::map_at`] for `[addr, addr + len)`.
    pub unsafe fn create_at(len: u64, huge: bool, addr: NonNull<u8>) -> Result<Part, FileError> {
        let file = Self::create(len, huge)?;
        // SAFETY: the caller's contract is map_at's.
        unsafe { file.map_at(addr, 0, len) }?;
        Ok(Part::whole(file))
    }

    /// Gives up the pages of `[file_off, file_off + len)`: every process
    /// that maps them, the agent included, sees zeros there from now on
    /// (and a write puts a fresh page in this file, nowhere else).
    pub fn punch(&self, file_off: u64, len: u64) {
        let (Ok(off), Ok(n)) = (i64::try_from(file_off), i64::try_from(len)) else {
            return;
        };
        if let Err(e) = fallocate(
            &self.fd,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            off,
            n,
        ) {
            // The pages stay allocated in a file nobody else will use:
            // memory lost until the file closes, never a leak of bytes.
            tracing::warn!(error = %e, file_off, len, "cannot release pool pages");
        }
    }
}

impl Drop for MemFile {
    fn drop(&mut self) {
        // The descriptor closes as `fd` drops, right after this.
        OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A run of one file: `len` bytes from `file_off`.
#[derive(Clone)]
pub struct Part {
    pub file: std::sync::Arc<MemFile>,
    pub file_off: u64,
    pub len: u64,
}

impl Part {
    /// All of `file`.
    pub fn whole(file: MemFile) -> Self {
        let len = file.len();
        Self {
            file: std::sync::Arc::new(file),
            file_off: 0,
            len,
        }
    }
}

impl std::fmt::Debug for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Part({:p}+{:#x}, {:#x})",
            self.file, self.file_off, self.len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whoever_gets_the_fd_cannot_resize_it() {
        let file = MemFile::create(4 << 12, false).unwrap();
        // What a client that received the fd would try.
        let fd = file.fd().try_clone_to_owned().unwrap();
        assert_eq!(nix::unistd::ftruncate(&fd, 0), Err(nix::Error::EPERM));
        assert_eq!(nix::unistd::ftruncate(&fd, 1 << 30), Err(nix::Error::EPERM));
        let seals = nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_ADD_SEALS(nix::fcntl::SealFlag::empty()),
        );
        assert_eq!(seals, Err(nix::Error::EPERM), "the seals are final");
    }
}
