//! Blocking socket primitives both ends of the TCP data protocol use: a
//! vectored send that puts a header and its payload in one system call
//! ([`send`]), and a receive buffer that lets a small reply (header and
//! data) arrive with one `recv` while large payloads go straight into
//! their destination ([`RecvBuf`]).
//!
//! The API is safe: payloads are borrowed slices, or [`Shared`] ranges for
//! memory that other connections may touch at the same time (pool memory),
//! to which no Rust reference is ever made; the system calls and their
//! raw pointers stay inside this module. It knows nothing of requests or
//! replies: [`super`] gives the bytes their meaning.

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;

use super::lowat::LowWater;

/// When a whole transfer must be over, whatever progress it makes: a peer
/// that reads (or sends) a few bytes now and then restarts the socket's
/// own timeout each time, so only this bounds how long it can hold the
/// memory the transfer names. `base` is the socket's timeout to return to
/// after a slow transfer shortened it. A transfer is held to it from its
/// first call that came back short; one cut to a caller's own budget
/// ([`Deadline::cut_to`], `from_first`) from its first call.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    pub at: Instant,
    pub base: Duration,
    /// Held from the first call: the deadline was cut nearer than the
    /// transfer's own, maybe nearer than the socket's timeout.
    pub from_first: bool,
}

/// The slowest a transfer's bytes may move once they start (1 MiB/s): a
/// peer that reads or sends a little now and then restarts the socket's
/// stall timeout each time, so every transfer also gets a whole deadline
/// of the stall time plus its length at this rate.
pub const MIN_RATE: u64 = 1 << 20;

impl Deadline {
    /// For a transfer of `len` bytes on a socket whose timeouts are
    /// `stall`: `stall` plus `len` at [`MIN_RATE`] from now.
    pub fn for_transfer(len: usize, stall: Duration) -> Self {
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        Self {
            at: Instant::now() + stall + Duration::from_millis(len / (MIN_RATE / 1000)),
            base: stall,
            from_first: false,
        }
    }

    /// This deadline, or `by` where that is sooner: then every call of the
    /// transfer is held to it, the first included, so a budget nearer than
    /// the socket's timeout is kept.
    #[must_use]
    pub fn cut_to(self, by: Instant) -> Self {
        if by < self.at {
            Self {
                at: by,
                from_first: true,
                ..self
            }
        } else {
            self
        }
    }
}

/// Which of the socket's timeouts a slow transfer shortens.
#[derive(Clone, Copy)]
enum Direction {
    Send,
    Receive,
}

/// On the slow path only (a `sendmsg` or `recv` that returned short, or a
/// deadline cut to a caller's budget): `TimedOut` once `deadline`
/// has passed, else the socket's timeout for `dir` cut to the time left
/// (at most its own), so the next call cannot outlive it.
fn shorten(fd: BorrowedFd<'_>, dir: Direction, deadline: &Deadline) -> io::Result<()> {
    let left = deadline.at.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "transfer deadline passed: the peer is too slow",
        ));
    }
    // Never longer than the socket's own timeout either: a peer that
    // stalls is still found out after `base`.
    set_timeout(
        fd,
        dir,
        left.min(deadline.base).max(Duration::from_millis(1)),
    )
}

fn set_timeout(fd: BorrowedFd<'_>, dir: Direction, t: Duration) -> io::Result<()> {
    // A zero timeval would mean "wait for ever".
    let t = t.max(Duration::from_micros(1));
    let tv = TimeVal::new(
        i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
        i64::from(t.subsec_micros()),
    );
    match dir {
        Direction::Send => setsockopt(&fd, sockopt::SendTimeout, &tv),
        Direction::Receive => setsockopt(&fd, sockopt::ReceiveTimeout, &tv),
    }
    .map_err(io::Error::from)
}

/// Memory that others (threads of this process, other processes) may read
/// or write while a transfer runs, pool memory above all: it is moved
/// through its raw range and never seen through a Rust reference.
#[derive(Debug, Clone, Copy)]
pub struct Shared<'a> {
    ptr: *mut u8,
    len: usize,
    _memory: PhantomData<&'a mut [u8]>,
}

impl Shared<'_> {
    /// The `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be mapped, readable and writable memory
    /// that stays so for the lifetime of the value, and no Rust reference
    /// to any of it may be used while a transfer through the value runs
    /// (anyone else touches it through raw pointers only).
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        Self {
            ptr,
            len,
            _memory: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes from `at`, or `None` when they are not all inside.
    pub fn part(&self, at: usize, len: usize) -> Option<Self> {
        if at.checked_add(len)? > self.len {
            return None;
        }
        Some(Self {
            // SAFETY: `at + len <= self.len`, so the result lies inside the
            // range `new`'s caller vouched for, for the same lifetime.
            ptr: unsafe { self.ptr.add(at) },
            len,
            _memory: PhantomData,
        })
    }
}

/// What a send carries after its header.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// Bytes borrowed for the send.
    Bytes(&'a [u8]),
    /// Shared memory (see [`Shared`]).
    Shared(Shared<'a>),
}

impl<'a> From<&'a [u8]> for Payload<'a> {
    fn from(b: &'a [u8]) -> Self {
        Payload::Bytes(b)
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for Payload<'a> {
    fn from(b: &'a [u8; N]) -> Self {
        Payload::Bytes(b)
    }
}

impl<'a> From<&'a Vec<u8>> for Payload<'a> {
    fn from(b: &'a Vec<u8>) -> Self {
        Payload::Bytes(b)
    }
}

impl<'a> From<Shared<'a>> for Payload<'a> {
    fn from(s: Shared<'a>) -> Self {
        Payload::Shared(s)
    }
}

/// Sends `head` and then `body`, every byte, in as few `sendmsg` calls as
/// the kernel allows (one, normally), with `MSG_NOSIGNAL` (a closed peer is
/// an error, never a `SIGPIPE` in the host process).
///
/// # Errors
/// I/O errors; `WriteZero` when the kernel takes nothing.
pub fn send<'a>(fd: impl AsFd, head: &[u8], body: impl Into<Payload<'a>>) -> io::Result<()> {
    send_inner(fd.as_fd(), head, body.into(), None)
}

/// [`send`], all of it by `deadline` (see [`Deadline`]).
///
/// # Errors
/// As [`send`]; `TimedOut` past the deadline.
pub fn send_by<'a>(
    fd: impl AsFd,
    head: &[u8],
    body: impl Into<Payload<'a>>,
    deadline: Deadline,
) -> io::Result<()> {
    send_inner(fd.as_fd(), head, body.into(), Some(deadline))
}

fn send_inner(
    fd: BorrowedFd<'_>,
    head: &[u8],
    body: Payload<'_>,
    deadline: Option<Deadline>,
) -> io::Result<()> {
    let (ptr, len) = match body {
        Payload::Bytes(b) => (b.as_ptr(), b.len()),
        Payload::Shared(s) => (s.ptr.cast_const(), s.len),
    };
    let mut iov = [iovec(head.as_ptr(), head.len()), iovec(ptr, len)];
    // SAFETY: `head` and a `Bytes` body are borrowed for the whole call; a
    // `Shared` body's range stays mapped for its lifetime, which outlives
    // the call (its constructor's contract). The kernel only reads them.
    unsafe { send_all(fd, &mut iov, deadline) }
}

/// Sends every byte described by `iov`, in order, with `MSG_NOSIGNAL`, by
/// `deadline` if there is one. `iov` is advanced in place as bytes go out.
///
/// # Safety
/// Every `iov_base..iov_base + iov_len` must stay readable until this returns.
unsafe fn send_all(
    fd: BorrowedFd<'_>,
    iov: &mut [libc::iovec],
    deadline: Option<Deadline>,
) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    let mut first = 0;
    let mut shortened = false;
    let mut calls = 0u32;
    let near = deadline.is_some_and(|d| d.from_first);
    while first < iov.len() {
        if iov[first].iov_len == 0 {
            first += 1;
            continue;
        }
        if let (true, Some(d)) = (calls > 0 || near, &deadline) {
            // The last call came back short (a slow reader), or the
            // deadline was cut to a caller's budget: from here on no call
            // may outlive the deadline.
            shorten(fd, Direction::Send, d)?;
            shortened = true;
        }
        calls += 1;
        let rest = &mut iov[first..];
        // SAFETY: a zeroed msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = rest.as_mut_ptr();
        msg.msg_iovlen = rest.len() as _;
        // SAFETY: `msg` points at `rest`, whose ranges the caller keeps
        // readable; the kernel only reads them.
        let n = unsafe { libc::sendmsg(raw, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let mut n = n.unsigned_abs();
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let v = &mut iov[first];
            let step = n.min(v.iov_len);
            // SAFETY: `step <= iov_len`, so the new base stays inside (or
            // one past the end of) the caller's range.
            v.iov_base = unsafe { v.iov_base.cast::<u8>().add(step) }.cast();
            v.iov_len -= step;
            n -= step;
            if v.iov_len == 0 {
                first += 1;
            }
        }
    }
    if let (true, Some(d)) = (shortened, deadline) {
        set_timeout(fd, Direction::Send, d.base)?;
    }
    Ok(())
}

/// An `iovec` over `len` bytes at `ptr`, for [`send_all`].
fn iovec(ptr: *const u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: ptr.cast_mut().cast(),
        iov_len: len,
    }
}

/// A receive buffer for one connection. Headers are read through it, asking
/// the kernel for as much as the caller knows belongs to the current
/// message (`hint`), so a small reply is one system call; bytes that arrive
/// early stay here for the next read. Payloads larger than what is buffered
/// are received straight into their destination.
pub struct RecvBuf {
    buf: Box<[u8]>,
    lo: usize,
    hi: usize,
}

impl RecvBuf {
    /// A buffer that can hold `cap` bytes ahead.
    pub fn new(cap: usize) -> Self {
        Self {
            buf: vec![0; cap].into_boxed_slice(),
            lo: 0,
            hi: 0,
        }
    }

    /// Bytes received but not yet consumed.
    pub fn buffered(&self) -> usize {
        self.hi - self.lo
    }

    /// Reads exactly `N` bytes (a header), asking the kernel for up to
    /// `hint` bytes in all when it has to ask (`hint` is clamped to `N` and
    /// to the buffer's size).
    ///
    /// # Errors
    /// I/O errors; `UnexpectedEof` when the peer closes first.
    pub fn header<const N: usize>(&mut self, fd: impl AsFd, hint: usize) -> io::Result<[u8; N]> {
        let fd = fd.as_fd().as_raw_fd();
        if self.buffered() < N {
            if self.lo == self.hi {
                self.lo = 0;
                self.hi = 0;
            } else if self.buf.len() - self.lo < hint.max(N) {
                self.buf.copy_within(self.lo..self.hi, 0);
                self.hi -= self.lo;
                self.lo = 0;
            }
            let want = (self.lo + hint.max(N)).min(self.buf.len());
            while self.hi - self.lo < N {
                let room = &mut self.buf[self.hi..want];
                // SAFETY: `room` is a live, writable slice of our buffer.
                let n =
                    retry(|| unsafe { libc::recv(fd, room.as_mut_ptr().cast(), room.len(), 0) })?;
                self.hi += n;
            }
        }
        let mut head = [0u8; N];
        head.copy_from_slice(&self.buf[self.lo..self.lo + N]);
        self.lo += N;
        Ok(head)
    }

    /// Receives exactly `dst.len()` bytes into shared memory `dst`: what is
    /// buffered first, the rest straight from the socket.
    ///
    /// # Errors
    /// I/O errors; `UnexpectedEof` when the peer closes first.
    pub fn read_into(&mut self, fd: impl AsFd, dst: Shared<'_>) -> io::Result<()> {
        // SAFETY: `dst`'s range is writable and referenced by no Rust
        // reference for its lifetime, which outlives this call (its
        // constructor's contract).
        unsafe { self.read_raw(fd.as_fd(), dst.ptr, dst.len, None) }
    }

    /// [`RecvBuf::read_into`], all of it by `deadline` (see [`Deadline`]).
    ///
    /// # Errors
    /// As [`RecvBuf::read_into`]; `TimedOut` past the deadline.
    pub fn read_into_by(
        &mut self,
        fd: impl AsFd,
        dst: Shared<'_>,
        deadline: Deadline,
    ) -> io::Result<()> {
        // SAFETY: as in `read_into`.
        unsafe { self.read_raw(fd.as_fd(), dst.ptr, dst.len, Some(deadline)) }
    }

    /// Receives exactly `len` bytes into `ptr`: what is buffered first,
    /// the rest straight from the socket.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay writable, and not be read or written
    /// through any Rust reference, until this returns.
    unsafe fn read_raw(
        &mut self,
        fd: BorrowedFd<'_>,
        ptr: *mut u8,
        len: usize,
        deadline: Option<Deadline>,
    ) -> io::Result<()> {
        let raw = fd.as_raw_fd();
        let from_buf = self.buffered().min(len);
        // SAFETY: the source is initialised buffer bytes, the destination
        // the caller's writable range; they cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.buf[self.lo..].as_ptr(), ptr, from_buf) };
        self.lo += from_buf;
        let mut done = from_buf;
        let mut calls = 0u32;
        let near = deadline.is_some_and(|d| d.from_first);
        let mut shortened = false;
        // In parts, the receiver woken once per MiB queued where the
        // payload is long enough (see [`LowWater`]).
        let mut mark = LowWater::new(fd, len - done);
        let mut stop = done;
        while done < len {
            if done == stop {
                stop = done + mark.step(len - done)?;
            }
            if let (true, Some(d)) = (calls > 0 || near, &deadline) {
                // A call came back short (a slow sender), a part ended, or
                // the deadline was cut to a caller's budget: from here on
                // no call may outlive the deadline.
                shorten(fd, Direction::Receive, d)?;
                shortened = true;
            }
            calls += 1;
            // SAFETY: `done < stop <= len`, so the range is inside the
            // caller's.
            done += retry(|| unsafe {
                libc::recv(raw, ptr.add(done).cast(), stop - done, libc::MSG_WAITALL)
            })?;
        }
        if let (true, Some(d)) = (shortened, deadline) {
            set_timeout(fd, Direction::Receive, d.base)?;
        }
        Ok(())
    }

    /// Receives exactly `dst.len()` bytes into `dst`.
    ///
    /// # Errors
    /// As [`RecvBuf::read_into`].
    pub fn read_exact(&mut self, fd: impl AsFd, dst: &mut [u8]) -> io::Result<()> {
        // SAFETY: `dst` is an exclusive borrow for the whole call.
        unsafe { self.read_raw(fd.as_fd(), dst.as_mut_ptr(), dst.len(), None) }
    }

    /// [`RecvBuf::read_exact`], all of it by `deadline` (see [`Deadline`]).
    ///
    /// # Errors
    /// As [`RecvBuf::read_exact`]; `TimedOut` past the deadline.
    pub fn read_exact_by(
        &mut self,
        fd: impl AsFd,
        dst: &mut [u8],
        deadline: Deadline,
    ) -> io::Result<()> {
        // SAFETY: `dst` is an exclusive borrow for the whole call.
        unsafe { self.read_raw(fd.as_fd(), dst.as_mut_ptr(), dst.len(), Some(deadline)) }
    }

    /// Consumes and drops `len` bytes.
    ///
    /// # Errors
    /// As [`RecvBuf::read_into`].
    pub fn skip(&mut self, fd: impl AsFd, mut len: u64) -> io::Result<()> {
        let fd = fd.as_fd();
        let mut sink = [0u8; 8192];
        while len > 0 {
            let n = usize::try_from(len).unwrap_or(usize::MAX).min(sink.len());
            self.read_exact(fd, &mut sink[..n])?;
            len -= n as u64;
        }
        Ok(())
    }
}

/// Runs a `recv` until it moves something, retrying on `EINTR`; 0 bytes
/// (the peer closed) is `UnexpectedEof`.
fn retry(mut op: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let n = op();
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        return Ok(n.unsigned_abs());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_trickling_reader_cannot_stretch_a_send_past_its_deadline() {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_write_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        // The reader takes a few bytes every 100 ms: each restarts the
        // socket's own timeout.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                use std::io::Read;
                let mut b = b;
                let mut buf = [0u8; 64];
                let until = Instant::now() + Duration::from_secs(5);
                while Instant::now() < until && !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(100));
                    if matches!(b.read(&mut buf), Ok(0) | Err(_)) {
                        break;
                    }
                }
            })
        };
        let body = vec![7u8; 8 << 20];
        let started = Instant::now();
        let d = Deadline {
            at: started + Duration::from_millis(800),
            base: Duration::from_millis(300),
            from_first: false,
        };
        let err = send_by(&a, b"head", &body, d).unwrap_err();
        let took = started.elapsed();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{err}"
        );
        assert!(took < Duration::from_millis(1500), "took {took:?}");
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        reader.join().unwrap();
    }

    #[test]
    fn small_messages_come_through_the_buffer_and_leftovers_stay() {
        let (mut a, b) = UnixStream::pair().unwrap();
        // Two messages at once: header 4 + body 3, header 4 + body 2.
        a.write_all(b"HEAD123HDR2xy").unwrap();
        let mut r = RecvBuf::new(64);
        let fd = &b;
        let h: [u8; 4] = r.header(fd, 64).unwrap();
        assert_eq!(&h, b"HEAD");
        let mut body = [0u8; 3];
        r.read_exact(fd, &mut body).unwrap();
        assert_eq!(&body, b"123");
        let h: [u8; 4] = r.header(fd, 4).unwrap();
        assert_eq!(&h, b"HDR2");
        let mut body = [0u8; 2];
        r.read_exact(fd, &mut body).unwrap();
        assert_eq!(&body, b"xy");
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn large_payloads_bypass_the_buffer() {
        let (a, b) = UnixStream::pair().unwrap();
        let payload: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let sent = payload.clone();
        let writer = std::thread::spawn(move || {
            let head = *b"HDR!";
            send(&a, &head, &sent).unwrap();
        });
        let mut r = RecvBuf::new(16);
        let fd = &b;
        let h: [u8; 4] = r.header(fd, 16).unwrap();
        assert_eq!(&h, b"HDR!");
        let mut got = vec![0u8; payload.len()];
        r.read_exact(fd, &mut got).unwrap();
        assert_eq!(got, payload);
        writer.join().unwrap();
    }

    #[test]
    fn a_closed_peer_is_eof() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        let mut r = RecvBuf::new(16);
        let e = r.header::<4>(&b, 4).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn shared_memory_goes_out_and_comes_in_without_references() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut src = vec![7u8; 100_000];
        let mut dst = vec![0u8; 100_000];
        let writer = std::thread::spawn(move || {
            // SAFETY: `src` lives (and is touched by nothing else) until
            // the send returns.
            let body = unsafe { Shared::new(src.as_mut_ptr(), src.len()) };
            send(&a, b"HEAD", body).unwrap();
        });
        let mut r = RecvBuf::new(16);
        let h: [u8; 4] = r.header(&b, 16).unwrap();
        assert_eq!(&h, b"HEAD");
        // SAFETY: `dst` lives, and is referenced by nothing, until the
        // receive returns.
        let into = unsafe { Shared::new(dst.as_mut_ptr(), dst.len()) };
        assert_eq!(into.len(), 100_000);
        r.read_into(&b, into).unwrap();
        writer.join().unwrap();
        assert!(dst.iter().all(|&x| x == 7));
    }

    const RECV_TIMEOUT: Duration = Duration::from_secs(20);

    /// A connected loopback TCP pair, the receiving end's timeout set so a
    /// receive that would hang fails instead.
    fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        b.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
        (a, b)
    }

    fn low_water_mark(s: &std::net::TcpStream) -> libc::c_int {
        super::super::lowat::option_of(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT)
    }

    /// A receive cut short by a timeout or its deadline, its socket's mark
    /// back at 1.
    fn assert_cut(err: &io::Error, s: &std::net::TcpStream) {
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{err}"
        );
        assert_eq!(low_water_mark(s), 1, "the mark stayed raised");
    }

    #[test]
    fn a_large_payload_in_uneven_pieces_comes_whole_and_the_mark_goes_back() {
        let (mut a, b) = tcp_pair();
        let len = 5 * super::super::lowat::WAKE_EVERY + 12_345;
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let sent = payload.clone();
        let writer = std::thread::spawn(move || {
            // Uneven pieces, then a pause before the last 100,000 bytes:
            // the receiver sleeps with less than a mark's worth due, which
            // it must receive with the mark back at 1 or never wake.
            let (most, tail) = sent.split_at(sent.len() - 100_000);
            for piece in most.chunks(700_001) {
                a.write_all(piece).unwrap();
            }
            std::thread::sleep(Duration::from_millis(200));
            a.write_all(tail).unwrap();
            a.write_all(b"NEXT").unwrap();
            a
        });
        let mut r = RecvBuf::new(16);
        let mut got = vec![0u8; len];
        let started = Instant::now();
        r.read_exact(&b, &mut got).unwrap();
        // Only sleeping through the socket's timeout takes this long: the
        // tail was received with the mark still raised.
        assert!(
            started.elapsed() < RECV_TIMEOUT,
            "woken by the receive timeout, not by the data"
        );
        assert!(got == payload, "the payload came back changed");
        assert_eq!(low_water_mark(&b), 1, "the mark stayed raised");
        // The next small message is read at once, not held for a MiB.
        let next: [u8; 4] = r.header(&b, 4).unwrap();
        assert_eq!(&next, b"NEXT");
        drop(writer.join().unwrap());
    }

    #[test]
    fn a_sender_that_stops_inside_a_large_payload_is_cut_by_the_socket_timeout() {
        let (mut a, b) = tcp_pair();
        b.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mark = super::super::lowat::WAKE_EVERY;
        // 3 MiB of a 4 MiB payload, then nothing, the connection open.
        a.write_all(&vec![1u8; 3 * mark]).unwrap();
        let mut r = RecvBuf::new(16);
        let mut got = vec![0u8; 4 * mark];
        let started = Instant::now();
        let d = Deadline {
            at: started + Duration::from_millis(800),
            base: Duration::from_millis(300),
            from_first: false,
        };
        let err = r.read_exact_by(&b, &mut got, d).unwrap_err();
        assert_cut(&err, &b);
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(a);
    }

    #[test]
    fn a_deadline_nearer_than_the_socket_timeout_holds_from_the_first_call() {
        // A silent peer and a socket that waits a minute: a deadline cut
        // to 200 ms (a caller's own budget) must end the very first call,
        // not the socket's minute.
        let (_a, b) = tcp_pair();
        let base = Duration::from_secs(60);
        b.set_read_timeout(Some(base)).unwrap();
        let mut r = RecvBuf::new(16);
        let mut got = vec![0u8; 4096];
        let started = Instant::now();
        let d = Deadline::for_transfer(0, base).cut_to(started + Duration::from_millis(200));
        assert!(d.from_first);
        let err = r.read_exact_by(&b, &mut got, d).unwrap_err();
        assert_cut(&err, &b);
        assert!(
            started.elapsed() < base / 2,
            "the first call waited out the socket's timeout"
        );
    }

    #[test]
    fn a_sender_that_pauses_between_parts_is_cut_by_the_deadline() {
        // Each piece lands before the socket's own timeout, and fills one
        // of the receive's parts exactly, so no call comes back short:
        // only the whole deadline can end it, long before the sender is
        // done (it needs more than 3 s).
        let (mut a, b) = tcp_pair();
        let base = Duration::from_secs(1);
        b.set_read_timeout(Some(base)).unwrap();
        let mark = super::super::lowat::WAKE_EVERY;
        let pieces = [3 * mark, mark / 2, mark / 4, mark / 8, mark / 8];
        let total: usize = pieces.iter().sum();
        let writer = std::thread::spawn(move || {
            for (i, n) in pieces.into_iter().enumerate() {
                if i > 0 {
                    std::thread::sleep(Duration::from_millis(800));
                }
                if a.write_all(&vec![3u8; n]).is_err() {
                    break;
                }
            }
        });
        let mut r = RecvBuf::new(16);
        let mut got = vec![0u8; total];
        let d = Deadline {
            at: Instant::now() + Duration::from_millis(1200),
            base,
            from_first: false,
        };
        let err = r.read_exact_by(&b, &mut got, d).unwrap_err();
        assert_cut(&err, &b);
        drop(b);
        writer.join().unwrap();
    }
}
