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
//! The receive mark must never ask for bytes the peer will not send: the kernel
//! wakes a sleeping receiver only once that many are queued. So a receive
//! goes in parts, each leaving at least the mark's worth of its payload
//! due after it, so the queue always reaches the mark once the peer has
//! sent what it owes; the mark halves as the payload's end nears, and the
//! last bytes are received with it back at 1. A peer that stops sending
//! early is cut by the socket's receive timeout and the transfer's
//! deadline, as before. Kernels before 5.11 do not wake a receiver below
//! its mark when the receive window closes first, so there the mark is
//! never raised. Over TLS the receive end is the tunnel's Unix socket,
//! which wakes its reader at every write whatever the mark. Measured on
//! loopback only: the kernel clamps the receive window to the mark while
//! the receive buffer is smaller than twice it, until its autotuning
//! grows the buffer, which a path with more than 1 MiB in flight may feel
//! at a connection's start.
//!
//! The send side has a mark of its own, set once on each connection an
//! agent accepts ([`limit_unsent`]): `TCP_NOTSENT_LOWAT` keeps at most
//! [`UNSENT_MAX`] bytes queued unsent, so the agent copies a read's
//! payload into the socket in steps the receiver takes while they are
//! still in cache, instead of filling megabytes of send buffer ahead of
//! it. It bounds only what waits to be sent, not what is in flight (the
//! congestion window and the send buffer still grow as the path needs).
//! Measured the same way: 64 MiB reads over four connections 5.79 to 6.41
//! GB/s, four clients at once 5.82 to 6.65. Set on the clients' sockets
//! too, it made one-connection writes a quarter slower (64 MiB: 4.82 to
//! 3.36 GB/s, not yet understood), so dialled sockets do not set it.
//!
//! It owns setting both marks and putting the receive mark back to 1; it
//! never reads or writes the socket's bytes ([`super::sock`] does).

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::OnceLock;

/// The most bytes a data socket keeps queued unsent before its sender
/// sleeps (`TCP_NOTSENT_LOWAT`).
pub const UNSENT_MAX: usize = 256 << 10;
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
            long: len >= RAISE_FROM && kernel_escapes_the_mark(),
            mark: 1,
        }
    }

    /// With `rest` bytes of the payload still to come: sets the mark and
    /// returns how many bytes to receive under it. The mark is at most
    /// half of `rest` (a power of two, at most [`WAKE_EVERY`]) and the
    /// part leaves that many bytes due after it, so the queue always
    /// reaches the mark; near the end it is 1 and the part is all of
    /// `rest`. A socket that refuses the option gets all of `rest` as one
    /// part, the mark at 1.
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

/// The first kernel that wakes a receiver below its mark when the
/// receive window closes first (skbs whose memory outweighs their bytes,
/// memory pressure): before it, such a receive slept until its timeout.
const ESCAPES_FROM: (u32, u32) = (5, 11);

/// Whether the running kernel is [`ESCAPES_FROM`] or later (read once).
fn kernel_escapes_the_mark() -> bool {
    static ESCAPES: OnceLock<bool> = OnceLock::new();
    *ESCAPES.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .and_then(|r| release(&r))
            .is_some_and(|v| v >= ESCAPES_FROM)
    })
}

/// `(major, minor)` of a kernel release such as `6.18.44-fc-v595`.
fn release(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Limits the bytes `tcp` keeps queued unsent to [`UNSENT_MAX`].
///
/// # Errors
/// The `setsockopt` error.
pub fn limit_unsent(tcp: &TcpStream) -> io::Result<()> {
    option(
        tcp.as_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_NOTSENT_LOWAT,
        UNSENT_MAX,
    )
}

fn set(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<()> {
    option(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, bytes)
}

fn option(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    bytes: usize,
) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: `v` is a live c_int for the call and its size is passed with
    // it; the kernel copies it in. `fd` is borrowed, so open.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
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

/// A socket option's value, for the tests of this module and of
/// [`super::sock`].
#[cfg(test)]
pub(crate) fn option_of(tcp: &TcpStream, level: libc::c_int, name: libc::c_int) -> libc::c_int {
    let mut v: libc::c_int = 0;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap();
    // SAFETY: `v` and `len` are live for the call and sized as passed.
    let rc = unsafe {
        libc::getsockopt(
            tcp.as_raw_fd(),
            level,
            name,
            std::ptr::from_mut(&mut v).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "{}", io::Error::last_os_error());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_parse_to_major_and_minor() {
        assert_eq!(release("6.18.44-fc-v595\n"), Some((6, 18)));
        assert_eq!(release("5.10.0-28-amd64"), Some((5, 10)));
        assert_eq!(release("4.18.0-553.el8_10.x86_64"), Some((4, 18)));
        assert_eq!(release("garbage"), None);
        assert!((5, 10) < ESCAPES_FROM && (6, 1) >= ESCAPES_FROM);
    }

    #[test]
    fn an_accepted_socket_keeps_a_quarter_mib_unsent_at_most() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        limit_unsent(&s).unwrap();
        let got = option_of(&s, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT);
        assert_eq!(usize::try_from(got).unwrap(), UNSENT_MAX);
    }

    #[test]
    fn the_receive_mark_steps_down_and_ends_at_one() {
        if !kernel_escapes_the_mark() {
            eprintln!("skipped: a kernel before 5.11 never raises the mark");
            return;
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let mark = |s: &TcpStream| option_of(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT);
        // Too short: never raised.
        let mut short = LowWater::new(s.as_fd(), RAISE_FROM - 1);
        assert_eq!(short.step(RAISE_FROM - 1).unwrap(), RAISE_FROM - 1);
        assert_eq!(mark(&s), 1);
        // Long: each part leaves the mark's worth due after it.
        let len = 4 * WAKE_EVERY;
        let mut w = LowWater::new(s.as_fd(), len);
        let (mut rest, mut marks) = (len, Vec::new());
        while rest > 0 {
            let part = w.step(rest).unwrap();
            let m = usize::try_from(mark(&s)).unwrap();
            assert!(
                m == 1 || rest - part >= m,
                "mark {m} with {} due after",
                rest - part
            );
            marks.push(m);
            rest -= part;
        }
        assert_eq!(marks.first(), Some(&WAKE_EVERY));
        assert_eq!(marks.last(), Some(&1));
        assert!(marks.windows(2).all(|p| p[1] <= p[0]), "{marks:?}");
    }
}
