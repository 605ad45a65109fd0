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

use oncilla_net::tls::tunnel::DataStream;
use oncilla_net::tls::ClientTls;
use oncilla_net::wire::dial::{self, DialError};
use oncilla_net::wire::sock::{self, Deadline, RecvBuf, Shared};
use oncilla_net::wire::{self, Op, Reply, Request, Source, Status, REPLY_LEN};

use oncilla_net::credential::{NodeKeys, Principal, CONNECTION_GRACE};

use super::pace::Pace;
use crate::peers::Peers;

/// Most bytes one read from the source asks for; a pull is cut into
/// reads of this size, all sent at once and answered in order.
pub const READ: usize = 4 << 20;
/// How long dialing a source may take, TLS included.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A source that makes no progress for this long ends the pull, and every
/// read has this plus its length at [`sock::MIN_RATE`]: with the wait for
/// an address ([`crate::peers::MAX_WAIT`]) and the dial, a pull of 4 MiB
/// (what clients send: their `PULL_CHUNK`) ends within 22 s of its turn
/// ([`super::pace::MAX_WAIT`]), and is answered within 27 s of its request,
/// its copies to replicas included ([`super::replicate::COPY_WITHIN`]):
/// inside a client's 30 s.
pub const STALL: Duration = Duration::from_secs(5);

/// What every pull of this agent shares: where it may dial and how, and
/// each user's pace.
#[derive(Debug, Clone)]
pub struct Pulls {
    pub peers: Arc<Peers>,
    /// The cluster CA, when data ports speak TLS.
    pub tls: Option<ClientTls>,
    pub pace: Arc<Pace>,
    /// Makes a session's credential for each pull (`None`: present what
    /// the client did).
    pub mint: Option<Arc<NodeKeys>>,
}

/// A client connection's outbound side: the connection its last pull
/// opened, kept for the next one to the same address, and whose pulls
/// they are.
#[derive(Default)]
pub struct Puller {
    open: Option<Outbound>,
    /// The user the client's session names (`None`: an operator).
    user: Option<u32>,
    /// The client's session (`None`: an operator, with the token), and
    /// when its credential expired.
    session: Option<(String, u64)>,
}

struct Outbound {
    addr: String,
    stream: DataStream,
    recv: RecvBuf,
}

/// Why a pull failed: the status and message the client is answered.
pub type Refusal = (Status, String);

/// A failed read of a pull; `replied` once any reply arrived (a reused
/// connection that failed before that was stale, and is dialed again).
struct Failed {
    refusal: Refusal,
    replied: bool,
}

impl Puller {
    /// Pulls of this connection act for `who`, whose credential (for a
    /// session) expires at `expires`.
    pub fn acting_for(&mut self, who: &Principal, expires: Option<u64>) {
        self.user = super::user_of(who);
        self.session = match (who, expires) {
            (Principal::Session(id), Some(at)) => Some((id.clone(), at)),
            _ => None,
        };
    }

    /// What a pull presents to its source: a session's credential good for
    /// as long as the client's connection may serve (its expiry and the
    /// grace: the connection may outlive what it presented, never that),
    /// else what the client presented (the token).
    fn secret(&self, pulls: &Pulls, presented: &[u8]) -> Vec<u8> {
        match (&self.session, &pulls.mint) {
            (Some((id, expires)), Some(keys)) => keys
                .session(id, expires.saturating_add(CONNECTION_GRACE.as_secs()))
                .as_bytes()
                .to_vec(),
            _ => presented.to_vec(),
        }
    }

    /// Fills `dst` with `dst.len()` bytes of `src`, read from its agent
    /// with `secret` (the client's). A kept connection that turns out
    /// closed before its first reply (the source dropped it: idle, or its
    /// seat was taken) is replaced once; on any other failure the
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
        let _turn = pulls
            .pace
            .admit(self.user, dst.len() as u64)
            .map_err(|msg| (Status::Busy, msg))?;
        if !pulls.peers.admits(&src.addr) {
            return Err((
                Status::Internal,
                format!(
                    "pull source {:?} is not the data address of any node of this cluster",
                    src.addr
                ),
            ));
        }
        let secret = &self.secret(pulls, secret);
        let (mut out, mut kept) = match self.open.take() {
            Some(o) if o.addr == src.addr => (o, true),
            _ => (dial_source(pulls, secret, &src.addr)?, false),
        };
        loop {
            match read_all(&mut out, src, dst) {
                Ok(()) => {
                    self.open = Some(out);
                    return Ok(());
                }
                Err(Failed { replied: false, .. }) if kept => {
                    out = dial_source(pulls, secret, &src.addr)?;
                    kept = false;
                }
                Err(f) => return Err(f.refusal),
            }
        }
    }
}

fn dial_source(pulls: &Pulls, secret: &[u8], addr: &str) -> Result<Outbound, Refusal> {
    let stream = dial::dial(addr, pulls.tls.as_ref(), secret, CONNECT_TIMEOUT, STALL).map_err(
        |e| match e {
            DialError::Denied(msg) => (
                Status::Internal,
                format!("pull source {addr} refused the connection: {msg}"),
            ),
            DialError::Busy(msg) => (
                Status::Busy,
                format!("pull source {addr} is at its bound for this agent: {msg}"),
            ),
            DialError::Unreachable(msg) | DialError::BadVersion(msg) => (
                Status::Internal,
                format!("pull source {addr} unreachable: {msg}"),
            ),
        },
    )?;
    Ok(Outbound {
        addr: addr.to_string(),
        stream,
        recv: RecvBuf::new(REPLY_LEN + wire::MAX_MESSAGE as usize),
    })
}

/// Receives `len` bytes into `into` within a transfer's deadline.
fn receive(out: &mut Outbound, into: Shared<'_>) -> std::io::Result<()> {
    let n = into.len();
    out.recv
        .read_into_by(&out.stream, into, Deadline::for_transfer(n, STALL))
}

/// Sends every read of the pull, then receives each reply straight into
/// its part of `dst`, in order.
fn read_all(out: &mut Outbound, src: &Source, dst: Shared<'_>) -> Result<(), Failed> {
    let mut replied = false;
    let fail = |replied: bool, status: Status, msg: String| Failed {
        refusal: (status, msg),
        replied,
    };
    let lost = |replied: bool, e: std::io::Error| {
        fail(
            replied,
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
        let offset = src.offset.checked_add(at as u64).ok_or_else(|| {
            fail(
                true,
                Status::OutOfBounds,
                "pull source offset overflows".into(),
            )
        })?;
        heads.extend_from_slice(
            &Request {
                op: Op::Read,
                alloc_id: src.alloc_id,
                key: src.key,
                offset,
                len: n as u64,
            }
            .encode(),
        );
    }
    // At most MAX_IO / READ headers (a few hundred bytes): the socket takes
    // them while the source answers.
    sock::send(&out.stream, &heads, &[][..]).map_err(|e| lost(false, e))?;
    for i in 0..reads {
        let at = i * READ;
        let n = (len - at).min(READ);
        let mut head = [0u8; REPLY_LEN];
        // SAFETY: `head` is a local array, reached through no reference
        // while the receive writes it.
        let into = unsafe { Shared::new(head.as_mut_ptr(), REPLY_LEN) };
        receive(out, into).map_err(|e| lost(replied, e))?;
        replied = true;
        let reply = Reply::decode(&head).map_err(|e| {
            fail(
                true,
                Status::Internal,
                format!("pull source {}: {e}", src.addr),
            )
        })?;
        if reply.status != Status::Ok {
            let mut msg = [0u8; wire::MAX_MESSAGE as usize];
            let m = usize::try_from(reply.len.min(wire::MAX_MESSAGE)).unwrap_or(0);
            // SAFETY: as `head`, for the first `m` bytes of `msg`.
            let into = unsafe { Shared::new(msg.as_mut_ptr(), m) };
            receive(out, into).map_err(|e| lost(true, e))?;
            let status = match reply.status {
                Status::NoSuchAllocation | Status::BadKey => Status::NoSuchAllocation,
                Status::OutOfBounds => Status::OutOfBounds,
                _ => Status::Internal,
            };
            return Err(fail(
                true,
                status,
                format!("pull source: {}", String::from_utf8_lossy(&msg[..m])),
            ));
        }
        if reply.len != n as u64 {
            return Err(fail(
                true,
                Status::Internal,
                format!(
                    "pull source {} sent {} bytes, asked for {n}",
                    src.addr, reply.len
                ),
            ));
        }
        let part = dst
            .part(at, n)
            .ok_or_else(|| fail(true, Status::Internal, "pull read outside its range".into()))?;
        receive(out, part).map_err(|e| lost(true, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A source agent that answers every READ with `len` bytes of `seed`,
    /// closing each connection after `per_conn` requests.
    fn source_agent(per_conn: usize, conns: usize) -> (String, std::thread::JoinHandle<usize>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let mut served = 0;
            for _ in 0..conns {
                let (mut s, _) = l.accept().unwrap();
                wire::read_hello(&mut s).unwrap();
                wire::write_welcome(&mut s, wire::Welcome::Ok, "").unwrap();
                for _ in 0..per_conn {
                    let mut head = [0u8; wire::REQUEST_LEN];
                    s.read_exact(&mut head).unwrap();
                    let req = Request::decode(&head).unwrap();
                    let reply = Reply {
                        status: Status::Ok,
                        len: req.len,
                    };
                    s.write_all(&reply.encode()).unwrap();
                    s.write_all(&vec![req.offset as u8; req.len as usize])
                        .unwrap();
                    served += 1;
                }
            }
            served
        });
        (addr, t)
    }

    #[test]
    fn a_kept_connection_the_source_closed_is_replaced_once() {
        // The source closes each connection after one request: the second
        // pull finds its kept connection dead before any reply and dials
        // again.
        let (addr, agent) = source_agent(1, 2);
        let peers = Arc::new(Peers::default());
        peers.set(1, [addr.clone()]);
        let pulls = Pulls {
            peers,
            tls: None,
            pace: Pace::new(None),
            mint: None,
        };
        let mut puller = Puller::default();
        let src = |offset| Source {
            alloc_id: 1,
            key: [0; 16],
            offset,
            addr: addr.clone(),
        };
        let mut dst = vec![0u8; 8192];
        for offset in [7, 9] {
            // SAFETY: `dst` is a local buffer reached through no reference
            // while the pull fills it.
            let into = unsafe { Shared::new(dst.as_mut_ptr(), dst.len()) };
            puller.pull(&pulls, b"secret", &src(offset), into).unwrap();
            assert!(dst.iter().all(|&b| b == offset as u8), "pull at {offset}");
        }
        drop(puller);
        assert_eq!(agent.join().unwrap(), 2);
    }

    #[test]
    fn an_address_that_is_no_peer_is_never_dialed() {
        let bait = TcpListener::bind("127.0.0.1:0").unwrap();
        bait.set_nonblocking(true).unwrap();
        let peers = Arc::new(Peers::default());
        peers.heartbeat(Duration::from_millis(1));
        peers.set(1, ["127.0.0.1:1".to_string()]);
        let pulls = Pulls {
            peers,
            tls: None,
            pace: Pace::new(None),
            mint: None,
        };
        let mut dst = [0u8; 16];
        // SAFETY: as above.
        let into = unsafe { Shared::new(dst.as_mut_ptr(), dst.len()) };
        let src = Source {
            alloc_id: 1,
            key: [0; 16],
            offset: 0,
            addr: bait.local_addr().unwrap().to_string(),
        };
        let (status, msg) = Puller::default()
            .pull(&pulls, b"secret", &src, into)
            .unwrap_err();
        assert_eq!(status, Status::Internal);
        assert!(msg.contains("not the data address"), "{msg}");
        assert!(bait.accept().is_err(), "the bait was dialed");
    }
}
