//! The primary's side of a replicated allocation: after a write (or a
//! pull) has landed in this node's memory, its bytes are copied to every
//! replica with REPLICATE requests, straight from pool memory, and the
//! client is answered only once each replica acknowledged them.
//!
//! The caller holds the allocation's order lock (`memory::copying`) across
//! [`Replicator::copy_out`], so every replica takes the writes in one order.
//! The bytes sent are the memory's at sending time: two writers to
//! overlapping bytes may have landed in either order, but the last copy
//! sent of each byte is sent after every write of it landed, so replicas
//! end equal to the primary. A replica that fails keeps its range in the
//! missed list; the next write sends it again first.
//!
//! A client's copies end within [`COPY_WITHIN`] of its last progress (a
//! replica not done by then keeps its range missed), so the client is
//! answered before it gives its connection up for dead.
//!
//! It owns the outbound connections (one per replica address per client
//! connection), dialing only the cluster's data addresses ([`Peers`]) and
//! presenting the agents' replicator credential. It never decides which
//! allocations are replicated, nor where.

use std::sync::Arc;
use std::time::{Duration, Instant};

use oncilla_net::credential::{NodeKeys, REPLICATOR};
use oncilla_net::tls::tunnel::DataStream;
use oncilla_net::tls::ClientTls;
use oncilla_net::wire::dial;
use oncilla_net::wire::sock::{self, Deadline, RecvBuf, Shared};
use oncilla_net::wire::{
    self, Op, Reply, Request, Stamp, Status, REPLY_LEN, REQUEST_LEN, STAMP_LEN,
};

use crate::memory::copying::Order;
use crate::memory::held::{Backing, Held, HeldTable};
use crate::peers::Peers;

/// How long connecting to a replica may take (and its TLS handshake as
/// long again).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A replica that makes no progress for this long fails the copy.
const STALL: Duration = Duration::from_secs(5);
/// How long a client's copies to all replicas may take, counted from the
/// client's last progress (a write's last byte landing here; a pull's
/// request, the client waiting silent through the pull). Every transfer
/// is held to it from its first call, and no replica is dialed or sent to
/// past it; what is not sent stays missed. Only a dial's greeting may run
/// past it, by at most [`STALL`] (see `dial_replica`). So a write is
/// answered within 25 s of its last byte, inside a client's 30 s
/// (`liboncilla`'s TCP `IO_TIMEOUT`), whatever the request's size and
/// however many replicas crawl; a pull's copies get what is left of its
/// request's 20 s. Fills hold the order lock at most this long per piece.
/// The wait for the allocation's order lock counts against it, but is not
/// bounded by it: the lock is not fair, so a write queued behind other
/// writers or a fill can wait longer (ARCHITECTURE.md, known limits).
pub const COPY_WITHIN: Duration = Duration::from_secs(20);
/// Least time left worth starting a dial with.
const DIAL_AT_LEAST: Duration = Duration::from_millis(10);
/// Why a replica was not sent to, or not dialed again: the copy's deadline
/// ([`COPY_WITHIN`], or a fill's) had passed.
const OUT_OF_TIME: &str =
    "out of time: the copy's deadline passed (the replica is slow or does not answer)";
/// How long a replicator credential is good for; a connection dials again
/// with a fresh one well before.
const CREDENTIAL_LIFETIME: u64 = 600;
/// Connections are dialed again after this (inside the lifetime).
const REDIAL_AFTER: u64 = 300;
/// Most bytes of missed ranges a client's write sends before its own, so
/// a replica far behind (being filled) never holds one write up long.
const MISSED_PER_WRITE: u64 = 8 << 20;
/// Bytes a fill sends per hold of the order lock: writes go on between.
const FILL_PIECE: u64 = 16 << 20;

/// What every copy of this agent shares: where it may dial, how, and the
/// keys that make its credential.
#[derive(Debug, Clone)]
pub struct Replicas {
    pub peers: Arc<Peers>,
    /// The cluster CA, when data ports speak TLS.
    pub tls: Option<ClientTls>,
    pub keys: Arc<NodeKeys>,
}

/// A client connection's outbound side for copies.
#[derive(Default)]
pub struct Replicator {
    open: Vec<Outbound>,
}

struct Outbound {
    addr: String,
    stream: DataStream,
    recv: RecvBuf,
    dialed: u64,
}

impl Replicator {
    /// Copies `[offset, offset + len)` of `held` (this node's primary
    /// ranges in it) to each of `order`'s replicas, the part each holds,
    /// after the ranges it missed, all by `by` (see [`COPY_WITHIN`]). Call
    /// it with the order lock held (`order`); with no replica left it has
    /// nothing to do.
    ///
    /// # Errors
    /// The refusal to answer the client: the replicas that did not take
    /// the copy, and why. Their ranges are noted as missed.
    pub fn copy_out(
        &mut self,
        replicas: &Replicas,
        order: &mut Order,
        (alloc_id, held): (u64, &Held),
        (offset, len): (u64, u64),
        by: Instant,
    ) -> Result<(), (Status, String)> {
        let mut failed = Vec::new();
        for replica in &order.replicas.clone() {
            let addr = &replica.data_addr;
            let mut pending = order.take_missed(addr, MISSED_PER_WRITE);
            pending.extend(replica.parts_of([(offset, len)]));
            if pending.is_empty() {
                continue;
            }
            let to = To {
                replicas,
                sender: order.sender,
                addr,
                alloc_id,
                held,
                by,
            };
            if let Err(why) = self.send_or_miss(&to, order, &pending) {
                failed.push(format!("{addr}: {why}"));
            }
        }
        if failed.is_empty() {
            return Ok(());
        }
        Err((
            Status::Internal,
            format!(
                "the write is in the primary but not in every replica ({}); write it again",
                failed.join("; ")
            ),
        ))
    }

    /// Sends `ranges` to `to`'s replica in order; on a failure, the ranges
    /// from the failed one on are noted missed again. Returns the bytes
    /// sent.
    fn send_or_miss(
        &mut self,
        to: &To<'_>,
        order: &mut Order,
        ranges: &[(u64, u64)],
    ) -> Result<u64, String> {
        let mut sent = 0;
        for (i, &(offset, len)) in ranges.iter().enumerate() {
            if let Err(why) = self.send_range(to, &mut order.seq, offset, len) {
                for &(o, l) in &ranges[i..] {
                    order.miss(to.addr, o, l);
                }
                return Err(why);
            }
            sent += len;
        }
        Ok(sent)
    }

    /// Sends this node's primary bytes in `[offset, offset + len)` to
    /// `addr`, piece by piece, each acknowledged before the next.
    fn send_range(
        &mut self,
        to: &To<'_>,
        seq: &mut u64,
        offset: u64,
        len: u64,
    ) -> Result<(), String> {
        let end = offset.saturating_add(len);
        for e in to.held.extents.iter().filter(|e| e.copy == 0) {
            let (from, until) = (offset.max(e.alloc_offset), end.min(e.alloc_offset + e.len));
            let Backing::Pool(m) = &e.memory else {
                return Err("only host memory is replicated".into());
            };
            let mut at = from;
            while at < until {
                let n = (until - at).min(wire::MAX_IO);
                let n_usize = usize::try_from(n).map_err(|e| e.to_string())?;
                // SAFETY: [at, at + n) lies inside extent `e` (clamped to
                // it above), whose memory `held` keeps mapped for as long
                // as the caller holds it (this call).
                let data = unsafe { Shared::new(m.ptr(e.at + (at - e.alloc_offset)), n_usize) };
                *seq += 1;
                let stamp = Stamp {
                    sender: to.sender,
                    seq: *seq,
                };
                self.send_one(to, stamp, at, data)?;
                at += n;
            }
        }
        Ok(())
    }

    /// One REPLICATE request and its acknowledgement, on the kept
    /// connection to `addr` (dialed again once when a kept one turns out
    /// closed before answering).
    fn send_one(
        &mut self,
        to: &To<'_>,
        stamp: Stamp,
        offset: u64,
        data: Shared<'_>,
    ) -> Result<(), String> {
        let To {
            replicas,
            addr,
            alloc_id,
            held,
            by,
            ..
        } = *to;
        if Instant::now() >= by {
            return Err(OUT_OF_TIME.into());
        }
        let now = oncilla_net::credential::unix_now();
        let kept = self
            .open
            .iter()
            .position(|o| o.addr == addr && now < o.dialed + REDIAL_AFTER)
            .map(|i| self.open.swap_remove(i));
        let fresh = kept.is_none();
        let mut out = match kept {
            Some(o) => o,
            None => dial_replica(replicas, addr, by)?,
        };
        let req = Request {
            op: Op::Replicate,
            alloc_id,
            key: held.key,
            offset,
            len: data.len() as u64,
        };
        let result = match exchange(&mut out, &req, stamp, data, by) {
            // The same stamp again: whichever lands first, the other is
            // refused as no later.
            // Only with time for a dial: else the first failure is the
            // one to report.
            Err(Lost::BeforeReply(_)) if !fresh && dial_time(by).is_some() => {
                out = dial_replica(replicas, addr, by)?;
                exchange(&mut out, &req, stamp, data, by)
            }
            r => r,
        };
        match result {
            Ok(()) => {
                self.open.push(out);
                Ok(())
            }
            // Refused in step: the connection is still good.
            Err(Lost::Refused(why)) => {
                self.open.push(out);
                Err(why)
            }
            Err(Lost::BeforeReply(why) | Lost::After(why)) => Err(why),
        }
    }
}

/// Brings the replica at `addr` up to this primary's bytes of allocation
/// `alloc_id`: sends every range it missed (a new replica: all it holds), [`FILL_PIECE`] at a time under the order lock, so client writes
/// go on between pieces and each piece is of the memory at sending time.
/// Returns the bytes sent.
///
/// # Errors
/// The allocation is gone or not replicated here, `addr` is no longer one
/// of its replicas, the replica failed (what was not sent stays missed),
/// or `deadline` passed.
pub fn fill(
    replicas: &Replicas,
    table: &HeldTable,
    alloc_id: u64,
    addr: &str,
    deadline: Instant,
) -> Result<u64, String> {
    let mut r = Replicator::default();
    let mut sent = 0;
    loop {
        let held = table
            .get(&alloc_id)
            .map(|e| Arc::clone(e.value()))
            .ok_or("the allocation is gone")?;
        let copying = Arc::clone(&held.copying);
        let mut order = copying.order();
        if order.replica(addr).is_none() {
            return Err(format!("{addr} is no longer a replica of it"));
        }
        let piece = order.take_missed(addr, FILL_PIECE);
        if piece.is_empty() {
            return Ok(sent);
        }
        if Instant::now() > deadline {
            for &(o, l) in &piece {
                order.miss(addr, o, l);
            }
            return Err("the fill took too long".into());
        }
        let to = To {
            replicas,
            sender: order.sender,
            addr,
            alloc_id,
            held: &held,
            // One piece holds the order lock (and client writes) no
            // longer than a client's copies may take.
            by: deadline.min(Instant::now() + COPY_WITHIN),
        };
        sent += r.send_or_miss(&to, &mut order, &piece)?;
    }
}

/// Where one copy goes: which allocation, from which memory, to which
/// replica.
#[derive(Clone, Copy)]
struct To<'a> {
    replicas: &'a Replicas,
    /// The primary share's sender id in stamps.
    sender: u64,
    addr: &'a str,
    alloc_id: u64,
    held: &'a Held,
    /// When every piece must be over.
    by: Instant,
}

/// How an exchange failed.
enum Lost {
    /// The connection failed before any reply (a kept one may be stale).
    BeforeReply(String),
    /// It failed after a reply began: it is out of step.
    After(String),
    /// The replica refused the copy, with its message.
    Refused(String),
}

/// Dials the replica at `addr` by `by`: an address not heard of waits no
/// later than `by`, the connection and the TLS handshake get a quarter of
/// what is left each, and the greeting the connection's stall time
/// ([`STALL`], which the connection keeps for its life, TLS tunnel
/// included).
fn dial_replica(replicas: &Replicas, addr: &str, by: Instant) -> Result<Outbound, String> {
    if !replicas.peers.admits_by(addr, Some(by)) {
        return Err(format!(
            "{addr:?} is not the data address of any node of this cluster"
        ));
    }
    let Some(quarter) = dial_time(by) else {
        return Err(OUT_OF_TIME.into());
    };
    let now = oncilla_net::credential::unix_now();
    let secret = replicas.keys.session(REPLICATOR, now + CREDENTIAL_LIFETIME);
    let stream = dial::dial(
        addr,
        replicas.tls.as_ref(),
        secret.as_bytes(),
        CONNECT_TIMEOUT.min(quarter),
        STALL,
    )
    .map_err(|e| format!("cannot reach it: {e}"))?;
    Ok(Outbound {
        addr: addr.to_string(),
        stream,
        recv: RecvBuf::new(REPLY_LEN + wire::MAX_MESSAGE as usize),
        dialed: now,
    })
}

/// What each of a dial's waits may take to be over by `by`: a quarter of
/// what is left, or `None` when that is too little to start one.
fn dial_time(by: Instant) -> Option<Duration> {
    Some(by.saturating_duration_since(Instant::now()) / 4).filter(|q| *q >= DIAL_AT_LEAST)
}

/// Sends `req`, its stamp and its payload, then reads the reply; each
/// step by its own deadline or `by`, whichever comes first.
fn exchange(
    out: &mut Outbound,
    req: &Request,
    stamp: Stamp,
    data: Shared<'_>,
    by: Instant,
) -> Result<(), Lost> {
    let within = |n: usize| Deadline::for_transfer(n, STALL).cut_to(by);
    let n = data.len();
    let mut head = [0u8; REQUEST_LEN + STAMP_LEN];
    head[..REQUEST_LEN].copy_from_slice(&req.encode());
    head[REQUEST_LEN..].copy_from_slice(&stamp.encode());
    sock::send_by(&out.stream, &head, data, within(n))
        .map_err(|e| Lost::BeforeReply(format!("connection lost: {e}")))?;
    let mut answer = [0u8; REPLY_LEN];
    out.recv
        .read_exact_by(&out.stream, &mut answer, within(0))
        .map_err(|e| Lost::BeforeReply(format!("no answer: {e}")))?;
    let reply = Reply::decode(&answer).map_err(|e| Lost::After(e.to_string()))?;
    if reply.status == Status::Ok {
        return Ok(());
    }
    let m = usize::try_from(reply.len.min(wire::MAX_MESSAGE)).unwrap_or(0);
    let mut msg = vec![0u8; m];
    out.recv
        .read_exact_by(&out.stream, &mut msg, within(m))
        .map_err(|e| Lost::After(format!("connection lost: {e}")))?;
    Err(Lost::Refused(format!(
        "refused: {}",
        String::from_utf8_lossy(&msg)
    )))
}
