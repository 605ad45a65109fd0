//! TCP data client: authenticated connections to agents' data ports, kept in
//! a pool per address, and pipelined reads and writes over one connection.
//!
//! A connection that saw any error is dropped, never returned to the pool,
//! so a half-finished exchange can never confuse a later copy. Nothing here
//! allocates per request: a small read's reply arrives through the
//! connection's own receive buffer in one `recv`, a large one straight into
//! the caller's memory, and a write's header and payload leave in one
//! `sendmsg`. Where the cluster's data ports speak TLS, each connection
//! is the plaintext end of a TLS tunnel (`oncilla_net::tls::tunnel`),
//! used exactly as a plain socket.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::Mutex;
use std::time::Duration;

use oncilla_net::credential::Renewable;
use oncilla_net::tls::tunnel::DataStream;
use oncilla_net::tls::ClientTls;
use oncilla_net::wire::sock::{self, RecvBuf};
use oncilla_net::wire::{self, dial, Reply, Request, Source, Status, REPLY_LEN};

use crate::error::{Error, Result};

/// Most bytes one request moves; larger pieces are split.
pub const CHUNK: u64 = 4 << 20;
/// Requests in flight per connection.
pub const WINDOW: usize = 8;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A peer that sends or accepts nothing for this long is considered dead.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle connections kept per agent.
const IDLE_PER_ADDR: usize = 64;
/// Reads up to this size come through the receive buffer with their reply
/// header (one system call); larger ones are received in place.
const SMALL_READ: usize = 4096;
/// A connection's receive buffer: a reply header, a small read, and an
/// error message.
const RECV_CAP: usize = REPLY_LEN + SMALL_READ + wire::MAX_MESSAGE as usize;

/// The caller's side of one request.
pub enum IoBuf<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
    /// No caller memory: the agent fills the range from another agent's
    /// memory itself (a third-party copy).
    Pull(Pull),
}

/// The source of a [`IoBuf::Pull`]: `len` bytes at `src.offset` of
/// another allocation, all in one extent of the agent at `src.addr`.
#[derive(Debug, Clone)]
pub struct Pull {
    pub src: Source,
    pub len: usize,
}

impl IoBuf<'_> {
    pub fn len(&self) -> usize {
        match self {
            IoBuf::Read(b) => b.len(),
            IoBuf::Write(b) => b.len(),
            IoBuf::Pull(p) => p.len,
        }
    }

    /// Where the bytes start (the verbs engine registers them); a pull
    /// has none here.
    pub fn as_ptr(&self) -> *const u8 {
        match self {
            IoBuf::Read(b) => b.as_ptr(),
            IoBuf::Write(b) => b.as_ptr(),
            IoBuf::Pull(_) => std::ptr::null(),
        }
    }

    /// Splits off the first `n` bytes.
    pub fn split_at(self, n: usize) -> (Self, Self) {
        match self {
            IoBuf::Read(b) => {
                let (h, t) = b.split_at_mut(n);
                (IoBuf::Read(h), IoBuf::Read(t))
            }
            IoBuf::Write(b) => {
                let (h, t) = b.split_at(n);
                (IoBuf::Write(h), IoBuf::Write(t))
            }
            IoBuf::Pull(p) => {
                let n = n.min(p.len);
                let mut tail = p.clone();
                tail.src.offset += n as u64;
                tail.len -= n;
                (IoBuf::Pull(Pull { len: n, ..p }), IoBuf::Pull(tail))
            }
        }
    }
}

/// One request and the caller memory it reads into or writes from
/// (`req.len == buf.len()`).
pub struct Chunk<'a> {
    pub req: Request,
    pub buf: IoBuf<'a>,
}

/// An authenticated data connection and its receive buffer, and when the
/// credential it was opened with expires (`None`: the token).
struct Conn {
    stream: DataStream,
    recv: RecvBuf,
    expires: Option<u64>,
}

/// Connections to agents, reused across copies.
pub struct TcpFabric {
    credential: Renewable,
    /// The cluster CA, when the data ports speak TLS.
    tls: Option<ClientTls>,
    idle: Mutex<HashMap<String, Vec<Conn>>>,
}

impl TcpFabric {
    pub fn new(credential: Renewable, tls: Option<ClientTls>) -> Self {
        Self {
            credential,
            tls,
            idle: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `chunks` on `node`'s agent at `addr`, pipelined over one
    /// connection. A pooled connection that turns out dead before its
    /// first reply (the agent restarted since) is replaced once: requests
    /// are idempotent, so resending them is safe.
    ///
    /// # Errors
    /// [`Error::NodeUnreachable`] when the node cannot be reached or the
    /// connection breaks; per-request failures with the agent's message.
    pub fn run(&self, (node, addr): (&str, &str), chunks: &mut [Chunk<'_>]) -> Result<()> {
        let peer = Peer { node, addr };
        let (mut conn, mut pooled) = self.take(&peer)?;
        loop {
            match exchange(&peer, &mut conn, chunks) {
                Ok(outcome) => {
                    // Every reply was read, so the stream is in step and
                    // reusable even when the agent refused a request.
                    self.put(addr, conn);
                    return outcome;
                }
                Err(Broken { error, replied }) => {
                    if pooled && !replied {
                        conn = self.connect(&peer)?;
                        pooled = false;
                        continue;
                    }
                    return Err(error);
                }
            }
        }
    }

    /// An idle pooled connection (true) or a new one (false). A pooled
    /// one whose credential expired is dropped: its agent closes it (idle)
    /// or cuts it (after a grace), and the renewed credential dials anew.
    fn take(&self, peer: &Peer<'_>) -> Result<(Conn, bool)> {
        let now = oncilla_net::credential::unix_now();
        let mut idle = self.lock();
        if let Some(list) = idle.get_mut(peer.addr) {
            list.retain(|c| c.expires.is_none_or(|at| at > now));
            if let Some(c) = list.pop() {
                return Ok((c, true));
            }
        }
        drop(idle);
        self.connect(peer).map(|c| (c, false))
    }

    fn put(&self, addr: &str, conn: Conn) {
        let mut idle = self.lock();
        let list = match idle.get_mut(addr) {
            Some(list) => list,
            None => idle.entry(addr.to_string()).or_default(),
        };
        if list.len() < IDLE_PER_ADDR {
            list.push(conn);
        }
    }

    fn connect(&self, peer: &Peer<'_>) -> Result<Conn> {
        let credential = self.credential.current();
        let stream = dial::dial(
            peer.addr,
            self.tls.as_ref(),
            credential.as_bytes(),
            CONNECT_TIMEOUT,
            IO_TIMEOUT,
        )
        .map_err(|e| super::dialed(e, |m| peer.unreachable(m)))?;
        Ok(Conn {
            stream,
            recv: RecvBuf::new(RECV_CAP),
            expires: oncilla_net::credential::session_expiry(credential.as_bytes()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Conn>>> {
        // The map holds only idle sockets; a panic elsewhere cannot leave it inconsistent.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl super::Transport for TcpFabric {
    type Piece<'a> = Chunk<'a>;

    /// [`TcpFabric::run`] on `to`'s data port.
    fn execute(&self, to: super::Peer<'_>, pieces: &mut [Chunk<'_>]) -> Result<()> {
        self.run((to.node, to.addr), pieces)
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

/// Sends `chunks` with at most [`WINDOW`] in flight and reads every reply.
/// A write's payload is sent only while no read is outstanding, so the
/// client never blocks sending while the agent blocks sending it read data
/// (reads and writes may share a connection). `Ok` holds the first refusal
/// the agent answered with, if any (the stream is then still in step);
/// `Err` a broken stream.
fn exchange(
    peer: &Peer<'_>,
    conn: &mut Conn,
    chunks: &mut [Chunk<'_>],
) -> Result<Result<()>, Broken> {
    let fd = conn.stream.as_fd();
    let mut sent = 0;
    let mut done = 0;
    let mut reads_in_flight = 0usize;
    let mut first_error: Option<Error> = None;
    let broken = |done: usize, error: Error| Broken {
        error,
        replied: done > 0,
    };
    let io = |e: std::io::Error| peer.unreachable(format!("connection lost: {e}"));
    let mut record: Vec<u8>;
    while done < chunks.len() {
        while sent < chunks.len() && sent - done < WINDOW {
            let Chunk { req, buf } = &chunks[sent];
            let head = req.encode();
            let body: &[u8] = match buf {
                IoBuf::Write(b) => {
                    if reads_in_flight > 0 {
                        break;
                    }
                    b
                }
                IoBuf::Read(_) => {
                    reads_in_flight += 1;
                    &[]
                }
                IoBuf::Pull(p) => {
                    // Checked when the copy was planned; a refusal here
                    // leaves the stream in step (nothing was sent).
                    record = p
                        .src
                        .encode()
                        .map_err(|e| broken(done, peer.protocol(e.to_string())))?;
                    &record
                }
            };
            sock::send(fd, &head, body).map_err(|e| broken(done, io(e)))?;
            sent += 1;
        }
        let Chunk { req, buf } = &mut chunks[done];
        let small = match buf {
            IoBuf::Read(b) if b.len() <= SMALL_READ => b.len(),
            _ => 0,
        };
        let head = conn
            .recv
            .header::<REPLY_LEN>(fd, REPLY_LEN + small)
            .map_err(|e| broken(done, io(e)))?;
        let reply =
            Reply::decode(&head).map_err(|e| broken(done + 1, peer.protocol(e.to_string())))?;
        if let IoBuf::Read(_) = buf {
            reads_in_flight -= 1;
        }
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
                conn.recv
                    .read_exact(fd, b)
                    .map_err(|e| broken(done + 1, io(e)))?;
            }
        } else {
            if reply.len > wire::MAX_MESSAGE {
                return Err(broken(
                    done + 1,
                    peer.protocol("error message too long".into()),
                ));
            }
            let mut msg = [0u8; wire::MAX_MESSAGE as usize];
            let msg = &mut msg[..usize::try_from(reply.len).unwrap_or(0)];
            conn.recv
                .read_exact(fd, msg)
                .map_err(|e| broken(done + 1, io(e)))?;
            let msg = String::from_utf8_lossy(msg).into_owned();
            first_error.get_or_insert(match reply.status {
                Status::NoSuchAllocation => Error::NotFound(msg),
                Status::BadKey => Error::PermissionDenied(msg),
                Status::OutOfBounds => Error::InvalidArgument(msg),
                Status::Busy => Error::CapacityExhausted(msg),
                _ => peer.protocol(msg),
            });
        }
        done += 1;
    }
    Ok(first_error.map_or(Ok(()), Err))
}
