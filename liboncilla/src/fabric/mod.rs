//! The data path: plans "copy these bytes of this allocation" once —
//! each piece resolved to where it goes now ([`DataPath::resolve`], from
//! the extent's route, [`crate::route`]) and grouped by node — then each
//! transport shapes its groups into its own work ([`tcp::work`]: requests
//! dealt over connections; [`verbs::work`]: places in registered regions)
//! and runs it through the [`Transport`] that shm, TCP and verbs each
//! implement, all nodes in parallel.
//!
//! It never talks to the master or the agent's control socket and never
//! chooses a fabric: the routes, decided when the allocation was opened,
//! say how each extent is reached. It is private to the crate; the public
//! API ([`crate::Oncilla`], [`crate::Operator`]) is the way in.

pub(crate) mod shm;
pub(crate) mod tcp;
pub(crate) mod verbs;

use std::io::{Read, Write};

use oncilla_model::fabric::Rdma;
use oncilla_net::credential::{Credential, Renewable};
use oncilla_net::tls::ClientTls;
use oncilla_net::wire::dial;

use crate::descriptor::{Descriptor, Extent};
use crate::error::{Error, Result};
use crate::options::RdmaOptions;
use crate::route::{Hop, Route};
use shm::{Lease, Mapping, Memcpy};
pub use tcp::{streams_for, STREAM_MIN};
use tcp::{Chunk, IoBuf, TcpFabric};
use verbs::plan::Remote;
use verbs::Verbs;

/// Moves the pieces of copies between caller memory and one node's memory
/// on the calling thread. Shared memory, TCP and verbs implement it; the
/// data path plans the pieces and runs one call per node (per connection
/// for TCP) in parallel.
pub(crate) trait Transport: Sync {
    /// One piece in the form this transport moves it.
    type Piece<'a>;

    /// Moves every piece, all held by `to`; returns once each is complete
    /// (a write's bytes are then in the holder's memory).
    ///
    /// # Errors
    /// The first failure; the transport names the node.
    fn execute(&self, to: Peer<'_>, pieces: &mut [Self::Piece<'_>]) -> Result<()>;
}

/// The node a transport call goes to: its name, the address the transport
/// uses (data port for TCP, agent for verbs, none for shm) and the
/// allocation (verbs keys are per allocation).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer<'a> {
    pub node: &'a str,
    pub addr: &'a str,
    pub alloc: u64,
}

/// An opened allocation as the data path needs it: the descriptor, the
/// route of each extent, and this node's extents mapped.
#[derive(Clone, Copy)]
pub(crate) struct Target<'a> {
    pub desc: &'a Descriptor,
    pub routes: &'a [Route],
    pub local: Option<&'a Mapping>,
}

/// One copy between caller memory and an allocation: `buf` is read from
/// (write) or filled (read) at allocation offset `offset`.
pub(crate) struct Transfer<'a> {
    pub target: Target<'a>,
    pub offset: u64,
    pub buf: IoBuf<'a>,
}

/// One piece of a copy, resolved: the extent that holds it, where it
/// starts in the allocation, its length, the extent's route and where the
/// piece goes now.
pub(crate) struct Resolved<'a> {
    pub extent: &'a Extent,
    pub at: u64,
    pub len: u64,
    pub route: Route,
    pub reach: Reach,
}

/// Where a resolved piece goes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// This process's mapping of the extent, at this address (valid while
    /// the allocation's handle is borrowed).
    Mapped(*mut u8),
    Tcp,
    Verbs,
}

/// Moves bytes between local memory and allocations.
pub(crate) struct DataPath {
    tcp: TcpFabric,
    verbs: Verbs,
    streams: usize,
}

/// A node's share of a copy as the planner leaves it, transport-neutral:
/// its pieces in order and how they go (TCP to its data port, or verbs
/// through its agent for one allocation). Each transport turns a group
/// into its own work ([`tcp::work`], [`verbs::work`]).
struct Group<'a> {
    node: &'a str,
    addr: &'a str,
    bytes: u64,
    /// `Some((agent address, allocation id))` for work over verbs.
    rdma: Option<(&'a str, u64)>,
    pieces: Vec<Piece<'a>>,
}

/// One piece of a copy to a node: the allocation's descriptor, the extent
/// that holds the piece, where it starts in the allocation, and the
/// caller's bytes.
pub(crate) struct Piece<'a> {
    pub desc: &'a Descriptor,
    pub extent: &'a Extent,
    pub at: u64,
    pub buf: IoBuf<'a>,
}

/// One thread's work in [`DataPath::run`].
enum Job<'s, 'a> {
    Tcp(Peer<'a>, &'s mut [Chunk<'a>]),
    Verbs(Peer<'a>, &'s mut [(Remote<'a>, IoBuf<'a>)]),
}

impl DataPath {
    /// A data path that authenticates with `credential` (a session's, the
    /// newest the agent gave, or the cluster token), speaks TLS trusting `tls` when the cluster's
    /// listeners do, uses up to `streams` connections per node for one
    /// copy, and verbs as `rdma` says.
    pub fn new(
        credential: Renewable,
        tls: Option<ClientTls>,
        streams: usize,
        rdma: &RdmaOptions,
    ) -> Self {
        Self {
            verbs: Verbs::new(credential.clone(), tls.clone(), rdma),
            tcp: TcpFabric::new(credential, tls),
            streams: streams.max(1),
        }
    }

    /// The verbs fabric, for device copies.
    pub fn verbs(&self) -> &Verbs {
        &self.verbs
    }

    /// Whether this process can use verbs to `extent`'s node, and if not,
    /// why. With the `verbs` feature this sets up the queue pair on first
    /// use, so an agent without RDMA is found out before a copy depends on
    /// it; later asks are a lookup.
    pub fn rdma_for(&self, extent: &Extent) -> Rdma {
        self.verbs.reachable(&extent.node, &extent.agent_addr)
    }

    /// Where a piece of `extent` on `route` goes now.
    ///
    /// # Errors
    /// As [`Route::hop`].
    pub fn hop(&self, extent: &Extent, route: Route) -> Result<Hop> {
        route.hop(extent, || self.rdma_for(extent))
    }

    /// The pieces of `[offset, offset + len)` of `target`, in allocation
    /// order, each with where it goes now: the one place a copy asks how
    /// an extent is reached (copies, copies between allocations and device
    /// copies all plan from it).
    ///
    /// # Errors
    /// As [`Route::hop`]; a mapped extent missing from the mapping.
    pub(crate) fn resolve<'s, 'a: 's>(
        &'s self,
        target: Target<'a>,
        offset: u64,
        len: u64,
    ) -> impl Iterator<Item = Result<Resolved<'a>>> + 's {
        target
            .desc
            .pieces(offset, len)
            .map(move |(i, extent, at, _, len)| {
                let route = target.routes[i];
                let reach = match self.hop(extent, route)? {
                    Hop::Mapped => {
                        Reach::Mapped(target.local.and_then(|m| m.ptr_for(at, len)).ok_or_else(
                            || {
                                Error::Internal(format!(
                                    "allocation {}: a mapped extent is not in the mapping",
                                    target.desc.id
                                ))
                            },
                        )?)
                    }
                    Hop::Tcp => Reach::Tcp,
                    Hop::Verbs => Reach::Verbs,
                };
                Ok(Resolved {
                    extent,
                    at,
                    len,
                    route,
                    reach,
                })
            })
    }

    /// Runs every transfer; returns once all are complete (a write's bytes
    /// are then in the holders' memory and visible to any later reader).
    /// Extents mapped from this node's pool are copied with memcpy on this
    /// thread while other nodes are served over TCP, each node over up to
    /// `streams` connections in parallel (one thread each), every
    /// connection pipelined, or over verbs. There is no order among the
    /// transfers.
    ///
    /// A single transfer that fits one request on one remote node, and is
    /// too small to be worth a second connection, takes a direct path: no
    /// thread, no allocation.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`], refused leases, and fabric failures (the
    /// first one met; every transfer is still run to its end).
    pub fn run<'a>(&self, transfers: impl IntoIterator<Item = Transfer<'a>>) -> Result<()> {
        let mut transfers = transfers.into_iter();
        let Some(first) = transfers.next() else {
            return Ok(());
        };
        let mut rest = transfers.peekable();
        let first = if rest.peek().is_none() {
            match self.direct(first) {
                Ok(outcome) => return outcome,
                Err(t) => t,
            }
        } else {
            first
        };
        let mut groups: Vec<Group<'a>> = Vec::new();
        let mut local: Vec<(*mut u8, IoBuf<'a>)> = Vec::new();
        for t in std::iter::once(first).chain(rest) {
            self.plan(t, &mut groups, &mut local)?;
        }
        // Each transport shapes its groups into its own work...
        let mut over_tcp = Vec::new();
        let mut over_verbs = Vec::new();
        for g in groups {
            match g.rdma {
                Some((agent, alloc)) => {
                    let peer = Peer {
                        node: g.node,
                        addr: agent,
                        alloc,
                    };
                    over_verbs.push((peer, verbs::work(g.pieces)));
                }
                None => {
                    let peer = Peer {
                        node: g.node,
                        addr: g.addr,
                        alloc: 0,
                    };
                    let streams = streams_for(g.bytes, self.streams);
                    let chunks = tcp::work(g.pieces, g.bytes, streams);
                    over_tcp.push((peer, g.bytes, streams, chunks));
                }
            }
        }
        // ...and the work is dealt to threads: a node over verbs is one
        // job, a node over TCP one per connection.
        let mut jobs: Vec<Job<'_, 'a>> = Vec::new();
        for (peer, pieces) in &mut over_verbs {
            jobs.push(Job::Verbs(*peer, pieces));
        }
        for (peer, bytes, streams, chunks) in &mut over_tcp {
            let peer = *peer;
            tcp::deal(chunks, *bytes, *streams, |part| {
                jobs.push(Job::Tcp(peer, part));
            });
        }
        let mut copy_local = move || {
            let here = Peer {
                node: "",
                addr: "",
                alloc: 0,
            };
            // Memcpy cannot fail: its pieces were checked when planned.
            let _ = Memcpy.execute(here, &mut local);
        };
        let mut jobs = jobs.into_iter();
        let Some(first) = jobs.next() else {
            copy_local();
            return Ok(());
        };
        std::thread::scope(|s| {
            let handles: Vec<_> = jobs.map(|job| s.spawn(move || self.job(job))).collect();
            copy_local();
            let mine = self.job(first);
            join_first_error(handles, mine)
        })
    }

    fn job(&self, job: Job<'_, '_>) -> Result<()> {
        match job {
            Job::Tcp(peer, chunks) => self.tcp.execute(peer, chunks),
            Job::Verbs(peer, pieces) => self.verbs.execute(peer, pieces),
        }
    }

    /// Runs `t` at once when it is one request to one remote node over
    /// TCP; hands it back otherwise.
    fn direct<'a>(&self, t: Transfer<'a>) -> std::result::Result<Result<()>, Transfer<'a>> {
        let len = t.buf.len() as u64;
        // Copies touching a mapping go the general way: the lease check.
        if !tcp::one_request(&t.buf, self.streams) || t.target.local.is_some() {
            return Err(t);
        }
        let desc = t.target.desc;
        if let Err(e) = desc.check_range(t.offset, len) {
            return Ok(Err(e));
        }
        let mut pieces = self.resolve(t.target, t.offset, len);
        let (Some(first), None) = (pieces.next(), pieces.next()) else {
            return Err(t);
        };
        let (extent, at) = match first {
            Ok(p) if p.reach == Reach::Tcp => (p.extent, p.at),
            Ok(_) => return Err(t),
            Err(e) => return Ok(Err(e)),
        };
        let mut one = [Chunk {
            req: tcp::request(&t.buf, desc, at, len),
            buf: t.buf,
        }];
        Ok(self.tcp.run((&extent.node, &extent.data_addr), &mut one))
    }

    /// Adds one transfer to the plan: its mapped pieces to `local`, the
    /// others to their node's group, in order.
    fn plan<'a>(
        &self,
        t: Transfer<'a>,
        groups: &mut Vec<Group<'a>>,
        local: &mut Vec<(*mut u8, IoBuf<'a>)>,
    ) -> Result<()> {
        let desc = t.target.desc;
        let len = t.buf.len() as u64;
        desc.check_range(t.offset, len)?;
        check_lease(desc, t.target.local)?;
        let mut rest = t.buf;
        // Pieces come in allocation order, so the buffer is carved front to back.
        for piece in self.resolve(t.target, t.offset, len) {
            let Resolved {
                extent,
                at,
                len: n,
                reach,
                ..
            } = piece?;
            let (head, tail) = rest.split_at(usize::try_from(n).map_err(|_| overflow())?);
            rest = tail;
            let rdma = match (reach, &head) {
                (Reach::Mapped(ptr), _) => {
                    local.push((ptr, head));
                    continue;
                }
                // An agent pulls through its TCP data port, whatever
                // reaches it for this process's own bytes.
                (Reach::Verbs, IoBuf::Pull(_)) | (Reach::Tcp, _) => None,
                (Reach::Verbs, _) => Some((extent.agent_addr.as_str(), desc.id)),
            };
            let group = find_or_push(
                groups,
                |g| g.node == extent.node && g.addr == extent.data_addr && g.rdma == rdma,
                || Group {
                    node: &extent.node,
                    addr: &extent.data_addr,
                    bytes: 0,
                    rdma,
                    pieces: Vec::new(),
                },
            );
            group.bytes += n;
            group.pieces.push(Piece {
                desc,
                extent,
                at,
                buf: head,
            });
        }
        Ok(())
    }
}

/// The entry of `groups` that `is` picks, made by `make` (at the end) when
/// there is none: grouping a copy's pieces by node, in first-seen order.
pub(crate) fn find_or_push<T>(
    groups: &mut Vec<T>,
    is: impl Fn(&T) -> bool,
    make: impl FnOnce() -> T,
) -> &mut T {
    let i = match groups.iter().position(is) {
        Some(i) => i,
        None => {
            groups.push(make());
            groups.len() - 1
        }
    };
    &mut groups[i]
}

/// Waits for every copy thread; the first error met (`first`, then the
/// threads in order) is the outcome. A panicked thread is an error.
pub(crate) fn join_first_error(
    handles: Vec<std::thread::ScopedJoinHandle<'_, Result<()>>>,
    first: Result<()>,
) -> Result<()> {
    let mut result = first;
    for h in handles {
        let r = h
            .join()
            .unwrap_or_else(|_| Err(Error::Internal("copy thread panicked".into())));
        if result.is_ok() {
            result = r;
        }
    }
    result
}

/// Refuses copies through a mapping whose allocation was released or
/// whose agent stopped: its bytes would be nobody's.
pub(crate) fn check_lease(d: &Descriptor, local: Option<&Mapping>) -> Result<()> {
    let Some(m) = local else {
        return Ok(());
    };
    match m.lease() {
        Lease::Live => Ok(()),
        Lease::Released => Err(Error::NotFound(format!(
            "no such allocation: {} was freed (its memory stays mapped here, detached, until the handle is dropped)",
            d.id
        ))),
        Lease::AgentGone => {
            Err(Error::NodeUnreachable {
                node: m.node().to_string(),
                addr: "its map socket".into(),
                reason: format!(
                    "the local agent stopped; allocation {}'s bytes on this node are gone with it",
                    d.id
                ),
            })
        }
    }
}

/// The client half of the handshake every agent socket starts with
/// ([`oncilla_net::wire::dial::greet`]), as this crate's error: `fail`
/// turns a transport problem into the caller's.
///
/// # Errors
/// [`Error::PermissionDenied`] when the agent refuses the credential,
/// [`Error::CapacityExhausted`] when it is at its bound for this user
/// (connections), else `fail(..)`.
pub(crate) fn greet(
    stream: &mut (impl Read + Write),
    credential: &Credential,
    fail: impl Fn(String) -> Error,
) -> Result<()> {
    dial::greet(stream, credential.as_bytes()).map_err(|e| dialed(e, fail))
}

/// A failed dial or handshake as this crate's error.
pub(crate) fn dialed(e: dial::DialError, fail: impl Fn(String) -> Error) -> Error {
    match e {
        dial::DialError::Denied(msg) => Error::PermissionDenied(msg),
        dial::DialError::Busy(msg) => Error::CapacityExhausted(msg),
        dial::DialError::Unreachable(msg) | dial::DialError::BadVersion(msg) => fail(msg),
    }
}

fn overflow() -> Error {
    Error::Internal("copy larger than the address space".into())
}
