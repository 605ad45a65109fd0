//! TCP data client: a node's share of a copy shaped into requests and
//! dealt over connections ([`work`], [`deal`]), authenticated connections
//! to agents' data ports, kept in a pool per address, and pipelined reads
//! and writes over one connection.
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
use oncilla_net::wire::{self, dial, Op, Reply, Request, Source, Status, REPLY_LEN};

use crate::descriptor::Descriptor;
use crate::error::{Error, Result};

/// Most bytes one read or write request moves; larger pieces are split.
/// Fewer, longer requests keep the agent's receive low-water mark raised
/// for more of each payload (it is lowered for each payload's end), and
/// writes of 64 MiB and more ran faster with 16 MiB than with 4 MiB
/// (`docs/benchmarks.md`, "Requests of 16 MiB"). What a request may take
/// to be answered does not grow with it: a write's copies to replicas end
/// within a fixed time of its last byte (the agent's `COPY_WITHIN`).
pub const CHUNK: u64 = 16 << 20;
/// What requests are cut in multiples of, where they are cut.
const PAGE: u64 = 4096;
/// Most bytes one pull moves: the agent answers a pull only once all of it
/// has come from the source, and its time budget for that is built for
/// this size (`oncillad/src/fabric/pull.rs`, `STALL`), inside
/// [`IO_TIMEOUT`].
pub const PULL_CHUNK: u64 = 4 << 20;
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
                Status::NotPrimary => Error::Unavailable(msg),
                _ => peer.protocol(msg),
            });
        }
        done += 1;
    }
    Ok(first_error.map_or(Ok(()), Err))
}

/// Least bytes worth a connection of their own: below this a node's share
/// of a copy goes over fewer connections than allowed.
pub const STREAM_MIN: u64 = 1 << 20;

/// Most bytes one request for `buf` moves: [`PULL_CHUNK`] for a pull,
/// [`CHUNK`] otherwise.
pub(crate) fn most_per_request(buf: &IoBuf<'_>) -> u64 {
    match buf {
        IoBuf::Pull(_) => PULL_CHUNK,
        IoBuf::Read(_) | IoBuf::Write(_) => CHUNK,
    }
}

/// Whether a copy of `buf` to one node is one request on one connection
/// when `max` connections are allowed.
pub(crate) fn one_request(buf: &IoBuf<'_>, max: usize) -> bool {
    let len = buf.len() as u64;
    len <= most_per_request(buf) && streams_for(len, max) == 1
}

/// Connections a node's share of `bytes` goes over when `max` are allowed:
/// one per [`STREAM_MIN`], at least one.
pub fn streams_for(bytes: u64, max: usize) -> usize {
    usize::try_from(bytes / STREAM_MIN)
        .unwrap_or(usize::MAX)
        .clamp(1, max.max(1))
}

/// A node's pieces as TCP work: one request each, recut so that `streams`
/// connections share the node's `bytes` (at most [`most_per_request`] a
/// request).
pub(crate) fn work<'a>(
    pieces: Vec<super::Piece<'a>>,
    bytes: u64,
    streams: usize,
) -> Vec<Chunk<'a>> {
    let chunks = pieces
        .into_iter()
        .map(|p| Chunk {
            req: request(&p.buf, p.desc, p.at, p.buf.len() as u64),
            buf: p.buf,
        })
        .collect();
    resplit(chunks, bytes, streams)
}

/// The request that moves `buf` at `offset` of the allocation `d` describes.
pub(crate) fn request(buf: &IoBuf<'_>, d: &Descriptor, offset: u64, len: u64) -> Request {
    Request {
        op: match buf {
            IoBuf::Read(_) => Op::Read,
            IoBuf::Write(_) => Op::Write,
            IoBuf::Pull(_) => Op::Pull,
        },
        alloc_id: d.id,
        key: d.key,
        offset,
        len,
    }
}

/// Splits pieces into requests of at most [`most_per_request`] bytes, and
/// small enough that `streams` connections each get a share of the node's
/// `bytes`: equal requests per share (80 MiB over four connections goes as
/// eight of 10 MiB, not five of 16 MiB dealt two to one connection).
fn resplit<'a>(pieces: Vec<Chunk<'a>>, bytes: u64, streams: usize) -> Vec<Chunk<'a>> {
    let streams = streams.max(1) as u64;
    let share = bytes.div_ceil(streams).max(1);
    // One connection has nothing to balance: requests as large as allowed.
    let target_for = |most: u64| {
        if streams == 1 {
            most
        } else {
            share.div_ceil(share.div_ceil(most))
        }
    };
    let target = |buf: &IoBuf<'_>| target_for(most_per_request(buf));
    if pieces.iter().all(|c| c.req.len <= target(&c.buf)) {
        return pieces;
    }
    let smallest = target_for(PULL_CHUNK);
    let mut out = Vec::with_capacity(usize::try_from(bytes / smallest).unwrap_or(0) + pieces.len());
    for Chunk { req, mut buf } in pieces {
        // Equal parts of the piece, whole pages where they can be, none
        // above the piece's limit (a multiple of the page).
        let parts = req.len.div_ceil(target(&buf)).max(1);
        let part = req
            .len
            .div_ceil(parts)
            .next_multiple_of(PAGE)
            .min(most_per_request(&buf));
        let mut at = 0;
        while at < req.len {
            let n = (req.len - at).min(part);
            let (head, tail) = buf.split_at(usize::try_from(n).unwrap_or(usize::MAX));
            buf = tail;
            out.push(Chunk {
                req: Request {
                    offset: req.offset + at,
                    len: n,
                    ..req
                },
                buf: head,
            });
            at += n;
        }
    }
    out
}

/// Deals `chunks` (in order) into at most `streams` contiguous runs of
/// about equal bytes and hands each to `job`.
pub(crate) fn deal<'s, 'a>(
    chunks: &'s mut [Chunk<'a>],
    bytes: u64,
    streams: usize,
    mut job: impl FnMut(&'s mut [Chunk<'a>]),
) {
    let mut rest = chunks;
    let mut taken = 0u64;
    for k in 1..=streams as u64 {
        if rest.is_empty() {
            break;
        }
        let goal = bytes * k / streams as u64;
        let mut n = 0;
        while n < rest.len() && (taken < goal || n == 0) {
            taken += rest[n].req.len;
            n += 1;
        }
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(n);
        rest = tail;
        job(part);
    }
    if !rest.is_empty() {
        job(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncilla_net::wire::Op;

    fn chunks<'a>(lens: &[u64], buf: &'a mut [u8]) -> Vec<Chunk<'a>> {
        let mut rest = buf;
        let mut offset = 0;
        let mut out = Vec::new();
        for &len in lens {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(len as usize);
            rest = tail;
            out.push(Chunk {
                req: Request {
                    op: Op::Read,
                    alloc_id: 1,
                    key: [0; 16],
                    offset,
                    len,
                },
                buf: IoBuf::Read(head),
            });
            offset += len;
        }
        out
    }

    fn pull(len: u64) -> IoBuf<'static> {
        IoBuf::Pull(Pull {
            src: Source {
                alloc_id: 2,
                key: [0; 16],
                offset: 0,
                addr: "127.0.0.1:1".into(),
            },
            len: len as usize,
        })
    }

    #[test]
    fn only_copies_worth_one_connection_take_the_direct_path() {
        let mut buf = vec![0u8; CHUNK as usize + 1];
        let read = |buf: &mut [u8], n: u64| one_request(&IoBuf::Read(&mut buf[..n as usize]), 4);
        assert!(read(&mut buf, 8));
        assert!(read(&mut buf, STREAM_MIN));
        // 4 MiB fits one request but is worth four connections.
        assert!(!read(&mut buf, 4 << 20));
        assert!(!one_request(&IoBuf::Write(&buf[..2 << 20]), 2));
        assert!(one_request(&IoBuf::Write(&buf[..CHUNK as usize]), 1));
        assert!(!one_request(&IoBuf::Write(&buf), 1));
        // A pull is one request only up to the size its budget is built for.
        assert!(one_request(&pull(PULL_CHUNK), 1));
        assert!(!one_request(&pull(PULL_CHUNK + 1), 1));
    }

    #[test]
    fn resplit_gives_every_stream_a_share_and_keeps_offsets() {
        let mut buf = vec![0u8; 10 << 20];
        let pieces = chunks(&[6 << 20, 4 << 20], &mut buf);
        let out = resplit(pieces, 10 << 20, 4);
        // 10 MiB over 4 streams: requests of at most 2.5 MiB.
        assert!(out.iter().all(|c| c.req.len <= (10 << 20) / 4 + 1));
        assert_eq!(out.iter().map(|c| c.req.len).sum::<u64>(), 10 << 20);
        let mut at = 0;
        for c in &out {
            assert_eq!(c.req.offset, at);
            assert_eq!(c.buf.len() as u64, c.req.len);
            at += c.req.len;
        }
        // Never above CHUNK, whatever the stream count.
        let mut buf = vec![0u8; 36 << 20];
        let out = resplit(chunks(&[36 << 20], &mut buf), 36 << 20, 1);
        assert!(out.iter().all(|c| c.req.len <= CHUNK));
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn a_share_goes_in_equal_requests_so_streams_stay_balanced() {
        let n = 80u64 << 20;
        let mut buf = vec![0u8; n as usize];
        let mut out = resplit(chunks(&[n], &mut buf), n, 4);
        assert!(
            out.iter().all(|c| c.req.len == 10 << 20),
            "80 MiB over 4: 8 of 10 MiB"
        );
        let mut runs = Vec::new();
        deal(&mut out, n, 4, |part| {
            runs.push(part.iter().map(|c| c.req.len).sum::<u64>())
        });
        assert_eq!(runs, [20 << 20; 4]);
    }

    #[test]
    fn pieces_of_mixed_kinds_are_each_cut_at_their_own_limit() {
        let mut w = vec![0u8; 20 << 20];
        let mut r = vec![0u8; 1 << 20];
        let pieces = vec![
            Chunk {
                req: Request {
                    op: Op::Write,
                    alloc_id: 1,
                    key: [0; 16],
                    offset: 0,
                    len: 20 << 20,
                },
                buf: IoBuf::Write(&w[..]),
            },
            Chunk {
                req: Request {
                    op: Op::Pull,
                    alloc_id: 1,
                    key: [0; 16],
                    offset: 20 << 20,
                    len: 9 << 20,
                },
                buf: pull(9 << 20),
            },
            Chunk {
                req: Request {
                    op: Op::Read,
                    alloc_id: 1,
                    key: [0; 16],
                    offset: 29 << 20,
                    len: 1 << 20,
                },
                buf: IoBuf::Read(&mut r[..]),
            },
        ];
        let out = resplit(pieces, 30 << 20, 1);
        let got: Vec<(Op, u64, u64)> = out
            .iter()
            .map(|c| (c.req.op, c.req.offset >> 20, c.req.len >> 20))
            .collect();
        assert_eq!(
            got,
            [
                (Op::Write, 0, 10),
                (Op::Write, 10, 10),
                (Op::Pull, 20, 3),
                (Op::Pull, 23, 3),
                (Op::Pull, 26, 3),
                (Op::Read, 29, 1),
            ]
        );
        w.clear();
    }

    #[test]
    fn pulls_are_cut_at_their_own_limit() {
        let n = 9 << 20;
        let one = Chunk {
            req: Request {
                op: Op::Pull,
                alloc_id: 1,
                key: [0; 16],
                offset: 0,
                len: n,
            },
            buf: pull(n),
        };
        let out = resplit(vec![one], n, 1);
        let lens: Vec<u64> = out.iter().map(|c| c.req.len).collect();
        // Three equal pulls, none above PULL_CHUNK.
        assert_eq!(lens, [3 << 20; 3]);
        assert!(out.iter().all(|c| c.req.len <= PULL_CHUNK));
        let starts: Vec<u64> = out.iter().map(|c| c.req.offset).collect();
        assert_eq!(starts, [0, 3 << 20, 6 << 20]);
        // Each piece pulls the source bytes at its own offset.
        let offsets: Vec<u64> = out
            .iter()
            .map(|c| match &c.buf {
                IoBuf::Pull(p) => p.src.offset,
                _ => unreachable!("a pull stays a pull"),
            })
            .collect();
        assert_eq!(offsets, [0, 3 << 20, 6 << 20]);
    }

    #[test]
    fn deal_covers_every_chunk_once_in_balanced_runs() {
        for (n, streams) in [(1usize, 4usize), (3, 4), (4, 4), (17, 4), (64, 8), (5, 1)] {
            let mut buf = vec![0u8; n * 100];
            let mut cs = chunks(&vec![100; n], &mut buf);
            let mut runs = Vec::new();
            deal(&mut cs, n as u64 * 100, streams, |part| {
                runs.push(part.iter().map(|c| c.req.offset).collect::<Vec<_>>())
            });
            assert!(
                runs.len() <= streams && runs.len() == n.min(streams),
                "{n} {streams}: {runs:?}"
            );
            let all: Vec<u64> = runs.concat();
            assert_eq!(all, (0..n as u64).map(|i| i * 100).collect::<Vec<_>>());
            let (min, max) = (
                runs.iter().map(Vec::len).min().unwrap(),
                runs.iter().map(Vec::len).max().unwrap(),
            );
            assert!(max - min <= 1, "{n} over {streams}: {runs:?}");
        }
    }

    #[test]
    fn streams_grow_with_size_up_to_the_limit() {
        assert_eq!(streams_for(8, 4), 1);
        assert_eq!(streams_for(2 * STREAM_MIN, 4), 2);
        assert_eq!(streams_for(1 << 30, 4), 4);
    }
}
