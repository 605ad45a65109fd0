//! The receive low-water mark of a large receive: while the body of a
//! payload of megabytes comes in, the kernel wakes the receiving thread
//! once per [`WAKE_EVERY`] bytes queued instead of once per segment that
//! arrives (64 KiB on loopback), so a thread that catches up with its
//! sender sleeps and copies in large steps. Measured on the 2-core VM
//! (medians of five alternating runs): a 64 MiB copy on one connection
//! went from 4.70 to 5.20 GB/s (read) and 4.39 to 4.95 GB/s (write), a
//! 256 MiB read over four from 5.06 to 5.76 GB/s (`docs/benchmarks.md`,
//! "Waking the receiver once per MiB").
//!
//! It owns setting `SO_RCVLOWAT` and putting it back to 1; it never reads
//! or writes the socket's bytes ([`super::sock`] does).
//!
//! The mark must never ask for bytes the peer will not send: the kernel
//! wakes a sleeping receiver only once that many are queued. So a receive
//! goes in parts, each leaving at least the mark's worth of its payload
//! due after it, so the queue always reaches the mark once the peer has
//! sent what it owes; the mark halves as the payload's end nears, and the
//! last bytes are received with it back at 1. A peer that stops sending
//! early is cut by the socket's receive timeout, as before.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The most queued bytes that wake the receiver of a large payload.
pub const WAKE_EVERY: usize = 1 << 20;
/// The shortest receive that raises the mark. A shorter one is over in a
/// few hundred microseconds, and waiting for a mark's worth before the
/// first copy costs it more than the wake-ups saved (measured: 256 KiB to
/// 1 MiB copies were 5-20% slower with it, 4 MiB and longer faster).
pub const RAISE_FROM: usize = 4 * WAKE_EVERY;
/// Below twice this many bytes left, the rest is received with the mark
/// at 1: a few segments, not worth another system call.
const FLOOR: usize = 128 << 10;

/// The low-water mark of one socket for the span of one receive. Each
/// [`LowWater::step`] sets it for the next part; it is 1 again once the
/// receive's last part is asked for, or on drop (an error path).
pub struct LowWater<'a> {
    fd: BorrowedFd<'a>,
    /// Whether this receive is long enough to raise the mark at all.
    long: bool,
    /// The mark now set; 1 is the kernel's default.
    mark: usize,
}

impl<'a> LowWater<'a> {
    /// For one receive of `len` bytes on `fd`, the mark not yet touched;
    /// one shorter than [`RAISE_FROM`] never touches it.
    pub fn new(fd: BorrowedFd<'a>, len: usize) -> Self {
        Self {
            fd,
            long: len >= RAISE_FROM,
            mark: 1,
        }
    }

    /// With `rest` bytes of the payload still to come: sets the mark and
    /// returns how many bytes to receive under it. The mark is at most
    /// half of `rest` (a power of two, at most [`WAKE_EVERY`]) and the
    /// part leaves that many bytes due after it, so the queue always
    /// reaches the mark; near the end it is 1 and the part is all of
    /// `rest`. A socket that refuses the option gets the same parts with
    /// the mark at 1.
    ///
    /// # Errors
    /// The `setsockopt` that puts a raised mark back to 1 failed; the
    /// connection cannot serve small reads and its caller ends it.
    pub fn step(&mut self, rest: usize) -> io::Result<usize> {
        if self.long && rest >= 2 * FLOOR {
            let half = rest / 2;
            let mark = WAKE_EVERY.min(1 << half.ilog2());
            if mark == self.mark || set(self.fd, mark).is_ok() {
                self.mark = mark;
                return Ok(rest - mark);
            }
        }
        if self.mark != 1 {
            set(self.fd, 1)?;
            self.mark = 1;
        }
        Ok(rest)
    }
}

impl Drop for LowWater<'_> {
    fn drop(&mut self) {
        if self.mark != 1 {
            // An error path: the receive failed and the connection is
            // being ended; the mark goes back if the socket still takes it.
            let _ = set(self.fd, 1);
        }
    }
}

fn set(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: `v` is a live c_int for the call and its size is passed with
    // it; the kernel copies it in. `fd` is borrowed, so open.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            std::ptr::from_ref(&v).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
