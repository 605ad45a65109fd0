//! The data path: turns "copy these bytes of this allocation" into work on
//! the fabric of each node that holds them, all nodes in parallel.
//!
//! It never talks to the master or the agent's control socket: a
//! [`Descriptor`] carries everything it needs.

pub mod shm;
pub mod tcp;
pub mod verbs;

use std::io::{Read, Write};

use oncilla_model::fabric::{self as choice, Rdma};
use oncilla_model::Fabric;
use oncilla_proto::auth::Token;
use oncilla_proto::wire::{Op, Request};

use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use shm::{Lease, Mapping};
use tcp::{Chunk, IoBuf, TcpFabric, CHUNK};
use verbs::plan::Remote;

/// Connections per node one copy uses unless configured otherwise.
pub const DEFAULT_STREAMS: usize = 4;
/// Least bytes worth a connection of their own: below this a node's share
/// of a copy goes over fewer connections than allowed.
pub const STREAM_MIN: u64 = 1 << 20;

/// One copy between caller memory and an allocation: `buf` is read from
/// (write) or filled (read) at allocation offset `offset`.
pub struct Transfer<'a> {
    pub desc: &'a Descriptor,
    /// This node's extents of the allocation, mapped.
    pub local: Option<&'a Mapping>,
    pub offset: u64,
    pub buf: IoBuf<'a>,
    /// The allocation's fabric preference (`Auto`: verbs where both ends
    /// have it, else TCP).
    pub fabric: Fabric,
}

/// One copy between an allocation and device memory of this process, for
/// [`DataPath::gpu_direct`].
pub struct DeviceTransfer<'a> {
    pub desc: &'a Descriptor,
    /// This node's extents of the allocation, mapped.
    pub local: Option<&'a Mapping>,
    pub offset: u64,
    /// The allocation's fabric preference.
    pub fabric: Fabric,
    pub mem: &'a oncilla_cuda::DeviceMem,
    pub mem_offset: u64,
    pub len: u64,
    /// Into the device (a read of the allocation); else out of it.
    pub read: bool,
}

/// Moves bytes between local memory and allocations.
pub struct DataPath {
    tcp: TcpFabric,
    streams: usize,
    #[cfg(feature = "verbs")]
    verbs: verbs::VerbsFabric,
}

/// A node's share of a copy: its chunks, later dealt out to connections;
/// or, over verbs, its pieces by remote place (one allocation each).
struct NodeWork<'a> {
    node: &'a str,
    addr: &'a str,
    bytes: u64,
    chunks: Vec<Chunk<'a>>,
    /// `Some((agent address, allocation id))` for work over verbs.
    rdma: Option<(&'a str, u64)>,
    pieces: Vec<(Remote<'a>, IoBuf<'a>)>,
}

/// One thread's work in [`DataPath::run`].
enum Job<'s, 'a> {
    Tcp((&'a str, &'a str), &'s mut [Chunk<'a>]),
    Verbs(&'a str, &'a str, u64, &'s mut [(Remote<'a>, IoBuf<'a>)]),
}

impl DataPath {
    /// A data path that authenticates with `token` and uses up to `streams`
    /// connections per node for one copy.
    pub fn new(token: Token, streams: usize) -> Self {
        Self {
            #[cfg(feature = "verbs")]
            verbs: verbs::VerbsFabric::from_env(token.clone()),
            tcp: TcpFabric::new(token),
            streams: streams.max(1),
        }
    }

    /// Whether this process can use verbs to `node` (whose agent listens
    /// at `agent_addr`), and if not, why. With the `verbs` feature this
    /// sets up the queue pair on first use, so an agent without RDMA is
    /// found out before a copy depends on it.
    pub fn rdma_for(&self, node: &str, agent_addr: &str) -> Rdma {
        #[cfg(feature = "verbs")]
        return match self.verbs.reachable(node, agent_addr) {
            Ok(()) => Rdma::Both,
            Err(why) => Rdma::Unavailable(why),
        };
        #[cfg(not(feature = "verbs"))]
        {
            /// Made once: the reason is asked for on every copy.
            static NO_VERBS: std::sync::LazyLock<std::sync::Arc<str>> =
                std::sync::LazyLock::new(|| {
                    "this build has no verbs support (rebuild with `cargo build --features verbs`)"
                        .into()
                });
            let _ = (node, agent_addr);
            Rdma::Unavailable(std::sync::Arc::clone(&NO_VERBS))
        }
    }

    /// Copies `src` into the allocation at `offset` ([`DataPath::run`] with
    /// one transfer).
    ///
    /// # Errors
    /// As [`DataPath::run`].
    pub fn write(
        &self,
        desc: &Descriptor,
        offset: u64,
        src: &[u8],
        local: Option<&Mapping>,
        fabric: Fabric,
    ) -> Result<()> {
        self.run([Transfer {
            desc,
            local,
            offset,
            buf: IoBuf::Write(src),
            fabric,
        }])
    }

    /// Fills `dst` from the allocation at `offset` ([`DataPath::run`] with
    /// one transfer).
    ///
    /// # Errors
    /// As [`DataPath::run`].
    pub fn read(
        &self,
        desc: &Descriptor,
        offset: u64,
        dst: &mut [u8],
        local: Option<&Mapping>,
        fabric: Fabric,
    ) -> Result<()> {
        self.run([Transfer {
            desc,
            local,
            offset,
            buf: IoBuf::Read(dst),
            fabric,
        }])
    }

    /// Copies between an allocation and device memory of this process by
    /// RDMA straight to or from the device (GPUDirect RDMA), when every
    /// piece of the range goes over verbs and the HCA can register `mem`.
    /// `None` when that is not possible here: the caller then stages
    /// through host memory, which reaches everything.
    pub fn gpu_direct(&self, t: DeviceTransfer<'_>) -> Option<Result<()>> {
        #[cfg(feature = "verbs")]
        {
            let DeviceTransfer {
                desc,
                local,
                offset,
                fabric,
                mem,
                mem_offset,
                len,
                read,
            } = t;
            if local.is_some() || len == 0 {
                return None;
            }
            if let Err(e) = desc.check_range(offset, len) {
                return Some(Err(e));
            }
            if let Err(e) = mem.check(mem_offset, len) {
                return Some(Err(e.into()));
            }
            // By node: (node, agent, pieces as (remote, device offset, len)).
            let mut nodes: Vec<(&str, &str, Vec<verbs::plan::DevicePiece<'_>>)> = Vec::new();
            for (extent, at, _, n) in desc.pieces(offset, len) {
                if !matches!(self.remote_fabric(extent, fabric), Ok(Fabric::Verbs)) {
                    return None;
                }
                let piece = (remote_at(extent, at), mem_offset + (at - offset), n);
                match nodes.iter_mut().find(|w| w.0 == extent.node) {
                    Some(w) => w.2.push(piece),
                    None => nodes.push((&extent.node, &extent.agent_addr, vec![piece])),
                }
            }
            for (i, (node, agent, pieces)) in nodes.iter().enumerate() {
                match self
                    .verbs
                    .run_device(node, agent, desc.id, mem, pieces, read)
                {
                    Ok(Ok(())) => {}
                    // Nothing moved yet (registration comes first, and
                    // this is the first node): stage instead.
                    Ok(Err(why)) if i == 0 => {
                        tracing::debug!(
                            "GPUDirect RDMA refused: {why}; staging through host memory"
                        );
                        return None;
                    }
                    Ok(Err(why)) => {
                        return Some(Err(Error::Fabric {
                            node: node.to_string(),
                            addr: agent.to_string(),
                            reason: format!("registering device memory for RDMA: {why}"),
                        }))
                    }
                    Err(e) => return Some(Err(e)),
                }
            }
            Some(Ok(()))
        }
        #[cfg(not(feature = "verbs"))]
        {
            let _ = t;
            None
        }
    }

    /// Runs every transfer; returns once all are complete (a write's bytes
    /// are then in the holders' memory and visible to any later reader).
    /// Extents mapped from this node's pool are copied with memcpy on this
    /// thread while other nodes are served over TCP, each node over up to
    /// `streams` connections in parallel (one thread each), every
    /// connection pipelined. There is no order among the transfers.
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
        let mut nodes: Vec<NodeWork<'a>> = Vec::new();
        let mut local: Vec<(*mut u8, IoBuf<'a>)> = Vec::new();
        for t in std::iter::once(first).chain(rest) {
            self.plan(t, &mut nodes, &mut local)?;
        }
        let mut jobs: Vec<Job<'_, 'a>> = Vec::new();
        for n in &mut nodes {
            if let Some((agent, id)) = n.rdma {
                jobs.push(Job::Verbs(n.node, agent, id, &mut n.pieces));
                continue;
            }
            let streams = streams_for(n.bytes, self.streams);
            n.chunks = resplit(std::mem::take(&mut n.chunks), n.bytes, streams);
            deal(&mut n.chunks, n.bytes, streams, |part| {
                jobs.push(Job::Tcp((n.node, n.addr), part));
            });
        }
        let copy_local = move || {
            for (ptr, buf) in local {
                match buf {
                    // SAFETY: `ptr` maps exactly this piece of an extent on
                    // this node (`ptr_for` checked the range) and stays
                    // valid while the mapping is borrowed; `b` is caller
                    // memory, so they cannot overlap.
                    IoBuf::Write(b) => unsafe {
                        std::ptr::copy_nonoverlapping(b.as_ptr(), ptr, b.len());
                    },
                    // SAFETY: as above, with the roles swapped.
                    IoBuf::Read(b) => unsafe {
                        std::ptr::copy_nonoverlapping(ptr, b.as_mut_ptr(), b.len());
                    },
                }
            }
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
            Job::Tcp(peer, chunks) => self.tcp.run(peer, chunks),
            #[cfg(feature = "verbs")]
            Job::Verbs(node, agent, id, pieces) => self.verbs.run(node, agent, id, pieces),
            #[cfg(not(feature = "verbs"))]
            Job::Verbs(node, agent, id, pieces) => Err(Error::Fabric {
                node: node.to_string(),
                addr: agent.to_string(),
                reason: format!(
                    "allocation {id}: {} pieces planned over verbs in a build without it",
                    pieces.len()
                ),
            }),
        }
    }

    /// The fabric for a remote extent on `node`: verbs or TCP.
    ///
    /// # Errors
    /// A preference that cannot reach the node (verbs without RDMA, shm).
    fn remote_fabric(&self, extent: &crate::descriptor::Extent, prefer: Fabric) -> Result<Fabric> {
        // Told TCP, `choose` answers TCP whatever verbs can do: do not ask.
        if prefer == Fabric::Tcp {
            return Ok(Fabric::Tcp);
        }
        // Local host extents never get here (they are mapped), so the
        // caller's node does not matter: "" means "not this one".
        let rdma = self.rdma_for(&extent.node, &extent.agent_addr);
        choice::choose(&extent.node, extent.memory(), "", prefer, &rdma)
            .map_err(|e| Error::InvalidArgument(e.to_string()))
    }

    /// Runs `t` at once when it is one request to one remote node; hands
    /// it back otherwise.
    fn direct<'a>(&self, t: Transfer<'a>) -> std::result::Result<Result<()>, Transfer<'a>> {
        let len = t.buf.len() as u64;
        // Copies touching a mapping go the general way: the lease check.
        if !one_request(len, self.streams) || t.local.is_some() {
            return Err(t);
        }
        if let Err(e) = t.desc.check_range(t.offset, len) {
            return Ok(Err(e));
        }
        let mut pieces = t.desc.pieces(t.offset, len);
        let (Some((extent, at, _, _)), None) = (pieces.next(), pieces.next()) else {
            return Err(t);
        };
        match self.remote_fabric(extent, t.fabric) {
            Ok(Fabric::Tcp) => {}
            Ok(_) => return Err(t),
            Err(e) => return Ok(Err(e)),
        }
        let mut one = [Chunk {
            req: request(&t.buf, t.desc, at, len),
            buf: t.buf,
        }];
        Ok(self.tcp.run((&extent.node, &extent.data_addr), &mut one))
    }
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

/// Whether a copy of `len` bytes to one node is one request on one
/// connection when `max` connections are allowed.
fn one_request(len: u64, max: usize) -> bool {
    len <= CHUNK && streams_for(len, max) == 1
}

/// Connections a node's share of `bytes` goes over when `max` are allowed:
/// one per [`STREAM_MIN`], at least one.
pub fn streams_for(bytes: u64, max: usize) -> usize {
    usize::try_from(bytes / STREAM_MIN)
        .unwrap_or(usize::MAX)
        .clamp(1, max.max(1))
}

impl DataPath {
    /// Adds one transfer to the plan: its local pieces to `local`, the others
    /// to their node's work (one piece per chunk for now, or by pool offset
    /// over verbs).
    fn plan<'a>(
        &self,
        t: Transfer<'a>,
        nodes: &mut Vec<NodeWork<'a>>,
        local: &mut Vec<(*mut u8, IoBuf<'a>)>,
    ) -> Result<()> {
        let len = t.buf.len() as u64;
        t.desc.check_range(t.offset, len)?;
        check_lease(t.desc, t.local)?;
        let mut rest = t.buf;
        // Pieces come in allocation order, so the buffer is carved front to back.
        for (extent, at, _, n) in t.desc.pieces(t.offset, len) {
            let (head, tail) = rest.split_at(usize::try_from(n).map_err(|_| overflow())?);
            rest = tail;
            if let Some(ptr) = t.local.and_then(|m| m.ptr_for(at, n)) {
                local.push((ptr, head));
                continue;
            }
            let rdma = match self.remote_fabric(extent, t.fabric)? {
                Fabric::Verbs => Some((extent.agent_addr.as_str(), t.desc.id)),
                _ => None,
            };
            let i = match nodes
                .iter()
                .position(|w| w.node == extent.node && w.addr == extent.data_addr && w.rdma == rdma)
            {
                Some(i) => i,
                None => {
                    nodes.push(NodeWork {
                        node: &extent.node,
                        addr: &extent.data_addr,
                        bytes: 0,
                        chunks: Vec::new(),
                        rdma,
                        pieces: Vec::new(),
                    });
                    nodes.len() - 1
                }
            };
            nodes[i].bytes += n;
            if rdma.is_some() {
                nodes[i].pieces.push((remote_at(extent, at), head));
            } else {
                nodes[i].chunks.push(Chunk {
                    req: request(&head, t.desc, at, n),
                    buf: head,
                });
            }
        }
        Ok(())
    }
}

/// Where allocation offset `at` (inside `extent`) lies on its node, for verbs.
fn remote_at(extent: &crate::descriptor::Extent, at: u64) -> Remote<'_> {
    Remote {
        regions: &extent.rdma,
        at: at - extent.alloc_offset,
    }
}

fn request(buf: &IoBuf<'_>, d: &Descriptor, offset: u64, len: u64) -> Request {
    Request {
        op: match buf {
            IoBuf::Read(_) => Op::Read,
            IoBuf::Write(_) => Op::Write,
        },
        alloc_id: d.id,
        key: d.key,
        offset,
        len,
    }
}

/// Splits pieces into requests of at most [`CHUNK`] bytes, and small enough
/// that `streams` connections each get a share of the node's `bytes`.
fn resplit<'a>(pieces: Vec<Chunk<'a>>, bytes: u64, streams: usize) -> Vec<Chunk<'a>> {
    let target = CHUNK.min(bytes.div_ceil(streams as u64)).max(1);
    if pieces.iter().all(|c| c.req.len <= target) {
        return pieces;
    }
    let mut out = Vec::with_capacity(usize::try_from(bytes / target).unwrap_or(0) + pieces.len());
    for Chunk { req, mut buf } in pieces {
        let mut at = 0;
        while at < req.len {
            let n = (req.len - at).min(target);
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
fn deal<'s, 'a>(
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

/// Refuses copies through a mapping whose allocation was released or
/// whose agent stopped: its bytes would be nobody's.
fn check_lease(d: &Descriptor, local: Option<&Mapping>) -> Result<()> {
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

/// The client half of the handshake every agent socket starts with.
/// `fail` turns a transport problem into the caller's error.
///
/// # Errors
/// [`Error::PermissionDenied`] when the agent refuses the token, else `fail(..)`.
pub(crate) fn greet(
    stream: &mut (impl Read + Write),
    token: &Token,
    fail: impl Fn(String) -> Error,
) -> Result<()> {
    use oncilla_proto::wire::{self, Welcome};
    wire::write_hello(stream, token.as_bytes()).map_err(|e| fail(e.to_string()))?;
    let (code, msg) = wire::read_welcome(stream).map_err(|e| fail(e.to_string()))?;
    match code {
        Welcome::Ok => Ok(()),
        Welcome::Denied => Err(Error::PermissionDenied(msg)),
        Welcome::BadVersion => Err(fail(msg)),
    }
}

fn overflow() -> Error {
    Error::Internal("copy larger than the address space".into())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn only_copies_worth_one_connection_take_the_direct_path() {
        assert!(one_request(8, 4));
        assert!(one_request(STREAM_MIN, 4));
        // 4 MiB fits one request but is worth four connections.
        assert!(!one_request(CHUNK, 4));
        assert!(!one_request(2 * STREAM_MIN, 2));
        assert!(one_request(CHUNK, 1));
        assert!(!one_request(CHUNK + 1, 1));
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
        let mut buf = vec![0u8; 9 << 20];
        let out = resplit(chunks(&[9 << 20], &mut buf), 9 << 20, 1);
        assert!(out.iter().all(|c| c.req.len <= CHUNK));
        assert_eq!(out.len(), 3);
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
