//! The TCP data server: one thread per connection, reading requests and
//! moving bytes between the socket and pool memory directly: a read's reply
//! header and data leave in one `sendmsg` straight from the pool, a write's
//! payload is received straight into it. No intermediate buffer, no
//! allocation per request.
//!
//! Not `sendfile` from the slab's memfd, on purpose: the kernel keeps
//! references to the pages in socket buffers after the call returns, with
//! no signal when it lets go, so a freed extent could be scrubbed and handed
//! to another allocation while its old bytes are still in flight to a
//! reader (or a new tenant's bytes could leave under the old reply).
//! `docs/benchmarks.md` measures what that copy costs.
//!
//! Device memory (`REMOTE_GPU` extents) cannot be handed to the socket: it
//! moves through one of the agent's page-locked staging rings, the device
//! copy of one buffer overlapping the socket's transfer of the next
//! ([`super::device`]); reads, writes and pulls into it alike. Local GPU
//! memory of another process is refused with the reason.
//!
//! Limits against peers that stall: the hello must be done within
//! [`HANDSHAKE_DEADLINE`] and waits in a small budget of its own
//! ([`MAX_PENDING`], apart from the [`MAX_CONNECTIONS`] authenticated
//! ones, where a newcomer takes the seat of a connection idle between
//! requests before it is refused); after it, a reply or payload that makes no progress for
//! [`STALL_DEADLINE`] ends the connection (socket timeouts set once, no
//! cost per request), and one that trickles is cut at its whole deadline
//! ([`MIN_RATE`]; checked only when a transfer comes back short), so a
//! peer that never reads, or reads a byte now and then, cannot keep a
//! freed allocation's memory out of the pool; accept errors back off.
//!
//! With TLS configured, the connection's thread first runs the TLS
//! handshake (inside the same hello deadline) and then serves the
//! plaintext end of a [`tunnel`] exactly as it serves a plain socket.
//!
//! It owns the wire handshake, the per-request checks (allocation known,
//! access key, bounds) and the copies. It never changes which allocations
//! exist; it only reads the held table. A write is acknowledged only after
//! every byte is in pool memory, so an acknowledged write is visible to every
//! later reader.

use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oncilla_net::credential::{self, Principal, CLOCK_SKEW, CONNECTION_GRACE, REPLICATOR};
use oncilla_net::tls::tunnel::{self, DataStream};
use oncilla_net::wire::lowat;
use oncilla_net::wire::sock::{self, RecvBuf, Shared};
use oncilla_net::wire::{
    self, Op, Reply, Request, Source, Stamp, Status, REQUEST_LEN, SOURCE_LEN, STAMP_LEN,
};

use oncilla_cuda::DeviceMem;

use super::device::{self, DeviceRings, Failure, RING_WAIT};
use super::pull::{Puller, Pulls};
use super::replicate::{Replicas, Replicator, COPY_WITHIN};
use super::Admission;
use crate::listen::{AcceptBackoff, Pending, Seats, Ticket, Users};
use crate::memory::held::{Backing, Held, HeldTable};
use crate::metrics::data::Transfers;

/// Most authenticated data connections served at once; past it a newcomer
/// takes the seat of one idle between requests (see [`Seats`]), and is
/// refused only when all are in use.
pub const MAX_CONNECTIONS: usize = 1024;
/// Of those, most one user holds (the user a session's id names; members
/// with the cluster token have no share): a quarter, so other users keep
/// seats however busy one keeps its own.
pub const MAX_CONNECTIONS_PER_USER: usize = MAX_CONNECTIONS / 4;
/// Of those, kept for operators (the cluster token): `ocmctl put`/`get`
/// connects however many users fill the rest.
pub const OPERATOR_RESERVE: usize = 32;
/// Most data connections still in their handshake, apart from
/// [`MAX_CONNECTIONS`]: a new one past it evicts the oldest (see
/// [`Pending`]), so strangers can never crowd out a client.
pub const MAX_PENDING: usize = 64;
/// Of [`MAX_PENDING`], most from one address.
pub const MAX_PENDING_PER_PEER: usize = 32;
/// The whole hello, from accept to welcome, must fit in this.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// A reply or payload that makes no progress for this long ends its
/// connection (and lets go of the allocation it was reading or writing).
/// Set once per connection as the socket's send and receive timeouts.
pub const STALL_DEADLINE: Duration = Duration::from_secs(10);
/// The slowest a request's bytes may move once they start: every request
/// gets a whole deadline of [`STALL_DEADLINE`] plus its length at this
/// rate (see [`sock::Deadline::for_transfer`]).
pub use oncilla_net::wire::sock::MIN_RATE;

/// When a request of `len` bytes must be over (see [`MIN_RATE`]).
fn deadline(len: usize) -> sock::Deadline {
    sock::Deadline::for_transfer(len, STALL_DEADLINE)
}
/// An authenticated connection idle this long between requests is closed
/// (clients replace a pooled connection that turns out closed).
pub const IDLE_LIMIT: Duration = Duration::from_secs(300);
/// Bytes a connection asks the kernel for when it reads a request header:
/// room for the header, a small write's payload and further pipelined
/// headers, so small requests cost one `recv`. Larger payloads go straight
/// into pool memory.
const RECV_AHEAD: usize = REQUEST_LEN + 4096;

/// Accepts data connections until the listener fails; over TLS with
/// `tls`; pulls and copies to replicas dial as `outbound` says; device
/// memory is staged through `rings`.
pub fn serve(
    listener: TcpListener,
    held: HeldTable,
    admission: Admission,
    tls: Option<Arc<rustls::ServerConfig>>,
    outbound: (Pulls, Replicas),
    rings: Arc<DeviceRings>,
    metrics: Arc<Transfers>,
) {
    let seats = Seats::new(MAX_CONNECTIONS, OPERATOR_RESERVE);
    let users = Users::new(MAX_CONNECTIONS_PER_USER);
    let pending = Pending::new(MAX_PENDING, MAX_PENDING_PER_PEER);
    metrics.watch_listener(Arc::clone(&pending), Arc::clone(&seats));
    let mut backoff = AcceptBackoff::new("data");
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(s) => s,
            Err(e) => {
                std::thread::sleep(backoff.failed(&e));
                continue;
            }
        };
        let ticket = match pending.admit(&stream, Some(peer.ip())) {
            Ok(t) => t,
            Err(e) => {
                // Out of descriptors: this connection goes, and we wait.
                drop(stream);
                std::thread::sleep(backoff.failed(&e));
                continue;
            }
        };
        let held = Arc::clone(&held);
        let admission = admission.clone();
        let seats = Arc::clone(&seats);
        let users = Arc::clone(&users);
        let tls = tls.clone();
        let metrics = Arc::clone(&metrics);
        let outbound = outbound.clone();
        let rings = Arc::clone(&rings);
        let spawned = std::thread::Builder::new()
            .name("oncilla-data".into())
            .spawn(move || {
                let until = Instant::now() + HANDSHAKE_DEADLINE;
                let served = open(stream, tls.as_ref(), until).and_then(|stream| {
                    Connection::new(stream, held, outbound, rings, metrics).run(
                        &admission,
                        ticket,
                        (&seats, &users),
                        until,
                    )
                });
                match served {
                    Ok(()) => tracing::debug!(%peer, "data connection closed"),
                    Err(e) => tracing::debug!(%peer, error = %e, "data connection ended"),
                }
            });
        match spawned {
            Ok(_) => backoff.ok(),
            Err(e) => std::thread::sleep(backoff.failed(&e)),
        }
    }
}

/// The accepted socket as the protocol speaks on it: itself, or the
/// plaintext end of a TLS tunnel whose handshake ended by `until`.
fn open(
    tcp: TcpStream,
    tls: Option<&Arc<rustls::ServerConfig>>,
    until: Instant,
) -> Result<DataStream, wire::WireError> {
    tcp.set_nodelay(true)?;
    // Read replies leave in steps the reader takes while they are in
    // cache; a speed-up only, so a socket that refuses it still serves.
    if let Err(e) = lowat::limit_unsent(&tcp) {
        tracing::debug!(error = %e, "data connection keeps the kernel's unsent limit");
    }
    Ok(match tls {
        Some(config) => tunnel::accept(tcp, config, until, STALL_DEADLINE)?,
        None => DataStream::Tcp(tcp),
    })
}

struct Connection {
    stream: DataStream,
    held: HeldTable,
    metrics: Arc<Transfers>,
    recv: RecvBuf,
    /// The agent's staging rings for device memory.
    rings: Arc<DeviceRings>,
    pulls: Pulls,
    puller: Puller,
    replicas: Replicas,
    replicator: Replicator,
    /// The peer is another agent copying a primary's writes (it presented
    /// the replicator credential): only it may send REPLICATE.
    from_primary: bool,
    /// What the client presented in its hello: a pull presents it to the
    /// source agent, so it reaches only what the client itself may.
    secret: Vec<u8>,
}

impl Connection {
    fn new(
        stream: DataStream,
        held: HeldTable,
        (pulls, replicas): (Pulls, Replicas),
        rings: Arc<DeviceRings>,
        metrics: Arc<Transfers>,
    ) -> Self {
        Self {
            stream,
            held,
            metrics,
            recv: RecvBuf::new(RECV_AHEAD),
            rings,
            pulls,
            puller: Puller::default(),
            replicas,
            replicator: Replicator::default(),
            from_primary: false,
            secret: Vec::new(),
        }
    }

    fn run(
        mut self,
        admission: &Admission,
        ticket: Ticket,
        (seats, users): (&Arc<Seats>, &Arc<Users>),
        until: Instant,
    ) -> Result<(), wire::WireError> {
        let dup = self.stream.as_fd().try_clone_to_owned()?;
        let mut secret = Vec::new();
        let mut from_primary = false;
        let seat = super::accept(
            &mut self.stream,
            admission,
            until,
            || ticket.heard(),
            |presented, who| {
                secret = presented.to_vec();
                from_primary = matches!(who, Principal::Session(id) if id == REPLICATOR);
                self.puller
                    .acting_for(who, credential::session_expiry(presented));
                let user = super::user_of(who);
                // The user's share first: past it, nobody's seat is taken.
                let share = users
                    .share(user)
                    .map_err(|_| "too many data connections from this user")?;
                let member = matches!(who, Principal::Member);
                Ok((seats.take(dup, member, "too many data connections")?, share))
            },
            |why| self.metrics.hello_refused(why),
        );
        self.secret = secret;
        self.from_primary = from_primary;
        drop(ticket);
        let Some(((mut seat, _share), _registered)) = seat? else {
            return Ok(());
        };
        // Once per connection: a reply the peer does not read, or a header
        // or payload it does not finish, makes no progress for this long
        // and ends the connection.
        self.stream.set_read_timeout(Some(STALL_DEADLINE))?;
        self.stream.set_write_timeout(Some(STALL_DEADLINE))?;
        let mut idle = Duration::ZERO;
        // A session's connection serves until its credential expired (once
        // idle) or, busy, until the grace past that: then the client dials
        // again with its renewed credential.
        let expires = credential::session_expiry(&self.secret);
        let past = |extra: Duration| {
            expires.is_some_and(|at| {
                credential::unix_now() > at.saturating_add((CLOCK_SKEW + extra).as_secs())
            })
        };
        loop {
            // Ask for a header and whatever small payload or further
            // pipelined headers came with it: one system call per small
            // request.
            let head = match self.recv.header::<REQUEST_LEN>(&self.stream, RECV_AHEAD) {
                Ok(h) => h,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) if timed_out(&e) && self.recv.buffered() == 0 => {
                    // Idle between requests (nothing of a header yet).
                    idle += STALL_DEADLINE;
                    if idle >= IDLE_LIMIT || past(Duration::ZERO) {
                        return Ok(());
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            idle = Duration::ZERO;
            if past(CONNECTION_GRACE) {
                // Unanswered: the client resends on a new connection.
                return Ok(());
            }
            seat.begin();
            let req = match Request::decode(&head) {
                Ok(r) => r,
                Err(e) => {
                    // The stream cannot be trusted past a bad header.
                    self.fail(Status::Internal, &e.to_string())?;
                    return Err(e);
                }
            };
            let started = Instant::now();
            self.serve_one(&req, started)?;
            seat.end();
        }
    }

    fn serve_one(&mut self, req: &Request, started: Instant) -> Result<(), wire::WireError> {
        // A pull's source record comes next: read first, so every refusal
        // below leaves the stream in step.
        let source = match req.op {
            Op::Pull => match self.read_source() {
                Ok(s) => Some(s),
                Err(e) => {
                    // The record's length cannot be trusted: the stream
                    // is out of step.
                    self.metrics.refused(Status::Internal);
                    self.fail(Status::Internal, &e.to_string())?;
                    return Err(e);
                }
            },
            Op::Read | Op::Write | Op::Replicate => None,
        };
        // A copy's stamp comes next (any 16 bytes are one).
        let mut stamp = [0u8; STAMP_LEN];
        if req.op == Op::Replicate {
            self.recv.read_exact(&self.stream, &mut stamp)?;
        }
        if req.len > wire::MAX_IO {
            let msg = format!(
                "request of {} bytes is above the {} byte limit",
                req.len,
                wire::MAX_IO
            );
            self.metrics.refused(Status::TooLarge);
            self.fail(Status::TooLarge, &msg)?;
            // A write's payload would follow; the stream is out of step now.
            return if req.op.carries_payload() {
                Err(io::Error::new(io::ErrorKind::InvalidData, msg).into())
            } else {
                Ok(())
            };
        }
        if req.op == Op::Replicate {
            return self.serve_replicate(req, Stamp::decode(&stamp), started);
        }
        let ok = match super::authorize(&self.held, req) {
            Ok(ok) => ok,
            Err((status, msg)) => return self.refuse(req, status, &msg),
        };
        let extent = &ok.held.extents[ok.extent];
        if extent.copy != 0 && req.op != Op::Read {
            let msg = format!(
                "bytes {}..{} of allocation {} are a replica here (copy {}): writes go to its primary; look the allocation up again",
                req.offset,
                req.offset.saturating_add(req.len),
                req.alloc_id,
                extent.copy
            );
            return self.refuse(req, Status::NotPrimary, &msg);
        }
        let len = usize::try_from(req.len).unwrap_or(0);
        let ptr = match &extent.memory {
            // `authorize` proved `ok.at + len` lies inside the extent.
            Backing::Pool(m) => m.ptr(extent.at + ok.at),
            Backing::Gpu(m) => return self.serve_gpu(req, source, &m.mem, ok.at, len, started),
            Backing::InProcess { gpu } => {
                let msg = format!(
                    "allocation {} is local GPU memory (GPU {gpu}) of the process that made it; only that process can copy to or from it",
                    req.alloc_id
                );
                return self.refuse(req, Status::NoSuchAllocation, &msg);
            }
        };
        // SAFETY: `authorize` proved [at, at+len) lies inside this extent,
        // and `ok.held` keeps it mapped (not freed or recycled) while
        // `memory` is used, below in this function; pool memory is never
        // seen through a Rust reference (other connections touch it
        // through raw pointers too).
        let memory = unsafe { Shared::new(ptr, len) };
        match req.op {
            Op::Read => {
                let head = Reply {
                    status: Status::Ok,
                    len: req.len,
                }
                .encode();
                self.metrics.read.served(len);
                // The kernel copies the bytes out before `send` returns.
                sock::send_by(&self.stream, &head, memory, deadline(len))?;
                self.metrics.read.took(started.elapsed());
            }
            Op::Write => {
                if let Err(e) = self.recv.read_into_by(&self.stream, memory, deadline(len)) {
                    // Some bytes may have landed: the replicas get the
                    // range as it now is, so the copies stay equal.
                    // The client is gone: its copies get a whole budget.
                    self.copy_landed(req, &ok.held, Instant::now() + COPY_WITHIN);
                    return Err(e.into());
                }
                self.metrics.write.served(len);
                // The client saw progress last as its last byte landed.
                self.ack_copied(req, &ok.held, Instant::now() + COPY_WITHIN)?;
                self.metrics.write.took(started.elapsed());
            }
            Op::Replicate => {
                return Err(io::Error::other("a replicate past its own path").into());
            }
            Op::Pull => {
                let Some(src) = source else {
                    return Err(io::Error::other("a pull without its source").into());
                };
                // Nothing to move: no source to dial.
                if len == 0 {
                    return self.ack_write();
                }
                // `ok.held` keeps the destination held until the pull ends.
                match self.puller.pull(&self.pulls, &self.secret, &src, memory) {
                    Ok(()) => {
                        self.metrics.pull.served(len);
                        // The client has waited silent since it asked.
                        self.ack_copied(req, &ok.held, started + COPY_WITHIN)?;
                        self.metrics.pull.took(started.elapsed());
                    }
                    Err((status, msg)) => {
                        // The client has waited since it asked: what
                        // time is left is all the copies get.
                        self.copy_landed(req, &ok.held, started + COPY_WITHIN);
                        self.metrics.refused(status);
                        self.fail(status, &msg)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads a pull's source record (its fixed part, then the address).
    fn read_source(&mut self) -> Result<Source, wire::WireError> {
        let mut head = [0u8; SOURCE_LEN];
        self.recv.read_exact(&self.stream, &mut head)?;
        let (src, n) = Source::decode_head(&head)?;
        let mut addr = [0u8; wire::MAX_ADDR];
        self.recv.read_exact(&self.stream, &mut addr[..n])?;
        src.with_addr(&addr[..n])
    }

    /// Device memory goes through a staging ring lent for the request
    /// ([`super::device`]): reads send the header once the first buffer is
    /// off the device, writes are acknowledged once every byte is on it,
    /// pulls fill it from the source agent a buffer at a time.
    fn serve_gpu(
        &mut self,
        req: &Request,
        source: Option<Source>,
        mem: &DeviceMem,
        at: u64,
        len: usize,
        started: Instant,
    ) -> Result<(), wire::WireError> {
        if req.op == Op::Pull && len == 0 {
            return self.ack_write();
        }
        // Pulls take rings of their own: a pull holds its ring while the
        // source (maybe this agent, maybe this GPU) serves the read, which
        // takes one of the others, so the two never wait on each other.
        let rings = Arc::clone(&self.rings);
        let pool = match req.op {
            Op::Pull => &rings.pulls,
            Op::Read | Op::Write => &rings.serve,
            // Replicas are host memory (`serve_replicate`).
            Op::Replicate => {
                return self.refuse(req, Status::Internal, "device memory has no replicas")
            }
        };
        let mut ring = match pool.take(mem.gpu().index(), RING_WAIT) {
            Ok(r) => r,
            Err(e) => return self.refuse(req, Status::Internal, &e.to_string()),
        };
        let failure = match req.op {
            Op::Read => {
                let head = Reply {
                    status: Status::Ok,
                    len: req.len,
                }
                .encode();
                let (stream, metrics) = (&self.stream, &self.metrics);
                let mut counted = false;
                // One deadline for the whole reply, as for pool memory: a
                // peer that reads a byte now and then cannot hold the ring.
                let by = deadline(len);
                let sent = device::read(&mut ring.download(mem, at), req.len, &head, |b| {
                    // Counted before the reply that completes it.
                    if !std::mem::replace(&mut counted, true) {
                        metrics.read.served(len);
                    }
                    sock::send_by(stream, b, &[][..], by)
                });
                match sent {
                    Ok(()) => {
                        self.metrics.read.took(started.elapsed());
                        return Ok(());
                    }
                    Err(f) => f,
                }
            }
            // (A REPLICATE was refused above.)
            Op::Write | Op::Replicate => {
                let (stream, recv) = (&self.stream, &mut self.recv);
                let by = deadline(len);
                match device::write(&mut ring.upload(mem, at), req.len, |buf| {
                    recv.read_exact_by(stream, buf, by)
                }) {
                    Ok(()) => {
                        self.metrics.write.served(len);
                        self.ack_write()?;
                        self.metrics.write.took(started.elapsed());
                        return Ok(());
                    }
                    Err(f) => f,
                }
            }
            Op::Pull => {
                let Some(src) = source else {
                    return Err(io::Error::other("a pull without its source").into());
                };
                let (puller, pulls, secret) = (&mut self.puller, &self.pulls, &self.secret);
                let pulled = device::pull(
                    &mut ring.upload(mem, at),
                    req.len,
                    |c, buf| {
                        let part = Source {
                            offset: src.offset.saturating_add(c.offset),
                            ..src.clone()
                        };
                        // SAFETY: `buf` is a staging buffer this request
                        // holds (lent ring), reached through no other
                        // reference while the pull fills it.
                        let into = unsafe { Shared::new(buf.as_mut_ptr(), buf.len()) };
                        puller.pull(pulls, secret, &part, into)
                    },
                    |e| (Status::Internal, e.to_string()),
                );
                drop(ring);
                return match pulled {
                    Ok(()) => {
                        self.metrics.pull.served(len);
                        self.ack_write()?;
                        self.metrics.pull.took(started.elapsed());
                        Ok(())
                    }
                    Err((status, msg)) => {
                        self.metrics.refused(status);
                        self.fail(status, &msg)
                    }
                };
            }
        };
        drop(ring);
        match failure {
            Failure::Device { error, unread } => {
                self.recv.skip(&self.stream, unread)?;
                self.metrics.refused(Status::Internal);
                self.fail(Status::Internal, &error.to_string())
            }
            Failure::Broken(e) => Err(e.into()),
        }
    }

    /// Acknowledges a write (or pull) whose bytes are in place here once
    /// every replica of a replicated allocation has them too; otherwise
    /// answers why not (the replicas that failed keep the range as missed).
    fn ack_copied(
        &mut self,
        req: &Request,
        held: &Held,
        by: Instant,
    ) -> Result<(), wire::WireError> {
        match self.copy(req, held, by) {
            Ok(()) => self.ack_write(),
            Err((status, msg)) => {
                self.metrics.refused(status);
                self.fail(status, &msg)
            }
        }
    }

    /// The range of a write or pull that failed part way, sent to the
    /// replicas as it now is (or noted as missed): no byte that landed here
    /// is left out of the other copies.
    fn copy_landed(&mut self, req: &Request, held: &Held, by: Instant) {
        if let Err((_, why)) = self.copy(req, held, by) {
            tracing::debug!(alloc_id = req.alloc_id, %why, "a failed write's range is left for the next write to copy");
        }
    }

    /// Sends `req`'s range of `held` to its replicas under the order lock
    /// (none for an allocation with one copy, unless it is moving), all of
    /// it by `by` (see [`COPY_WITHIN`]).
    fn copy(&mut self, req: &Request, held: &Held, by: Instant) -> Result<(), (Status, String)> {
        let copying = Arc::clone(&held.copying);
        let mut order = copying.order();
        self.replicator.copy_out(
            &self.replicas,
            &mut order,
            (req.alloc_id, held),
            (req.offset, req.len),
            by,
        )
    }

    /// A primary's copy of a write (REPLICATE): only from another agent
    /// (the replicator credential), only into ranges this node holds as a
    /// replica, received straight into them (they may be several pieces).
    fn serve_replicate(
        &mut self,
        req: &Request,
        stamp: Stamp,
        started: Instant,
    ) -> Result<(), wire::WireError> {
        if !self.from_primary {
            let msg = "only an allocation's primary agent may send REPLICATE";
            return self.refuse(req, Status::NoSuchAllocation, msg);
        }
        let lookup = |table: &HeldTable| {
            table
                .get(&req.alloc_id)
                .map(|e| Arc::clone(e.value()))
                .filter(|h| h.key_matches(&req.key))
        };
        let Some(copying) = lookup(&self.held).map(|h| Arc::clone(&h.copying)) else {
            let msg = self.held.not_held(req.alloc_id);
            return self.refuse(req, Status::NoSuchAllocation, &msg);
        };
        // One copy lands at a time, and never one older than what landed:
        // an older one (its primary gave up on it and sent it again, or
        // was replaced) is read and dropped. The ranges are looked at under
        // the lock: a promotion takes it too, so no copy lands in a range
        // once it is this node's primary share.
        let mut applied = copying.applied();
        let held = lookup(&self.held);
        let span = held.as_ref().and_then(|h| {
            h.span_for(req.offset, req.len)
                .filter(|span| h.extents[span.clone()].iter().all(|e| e.copy != 0))
        });
        let (Some(held), Some(span)) = (held, span) else {
            drop(applied);
            let msg = format!(
                "bytes {}..{} of allocation {} are not a replica held by this node",
                req.offset,
                req.offset.saturating_add(req.len),
                req.alloc_id
            );
            return self.refuse(req, Status::OutOfBounds, &msg);
        };
        let stamp = (stamp.sender, stamp.seq);
        let end = req.offset + req.len;
        for e in &held.extents[span] {
            let Backing::Pool(m) = &e.memory else {
                return self.refuse(req, Status::Internal, "only host memory is replicated");
            };
            let from = req.offset.max(e.alloc_offset);
            let to = end.min(e.alloc_offset + e.len);
            // `span_for` gave extents that each hold part of the range.
            let Some(n) = to.checked_sub(from).and_then(|n| usize::try_from(n).ok()) else {
                return Err(io::Error::other("a replica span outside its extents").into());
            };
            // Never an older copy, nor one from a replaced primary, in
            // this extent (each extent apart: its bytes may come from
            // another primary than its neighbour's).
            if !applied.admits(e.alloc_offset, stamp) {
                self.recv.skip(&self.stream, n as u64)?;
                continue;
            }
            // SAFETY: [from, to) lies inside extent `e` (clamped to it),
            // whose memory `held` keeps mapped until this function ends;
            // pool memory is only ever touched through raw pointers.
            let into = unsafe { Shared::new(m.ptr(e.at + (from - e.alloc_offset)), n) };
            self.recv.read_into_by(&self.stream, into, deadline(n))?;
            applied.landed(e.alloc_offset, stamp);
        }
        drop(applied);
        let len = usize::try_from(req.len).unwrap_or(0);
        self.metrics.write.served(len);
        self.ack_write()?;
        self.metrics.write.took(started.elapsed());
        Ok(())
    }

    /// Acknowledges a write whose bytes are all in place.
    fn ack_write(&mut self) -> Result<(), wire::WireError> {
        let head = Reply {
            status: Status::Ok,
            len: 0,
        }
        .encode();
        self.stream.write_all(&head)?;
        Ok(())
    }

    /// Refuses a request that passed the size check: a write's payload is
    /// read and dropped first, so the stream stays in step.
    fn refuse(&mut self, req: &Request, status: Status, msg: &str) -> Result<(), wire::WireError> {
        self.metrics.refused(status);
        if req.op.carries_payload() {
            self.recv.skip(&self.stream, req.len)?;
        }
        self.fail(status, msg)
    }

    fn fail(&mut self, status: Status, msg: &str) -> Result<(), wire::WireError> {
        let bytes = &msg.as_bytes()[..msg.len().min(wire::MAX_MESSAGE as usize)];
        let head = Reply {
            status,
            len: bytes.len() as u64,
        }
        .encode();
        sock::send(&self.stream, &head, bytes)?;
        Ok(())
    }
}

/// What a socket timeout looks like from a blocking call.
fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
