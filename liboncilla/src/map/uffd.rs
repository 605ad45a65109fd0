//! The kernel's side of demand paging: a userfaultfd that reports the
//! faults of a registered range and fills, protects and wakes it.
//!
//! The calls are made with the kernel's own definitions
//! (`linux/userfaultfd.h`, a stable ABI of a dozen ioctls and one 32-byte
//! message) rather than the `userfaultfd` crate, whose -sys part runs
//! bindgen (libclang, kernel headers) at build time: the default build needs
//! only the Rust toolchain. What it must get right: creating the descriptor
//! so that it works for every privilege (`/dev/userfaultfd`, the system
//! call, then the user-mode-only system call); `UFFDIO_COPY` with
//! `UFFDIO_COPY_MODE_WP` (a fetched page arrives write-protected, so its
//! first write is seen, with no window in which a write could go unseen).
//! It owns the descriptor; it never decides what to fetch or when.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::error::{Error, Result};

const UFFD_API: u64 = 0xAA;
const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFDIO_COPY_MODE_WP: u64 = 1 << 1;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;
/// `struct uffd_msg`: event (u8), 7 reserved bytes, then for a page fault
/// flags (u64) and address (u64), padded to 32 bytes.
const MSG_LEN: usize = 32;
/// `USERFAULTFD_IOC_NEW`: `_IO(0xAA, 0x00)` on /dev/userfaultfd.
const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xAA00;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

nix::ioctl_readwrite!(uffdio_api, 0xAA, 0x3F, UffdioApi);
nix::ioctl_readwrite!(uffdio_register, 0xAA, 0x00, UffdioRegister);
// The kernel declares these two `_IOR` though it only reads the range.
nix::ioctl_read!(uffdio_unregister, 0xAA, 0x01, UffdioRange);
nix::ioctl_read!(uffdio_wake, 0xAA, 0x02, UffdioRange);
nix::ioctl_readwrite!(uffdio_writeprotect, 0xAA, 0x06, UffdioWriteprotect);
nix::ioctl_readwrite!(uffdio_copy, 0xAA, 0x03, UffdioCopy);

/// What to change so that this process may map remote memory.
const PRIVILEGE_HINT: &str = "mapping remote memory needs userfaultfd, which this process may not \
    use: give its user read-write access to /dev/userfaultfd, or set the sysctl \
    vm.unprivileged_userfaultfd=1, or grant it CAP_SYS_PTRACE";

/// A fault the kernel reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// A touch of a page not filled yet (`write`: by a write).
    Missing { addr: usize, write: bool },
    /// A write to a write-protected page.
    Protected { addr: usize },
}

/// A userfaultfd with write-protection.
pub(crate) struct Faults {
    fd: OwnedFd,
    /// Whether faults taken inside the kernel (a `read(2)` into the range)
    /// are reported too; a user-mode-only descriptor fails them (EFAULT).
    pub(crate) kernel_faults: bool,
}

impl Faults {
    /// Opens a non-blocking userfaultfd with write-protect faults, the most
    /// capable this process may have.
    ///
    /// # Errors
    /// [`Error::Map`] naming what to change where userfaultfd is not
    /// allowed, or where the kernel lacks what paging needs.
    pub(crate) fn open() -> Result<Self> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let (fd, kernel_faults) = match from_device(flags) {
            Ok(fd) => (fd, true),
            Err(_) => match syscall(flags) {
                Ok(fd) => (fd, true),
                Err(_) => (
                    syscall(flags | UFFD_USER_MODE_ONLY)
                        .map_err(|e| Error::Map(format!("{PRIVILEGE_HINT} ({e})")))?,
                    false,
                ),
            },
        };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_PAGEFAULT_FLAG_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API on a fresh userfaultfd with a struct of the
        // kernel's layout, which the kernel fills in.
        unsafe { uffdio_api(fd.as_raw_fd(), &mut api) }.map_err(|e| {
            Error::Map(format!(
                "this kernel's userfaultfd lacks write-protection ({e}): mapping remote memory \
                 needs Linux 5.7 or later"
            ))
        })?;
        Ok(Self { fd, kernel_faults })
    }

    /// Reports missing and write-protect faults of `[base, base + len)`.
    pub(crate) fn register(&self, base: *mut u8, len: usize) -> Result<()> {
        let mut register = UffdioRegister {
            range: range(base, len),
            mode: UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER of a range this process mapped (the
        // pager's region) with a struct of the kernel's layout.
        unsafe { uffdio_register(self.fd.as_raw_fd(), &mut register) }
            .map(|_| ())
            .map_err(|e| Error::Map(format!("cannot register the mapped range: {e}")))
    }

    pub(crate) fn unregister(&self, base: *mut u8, len: usize) -> Result<()> {
        let mut r = range(base, len);
        // SAFETY: UFFDIO_UNREGISTER of the range registered above.
        unsafe { uffdio_unregister(self.fd.as_raw_fd(), &mut r) }
            .map(|_| ())
            .map_err(|e| Error::Map(format!("cannot unregister the mapped range: {e}")))
    }

    /// Fills the missing pages `[dst, dst + len)` with `src`, write-protected
    /// unless `writable`, and wakes the threads waiting on them.
    ///
    /// # Safety
    /// `dst..dst + len` is page-aligned inside a registered range, and `src`
    /// is readable for `len` bytes.
    pub(crate) unsafe fn fill(
        &self,
        dst: *mut u8,
        src: *const u8,
        len: usize,
        writable: bool,
    ) -> Result<()> {
        let mut copy = UffdioCopy {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: if writable { 0 } else { UFFDIO_COPY_MODE_WP },
            copy: 0,
        };
        // SAFETY: the caller's contract; the kernel copies `len` bytes from
        // `src` into pages it allocates for the missing range.
        match unsafe { uffdio_copy(self.fd.as_raw_fd(), &mut copy) } {
            Ok(_) => Ok(()),
            // Already filled (a racing fill): the threads must still wake.
            Err(nix::errno::Errno::EEXIST) => self.wake(dst, len),
            Err(e) => Err(Error::Map(format!("cannot fill mapped pages: {e}"))),
        }
    }

    /// Write-protects `[start, start + len)`: the next write faults.
    pub(crate) fn protect(&self, start: *mut u8, len: usize) -> Result<()> {
        self.write_protect(start, len, UFFDIO_WRITEPROTECT_MODE_WP)
            .map_err(|e| Error::Map(format!("cannot write-protect mapped pages: {e}")))
    }

    /// Lifts the write-protection of `[start, start + len)` and wakes the
    /// writers waiting on it.
    pub(crate) fn unprotect(&self, start: *mut u8, len: usize) -> Result<()> {
        self.write_protect(start, len, 0)
            .map_err(|e| Error::Map(format!("cannot lift write-protection: {e}")))
    }

    fn write_protect(&self, start: *mut u8, len: usize, mode: u64) -> nix::Result<()> {
        let mut wp = UffdioWriteprotect {
            range: range(start, len),
            mode,
        };
        // SAFETY: UFFDIO_WRITEPROTECT of whole blocks of the registered
        // range; it changes page protections only (and wakes writers when
        // lifting, as mode 0 asks).
        unsafe { uffdio_writeprotect(self.fd.as_raw_fd(), &mut wp) }.map(|_| ())
    }

    /// Wakes the threads waiting on `[start, start + len)`; they retry.
    pub(crate) fn wake(&self, start: *mut u8, len: usize) -> Result<()> {
        let mut r = range(start, len);
        // SAFETY: UFFDIO_WAKE of a range of the registered region; it only
        // wakes threads waiting on faults there.
        unsafe { uffdio_wake(self.fd.as_raw_fd(), &mut r) }
            .map(|_| ())
            .map_err(|e| Error::Map(format!("cannot wake faulting threads: {e}")))
    }

    /// The faults waiting now (none when there are none: non-blocking).
    pub(crate) fn read(&self, buf: &mut [u8]) -> Result<Vec<Fault>> {
        let n = match nix::unistd::read(&self.fd, buf) {
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN) => 0,
            Err(e) => return Err(Error::Map(format!("cannot read page faults: {e}"))),
        };
        Ok(buf[..n - n % MSG_LEN]
            .chunks_exact(MSG_LEN)
            .filter_map(|msg| {
                // No other event was asked for (no fork, remap or remove
                // features).
                if msg[0] != UFFD_EVENT_PAGEFAULT {
                    return None;
                }
                let word = |at: usize| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&msg[at..at + 8]);
                    u64::from_ne_bytes(b)
                };
                let (flags, addr) = (word(8), usize::try_from(word(16)).ok()?);
                Some(if flags & UFFD_PAGEFAULT_FLAG_WP != 0 {
                    Fault::Protected { addr }
                } else {
                    Fault::Missing {
                        addr,
                        write: flags & UFFD_PAGEFAULT_FLAG_WRITE != 0,
                    }
                })
            })
            .collect())
    }
}

/// Bytes to read fault messages into: this many at a time.
pub(crate) fn message_buffer(messages: usize) -> Vec<u8> {
    vec![0u8; messages * MSG_LEN]
}

fn range(start: *mut u8, len: usize) -> UffdioRange {
    UffdioRange {
        start: start as u64,
        len: len as u64,
    }
}

impl AsFd for Faults {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A userfaultfd from /dev/userfaultfd (allowed by the device's permissions;
/// reports faults taken in the kernel too).
fn from_device(flags: libc::c_int) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/userfaultfd")?;
    // SAFETY: USERFAULTFD_IOC_NEW on the device takes the new descriptor's
    // flags by value and returns a new descriptor or -1.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW, flags) };
    owned(fd)
}

/// A userfaultfd from the system call.
fn syscall(flags: libc::c_int) -> std::io::Result<OwnedFd> {
    // SAFETY: userfaultfd(2) takes flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    owned(RawFd::try_from(fd).unwrap_or(-1))
}

fn owned(fd: RawFd) -> std::io::Result<OwnedFd> {
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned to us, owned by no one.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
