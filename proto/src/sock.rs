//! Blocking socket primitives both ends of the TCP data protocol use: a
//! vectored send that puts a header and its payload in one system call, and
//! a receive buffer that lets a small reply (header and data) arrive with
//! one `recv` while large payloads go straight into their destination.
//!
//! Everything moves through raw pointers because one side of most transfers
//! is pool memory that other connections may touch at the same time: no
//! Rust reference is ever made to it. This module knows nothing of requests
//! or replies; `wire` gives the bytes their meaning.

use std::io;
use std::os::fd::RawFd;

/// Sends every byte described by `iov`, in order, with `MSG_NOSIGNAL` (a
/// closed peer is an error, never a `SIGPIPE` in the host process). `iov`
/// is advanced in place as bytes go out.
///
/// # Safety
/// Every `iov_base..iov_base + iov_len` must stay readable until this returns.
pub unsafe fn send_all(fd: RawFd, iov: &mut [libc::iovec]) -> io::Result<()> {
    let mut first = 0;
    while first < iov.len() {
        if iov[first].iov_len == 0 {
            first += 1;
            continue;
        }
        let rest = &mut iov[first..];
        // SAFETY: a zeroed msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = rest.as_mut_ptr();
        msg.msg_iovlen = rest.len() as _;
        // SAFETY: `msg` points at `rest`, whose ranges the caller keeps
        // readable; the kernel only reads them.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
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
    Ok(())
}

/// An `iovec` over `len` bytes at `ptr`, for [`send_all`].
pub fn iovec(ptr: *const u8, len: usize) -> libc::iovec {
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
    pub fn header<const N: usize>(&mut self, fd: RawFd, hint: usize) -> io::Result<[u8; N]> {
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

    /// Receives exactly `len` bytes into `ptr`: what is buffered first,
    /// the rest straight from the socket.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay writable, and not be read or written
    /// through any Rust reference, until this returns.
    ///
    /// # Errors
    /// I/O errors; `UnexpectedEof` when the peer closes first.
    pub unsafe fn read_raw(&mut self, fd: RawFd, ptr: *mut u8, len: usize) -> io::Result<()> {
        let from_buf = self.buffered().min(len);
        // SAFETY: the source is initialised buffer bytes, the destination
        // the caller's writable range; they cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.buf[self.lo..].as_ptr(), ptr, from_buf) };
        self.lo += from_buf;
        let mut done = from_buf;
        while done < len {
            // SAFETY: `done < len`, so the range is inside the caller's.
            done += retry(|| unsafe {
                libc::recv(fd, ptr.add(done).cast(), len - done, libc::MSG_WAITALL)
            })?;
        }
        Ok(())
    }

    /// Receives exactly `dst.len()` bytes into `dst`.
    ///
    /// # Errors
    /// As [`RecvBuf::read_raw`].
    pub fn read_exact(&mut self, fd: RawFd, dst: &mut [u8]) -> io::Result<()> {
        // SAFETY: `dst` is an exclusive borrow for the whole call.
        unsafe { self.read_raw(fd, dst.as_mut_ptr(), dst.len()) }
    }

    /// Consumes and drops `len` bytes.
    ///
    /// # Errors
    /// As [`RecvBuf::read_raw`].
    pub fn skip(&mut self, fd: RawFd, mut len: u64) -> io::Result<()> {
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
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn small_messages_come_through_the_buffer_and_leftovers_stay() {
        let (mut a, b) = UnixStream::pair().unwrap();
        // Two messages at once: header 4 + body 3, header 4 + body 2.
        a.write_all(b"HEAD123HDR2xy").unwrap();
        let mut r = RecvBuf::new(64);
        let fd = b.as_raw_fd();
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
            let mut iov = [iovec(head.as_ptr(), 4), iovec(sent.as_ptr(), sent.len())];
            // SAFETY: both ranges live until the call returns.
            unsafe { send_all(a.as_raw_fd(), &mut iov) }.unwrap();
        });
        let mut r = RecvBuf::new(16);
        let fd = b.as_raw_fd();
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
        let e = r.header::<4>(b.as_raw_fd(), 4).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
