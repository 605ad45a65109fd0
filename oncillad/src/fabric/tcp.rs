//! The TCP data server: one thread per connection, reading requests and
//! moving bytes between the socket and pool memory directly.
//!
//! It owns the wire handshake, the per-request checks (allocation known,
//! access key, bounds) and the copies. It never changes which allocations
//! exist; it only reads the held table. A write is acknowledged only after
//! every byte is in pool memory, so an acknowledged write is visible to every
//! later reader.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use oncilla_proto::auth::Token;
use oncilla_proto::wire::{self, Op, Reply, Request, Status, Welcome, REQUEST_LEN};

use crate::agent::held::HeldTable;

/// Most data connections served at once.
pub const MAX_CONNECTIONS: usize = 1024;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts data connections until the listener fails.
pub fn serve(listener: TcpListener, held: HeldTable, token: Token) {
    let live = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "data accept failed");
                continue;
            }
        };
        let held = Arc::clone(&held);
        let token = token.clone();
        let live = Arc::clone(&live);
        let spawned = std::thread::Builder::new()
            .name("oncilla-data".into())
            .spawn(move || {
                let peer = stream
                    .peer_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                let n = live.fetch_add(1, Ordering::SeqCst);
                let result = if n >= MAX_CONNECTIONS {
                    reject(stream, "too many data connections")
                } else {
                    Connection { stream, held }.run(&token)
                };
                live.fetch_sub(1, Ordering::SeqCst);
                match result {
                    Ok(()) => tracing::debug!(%peer, "data connection closed"),
                    Err(e) => tracing::debug!(%peer, error = %e, "data connection ended"),
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start data connection thread");
        }
    }
}

fn reject(mut stream: TcpStream, why: &str) -> Result<(), wire::WireError> {
    wire::write_welcome(&mut stream, Welcome::Denied, why)
}

struct Connection {
    stream: TcpStream,
    held: HeldTable,
}

impl Connection {
    fn run(mut self, token: &Token) -> Result<(), wire::WireError> {
        self.stream.set_nodelay(true)?;
        self.stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        if !super::accept(&mut self.stream, token)? {
            return Ok(());
        }
        self.stream.set_read_timeout(None)?;
        loop {
            let mut head = [0u8; REQUEST_LEN];
            match self.stream.read_exact(&mut head) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            let req = match Request::decode(&head) {
                Ok(r) => r,
                Err(e) => {
                    // The stream cannot be trusted past a bad header.
                    self.fail(Status::Internal, &e.to_string())?;
                    return Err(e);
                }
            };
            self.serve_one(&req)?;
        }
    }

    fn serve_one(&mut self, req: &Request) -> Result<(), wire::WireError> {
        if req.len > wire::MAX_IO {
            let msg = format!(
                "request of {} bytes is above the {} byte limit",
                req.len,
                wire::MAX_IO
            );
            self.fail(Status::TooLarge, &msg)?;
            // A write's payload would follow; the stream is out of step now.
            return if req.op == Op::Write {
                Err(io::Error::new(io::ErrorKind::InvalidData, msg).into())
            } else {
                Ok(())
            };
        }
        let ok = match super::authorize(&self.held, req) {
            Ok(ok) => ok,
            Err((status, msg)) => {
                if req.op == Op::Write {
                    self.drain(req.len)?;
                }
                return self.fail(status, &msg);
            }
        };
        let extent = &ok.held.extents[ok.extent];
        let at = ok.at;
        let len = usize::try_from(req.len).unwrap_or(0);
        let ptr = extent.ptr(at);
        match req.op {
            Op::Read => {
                let head = Reply {
                    status: Status::Ok,
                    len: req.len,
                }
                .encode();
                self.stream.write_all(&head)?;
                // SAFETY: `authorize` proved [at, at+len) lies inside this
                // extent, and `ok.held` keeps it alive (not freed or
                // recycled) until this copy returns.
                unsafe { send_raw(&self.stream, ptr, len)? };
            }
            Op::Write => {
                // SAFETY: as above; the kernel writes into pool memory that
                // no Rust reference aliases.
                unsafe { recv_raw(&self.stream, ptr, len)? };
                let head = Reply {
                    status: Status::Ok,
                    len: 0,
                }
                .encode();
                self.stream.write_all(&head)?;
            }
        }
        Ok(())
    }

    fn fail(&mut self, status: Status, msg: &str) -> Result<(), wire::WireError> {
        let bytes = &msg.as_bytes()[..msg.len().min(wire::MAX_MESSAGE as usize)];
        let head = Reply {
            status,
            len: bytes.len() as u64,
        }
        .encode();
        self.stream.write_all(&head)?;
        self.stream.write_all(bytes)?;
        Ok(())
    }

    fn drain(&mut self, len: u64) -> Result<(), wire::WireError> {
        io::copy(&mut (&mut self.stream).take(len), &mut io::sink())?;
        Ok(())
    }
}

/// Sends `len` bytes starting at `ptr`.
///
/// # Safety
/// `ptr..ptr+len` must stay mapped and readable until this returns.
unsafe fn send_raw(sock: &TcpStream, ptr: *const u8, len: usize) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    transfer(len, |done| {
        // SAFETY: the caller guarantees the range is readable; `done < len`.
        unsafe { libc::send(fd, ptr.add(done).cast(), len - done, libc::MSG_NOSIGNAL) }
    })
}

/// Receives exactly `len` bytes into `ptr`.
///
/// # Safety
/// `ptr..ptr+len` must stay mapped and writable until this returns.
unsafe fn recv_raw(sock: &TcpStream, ptr: *mut u8, len: usize) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    transfer(len, |done| {
        // SAFETY: the caller guarantees the range is writable; `done < len`.
        unsafe { libc::recv(fd, ptr.add(done).cast(), len - done, libc::MSG_WAITALL) }
    })
}

/// Calls `op(done)` until `len` bytes have moved, retrying on EINTR; a
/// return of 0 before the end means the peer closed the connection.
fn transfer(len: usize, mut op: impl FnMut(usize) -> isize) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let n = op(done);
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
        done += n.unsigned_abs();
    }
    Ok(())
}
