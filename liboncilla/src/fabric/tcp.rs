//! TCP data client: authenticated connections to agents' data ports, kept in
//! a pool per address, and pipelined reads and writes over one connection.
//!
//! A connection that saw any error is dropped, never returned to the pool,
//! so a half-finished exchange can never confuse a later copy.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::Duration;

use oncilla_proto::auth::Token;
use oncilla_proto::wire::{self, Op, Reply, Request, Status, KEY_LEN, REPLY_LEN};

use crate::error::{Error, Result};

/// Bytes moved per request.
pub const CHUNK: u64 = 4 << 20;
/// Requests in flight per connection.
pub const WINDOW: usize = 8;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A peer that sends or accepts nothing for this long is considered dead.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle connections kept per agent.
const IDLE_PER_ADDR: usize = 8;

/// One operation on a contiguous range: `len` bytes at allocation offset `offset`.
pub struct Io<'a> {
    pub offset: u64,
    pub buf: IoBuf<'a>,
}

/// The caller's side of an operation.
pub enum IoBuf<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// Connections to agents, reused across copies.
pub struct TcpFabric {
    token: Token,
    idle: Mutex<HashMap<String, Vec<TcpStream>>>,
}

impl TcpFabric {
    pub fn new(token: Token) -> Self {
        Self {
            token,
            idle: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `ios` against allocation `id` on `node`'s agent at `addr`,
    /// pipelined over one connection, each split into [`CHUNK`]-sized
    /// requests. A pooled connection that turns out dead before its first
    /// reply (the agent restarted since) is replaced once: requests are
    /// idempotent, so resending them is safe.
    ///
    /// # Errors
    /// [`Error::NodeUnreachable`] when the node cannot be reached or the
    /// connection breaks; per-request failures with the agent's message.
    pub fn run(
        &self,
        (node, addr): (&str, &str),
        id: u64,
        key: &[u8; KEY_LEN],
        ios: Vec<Io<'_>>,
    ) -> Result<()> {
        let mut reqs: Vec<(Request, IoBuf<'_>)> = Vec::new();
        for io in ios {
            let (op, len) = match &io.buf {
                IoBuf::Read(b) => (Op::Read, b.len()),
                IoBuf::Write(b) => (Op::Write, b.len()),
            };
            let mut at = 0usize;
            let mut rest = io.buf;
            while at < len {
                let n = (len - at).min(usize::try_from(CHUNK).unwrap_or(usize::MAX));
                let (head, tail) = match rest {
                    IoBuf::Read(b) => {
                        let (h, t) = b.split_at_mut(n);
                        (IoBuf::Read(h), IoBuf::Read(t))
                    }
                    IoBuf::Write(b) => {
                        let (h, t) = b.split_at(n);
                        (IoBuf::Write(h), IoBuf::Write(t))
                    }
                };
                reqs.push((
                    Request {
                        op,
                        alloc_id: id,
                        key: *key,
                        offset: io.offset + at as u64,
                        len: n as u64,
                    },
                    head,
                ));
                rest = tail;
                at += n;
            }
        }
        let peer = Peer { node, addr };
        let (mut stream, mut pooled) = self.take(&peer)?;
        loop {
            match exchange(&peer, &mut stream, &mut reqs) {
                Ok(outcome) => {
                    // Every reply was read, so the stream is in step and
                    // reusable even when the agent refused a request.
                    self.put(addr, stream);
                    return outcome;
                }
                Err(Broken { error, replied }) => {
                    if pooled && !replied {
                        stream = self.connect(&peer)?;
                        pooled = false;
                        continue;
                    }
                    return Err(error);
                }
            }
        }
    }

    /// An idle pooled connection (true) or a new one (false).
    fn take(&self, peer: &Peer<'_>) -> Result<(TcpStream, bool)> {
        if let Some(s) = self.lock().get_mut(peer.addr).and_then(Vec::pop) {
            return Ok((s, true));
        }
        self.connect(peer).map(|s| (s, false))
    }

    fn put(&self, addr: &str, stream: TcpStream) {
        let mut idle = self.lock();
        let list = idle.entry(addr.to_string()).or_default();
        if list.len() < IDLE_PER_ADDR {
            list.push(stream);
        }
    }

    fn connect(&self, peer: &Peer<'_>) -> Result<TcpStream> {
        let sockaddr = peer
            .addr
            .to_socket_addrs()
            .map_err(|e| peer.unreachable(format!("cannot resolve: {e}")))?
            .next()
            .ok_or_else(|| peer.unreachable("address resolves to nothing".into()))?;
        let mut stream = TcpStream::connect_timeout(&sockaddr, CONNECT_TIMEOUT)
            .map_err(|e| peer.unreachable(format!("cannot connect: {e}")))?;
        stream
            .set_nodelay(true)
            .map_err(|e| peer.unreachable(e.to_string()))?;
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .map_err(|e| peer.unreachable(e.to_string()))?;
        stream
            .set_write_timeout(Some(IO_TIMEOUT))
            .map_err(|e| peer.unreachable(e.to_string()))?;
        super::greet(&mut stream, &self.token, |m| peer.unreachable(m))?;
        Ok(stream)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<TcpStream>>> {
        // The map holds only idle sockets; a panic elsewhere cannot leave it inconsistent.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The node a connection goes to, for errors.
struct Peer<'a> {
    node: &'a str,
    addr: &'a str,
}

impl Peer<'_> {
    fn unreachable(&self, reason: String) -> Error {
        Error::NodeUnreachable {
            node: self.node.to_string(),
            addr: self.addr.to_string(),
            reason,
        }
    }

    fn protocol(&self, reason: String) -> Error {
        Error::Fabric {
            node: self.node.to_string(),
            addr: self.addr.to_string(),
            reason,
        }
    }
}

/// A connection that failed mid-exchange; `replied` when any reply was
/// read before it did.
struct Broken {
    error: Error,
    replied: bool,
}

/// Sends `reqs` with at most [`WINDOW`] in flight and reads every reply.
/// `Ok` holds the first refusal the agent answered with, if any (the
/// stream is then still in step); `Err` a broken stream.
fn exchange(
    peer: &Peer<'_>,
    stream: &mut TcpStream,
    reqs: &mut [(Request, IoBuf<'_>)],
) -> Result<Result<()>, Broken> {
    let mut sent = 0;
    let mut done = 0;
    let mut first_error: Option<Error> = None;
    let broken = |done: usize, error: Error| Broken {
        error,
        replied: done > 0,
    };
    let io = |e: std::io::Error| peer.unreachable(format!("connection lost: {e}"));
    while done < reqs.len() {
        while sent < reqs.len() && sent - done < WINDOW {
            let (req, buf) = &reqs[sent];
            stream
                .write_all(&req.encode())
                .map_err(|e| broken(done, io(e)))?;
            if let IoBuf::Write(b) = buf {
                stream.write_all(b).map_err(|e| broken(done, io(e)))?;
            }
            sent += 1;
        }
        let mut head = [0u8; REPLY_LEN];
        stream
            .read_exact(&mut head)
            .map_err(|e| broken(done, io(e)))?;
        let reply =
            Reply::decode(&head).map_err(|e| broken(done + 1, peer.protocol(e.to_string())))?;
        let (req, buf) = &mut reqs[done];
        if reply.status == Status::Ok {
            if let IoBuf::Read(b) = buf {
                if reply.len != req.len {
                    return Err(broken(
                        done + 1,
                        peer.protocol(format!(
                            "agent sent {} bytes, asked for {}",
                            reply.len, req.len
                        )),
                    ));
                }
                stream.read_exact(b).map_err(|e| broken(done + 1, io(e)))?;
            }
        } else {
            if reply.len > wire::MAX_MESSAGE {
                return Err(broken(
                    done + 1,
                    peer.protocol("error message too long".into()),
                ));
            }
            let mut msg = vec![0u8; usize::try_from(reply.len).unwrap_or(0)];
            stream
                .read_exact(&mut msg)
                .map_err(|e| broken(done + 1, io(e)))?;
            let msg = String::from_utf8_lossy(&msg).into_owned();
            first_error.get_or_insert(match reply.status {
                Status::NoSuchAllocation => Error::NotFound(msg),
                Status::BadKey => Error::PermissionDenied(msg),
                Status::OutOfBounds => Error::InvalidArgument(msg),
                _ => peer.protocol(msg),
            });
        }
        done += 1;
    }
    Ok(first_error.map_or(Ok(()), Err))
}
