//! Third-party copies: a PULL fills bytes of an allocation held here from
//! another agent's data port, this agent reading them itself, so the bytes
//! never pass through the client that asked (`Oncilla::copy` between two
//! allocations on other nodes).
//!
//! It owns the outbound side: dialing only the cluster's data addresses
//! ([`Peers`]), presenting the asking client's own secret (the source agent
//! checks it, and the source's access key, as for any client: a pull
//! reaches nothing the client could not read itself), the one outbound
//! connection each client connection keeps, and the pipelined reads
//! straight into pool memory. It never checks the destination: the data
//! server authorized it, and holds it for the whole pull.

use std::sync::Arc;
use std::time::Duration;

use oncilla_proto::tls::tunnel::DataStream;
use oncilla_proto::tls::ClientTls;
use oncilla_proto::wire::dial::{self, DialError};
use oncilla_proto::wire::sock::{self, RecvBuf, Shared};
use oncilla_proto::wire::{self, Op, Reply, Request, Source, Status, REPLY_LEN};

use crate::peers::Peers;

/// Most bytes one read from the source asks for; a pull is cut into
/// reads of this size, all sent at once and answered in order.
pub const READ: usize = 4 << 20;
/// How long dialing a source may take, TLS included.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a pull naming an address the master has not told of waits for
/// the next membership update (a node that has just joined).
const JOIN_WAIT: Duration = Duration::from_secs(2);

/// What every pull of this agent shares: where it may dial and how.
#[derive(Debug, Clone)]
pub struct Pulls {
    pub peers: Arc<Peers>,
    /// The cluster CA, when data ports speak TLS.
    pub tls: Option<ClientTls>,
    /// A reply or payload of the source that makes no progress for this
    /// long ends the pull.
    pub stall: Duration,
}

/// A client connection's outbound side: the connection its last pull
/// opened, kept for the next one to the same address.
#[derive(Default)]
pub struct Puller {
    open: Option<Outbound>,
}

struct Outbound {
    addr: String,
    stream: DataStream,
    recv: RecvBuf,
}

/// Why a pull failed: the status and message the client is answered.
pub type Refusal = (Status, String);

impl Puller {
    /// Fills `dst` with `dst.len()` bytes of `src`, read from its agent
    /// with `secret` (the client's). On any failure the outbound
    /// connection is dropped, so a half-read stream is never reused.
    ///
    /// # Errors
    /// The refusal to answer: an address that is no node's data port, a
    /// source that cannot be reached, or the source agent's own refusal
    /// (no such allocation, out of bounds) with its message.
    pub fn pull(
        &mut self,
        pulls: &Pulls,
        secret: &[u8],
        src: &Source,
        dst: Shared<'_>,
    ) -> Result<(), Refusal> {
        if !pulls.peers.admits(&src.addr, JOIN_WAIT) {
            return Err((
                Status::NoSuchAllocation,
                format!(
                    "pull source {:?} is not the data address of any node of this cluster",
                    src.addr
                ),
            ));
        }
        let mut out = match self.open.take() {
            Some(o) if o.addr == src.addr => o,
            _ => dial_source(pulls, secret, &src.addr)?,
        };
        let outcome = read_all(pulls, &mut out, src, dst);
        if outcome.is_ok() {
            self.open = Some(out);
        }
        outcome
    }
}

fn dial_source(pulls: &Pulls, secret: &[u8], addr: &str) -> Result<Outbound, Refusal> {
    let stream = dial::dial(
        addr,
        pulls.tls.as_ref(),
        secret,
        CONNECT_TIMEOUT,
        pulls.stall,
    )
    .map_err(|e| match e {
        DialError::Denied(msg) => (
            Status::NoSuchAllocation,
            format!("pull source {addr} refused the connection: {msg}"),
        ),
        DialError::Unreachable(msg) | DialError::BadVersion(msg) => (
            Status::Internal,
            format!("pull source {addr} unreachable: {msg}"),
        ),
    })?;
    Ok(Outbound {
        addr: addr.to_string(),
        stream,
        recv: RecvBuf::new(REPLY_LEN + wire::MAX_MESSAGE as usize),
    })
}

/// Sends every read of the pull, then receives each reply straight into
/// its part of `dst`, in order.
fn read_all(
    pulls: &Pulls,
    out: &mut Outbound,
    src: &Source,
    dst: Shared<'_>,
) -> Result<(), Refusal> {
    let lost = |e: std::io::Error| {
        (
            Status::Internal,
            format!("pull source {}: connection lost: {e}", src.addr),
        )
    };
    let len = dst.len();
    let reads = len.div_ceil(READ);
    let mut heads = Vec::with_capacity(reads * wire::REQUEST_LEN);
    for i in 0..reads {
        let at = i * READ;
        let n = (len - at).min(READ);
        heads.extend_from_slice(
            &Request {
                op: Op::Read,
                alloc_id: src.alloc_id,
                key: src.key,
                offset: src
                    .offset
                    .checked_add(at as u64)
                    .ok_or_else(|| (Status::OutOfBounds, "pull source offset overflows".into()))?,
                len: n as u64,
            }
            .encode(),
        );
    }
    // At most MAX_IO / READ headers (a few hundred bytes): the socket takes
    // them while the source answers.
    sock::send(&out.stream, &heads, &[][..]).map_err(lost)?;
    for i in 0..reads {
        let at = i * READ;
        let n = (len - at).min(READ);
        let head = out
            .recv
            .header::<REPLY_LEN>(&out.stream, REPLY_LEN)
            .map_err(lost)?;
        let reply = Reply::decode(&head)
            .map_err(|e| (Status::Internal, format!("pull source {}: {e}", src.addr)))?;
        if reply.status != Status::Ok {
            let mut msg = vec![0u8; usize::try_from(reply.len.min(wire::MAX_MESSAGE)).unwrap_or(0)];
            out.recv.read_exact(&out.stream, &mut msg).map_err(lost)?;
            let status = match reply.status {
                Status::NoSuchAllocation | Status::BadKey => Status::NoSuchAllocation,
                Status::OutOfBounds => Status::OutOfBounds,
                _ => Status::Internal,
            };
            return Err((
                status,
                format!("pull source: {}", String::from_utf8_lossy(&msg)),
            ));
        }
        if reply.len != n as u64 {
            return Err((
                Status::Internal,
                format!(
                    "pull source {} sent {} bytes, asked for {n}",
                    src.addr, reply.len
                ),
            ));
        }
        let part = dst
            .part(at, n)
            .ok_or_else(|| (Status::Internal, "pull read outside its range".into()))?;
        out.recv
            .read_into_by(
                &out.stream,
                part,
                sock::Deadline::for_transfer(n, pulls.stall),
            )
            .map_err(lost)?;
    }
    Ok(())
}
