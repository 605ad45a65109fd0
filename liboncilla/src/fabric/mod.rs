//! The data path: turns "copy these bytes of this allocation" into work on
//! the fabric of each node that holds them, all nodes in parallel.
//!
//! It never talks to the master or the agent's control socket: a
//! [`Descriptor`] carries everything it needs.

pub mod shm;
pub mod tcp;

use std::collections::BTreeMap;
use std::io::{Read, Write};

use oncilla_proto::auth::Token;

use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use shm::{Lease, Mapping};
use tcp::{Io, IoBuf, TcpFabric};

/// Remote pieces of a copy, by (node, data address).
type ByNode<'a> = BTreeMap<(&'a str, &'a str), Vec<Io<'a>>>;

/// Moves bytes between local memory and allocations.
pub struct DataPath {
    tcp: TcpFabric,
}

impl DataPath {
    /// A data path that authenticates with `token`.
    pub fn new(token: Token) -> Self {
        Self {
            tcp: TcpFabric::new(token),
        }
    }

    /// Copies `src` into the allocation at `offset`. Extents in `local`
    /// (mapped from this node's pool) are written with memcpy on this
    /// thread while the other nodes are written over TCP, one thread per
    /// node. Returns once every byte is in the holders' memory and visible
    /// to any later reader.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] and fabric failures.
    pub fn write(
        &self,
        d: &Descriptor,
        offset: u64,
        src: &[u8],
        local: Option<&Mapping>,
    ) -> Result<()> {
        d.check_range(offset, src.len() as u64)?;
        check_lease(d, local)?;
        let mut by_node: ByNode<'_> = BTreeMap::new();
        let mut copies = Vec::new();
        for (extent, at, buf_at, len) in d.pieces(offset, src.len() as u64) {
            let end = buf_at + usize::try_from(len).map_err(|_| overflow())?;
            let piece = &src[buf_at..end];
            match local.and_then(|m| m.ptr_for(at, len)) {
                Some(ptr) => copies.push((ptr, piece)),
                None => by_node
                    .entry((&extent.node, &extent.data_addr))
                    .or_default()
                    .push(Io {
                        offset: at,
                        buf: IoBuf::Write(piece),
                    }),
            }
        }
        self.fan_out(d, by_node, || {
            for (ptr, piece) in copies {
                // SAFETY: `ptr` is the mapping of exactly this piece of an
                // extent on this node (`ptr_for` checked the range), valid
                // while `local` is borrowed; `piece` is caller memory, so
                // they cannot overlap.
                unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), ptr, piece.len()) };
            }
        })
    }

    /// Copies bytes of the allocation starting at `offset` into `dst`, as
    /// [`DataPath::write`] does the other way.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] and fabric failures.
    pub fn read(
        &self,
        d: &Descriptor,
        offset: u64,
        dst: &mut [u8],
        local: Option<&Mapping>,
    ) -> Result<()> {
        d.check_range(offset, dst.len() as u64)?;
        check_lease(d, local)?;
        let mut by_node: ByNode<'_> = BTreeMap::new();
        let mut copies = Vec::new();
        let mut rest = dst;
        // Pieces come in allocation order, so the buffer is carved front to back.
        for (extent, at, _, len) in d.pieces(offset, rest.len() as u64) {
            let n = usize::try_from(len).map_err(|_| overflow())?;
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            match local.and_then(|m| m.ptr_for(at, len)) {
                Some(ptr) => copies.push((ptr, head)),
                None => by_node
                    .entry((&extent.node, &extent.data_addr))
                    .or_default()
                    .push(Io {
                        offset: at,
                        buf: IoBuf::Read(head),
                    }),
            }
        }
        self.fan_out(d, by_node, || {
            for (ptr, head) in copies {
                // SAFETY: as in `write`, with the roles of the buffers swapped.
                unsafe { std::ptr::copy_nonoverlapping(ptr, head.as_mut_ptr(), head.len()) };
            }
        })
    }

    /// Runs each node's I/O on its own thread and `local` on this one.
    fn fan_out(&self, d: &Descriptor, by_node: ByNode<'_>, local: impl FnOnce()) -> Result<()> {
        if by_node.len() <= 1 {
            local();
            return by_node
                .into_iter()
                .try_for_each(|(peer, ios)| self.tcp.run(peer, d.id, &d.key, ios));
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = by_node
                .into_iter()
                .map(|(peer, ios)| s.spawn(move || self.tcp.run(peer, d.id, &d.key, ios)))
                .collect();
            local();
            let mut result = Ok(());
            for h in handles {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(Error::Internal("copy thread panicked".into())));
                if result.is_ok() {
                    result = r;
                }
            }
            result
        })
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
