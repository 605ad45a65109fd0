//! Data-path servers: how clients reach the pool's bytes. The checks every
//! server applies — the token handshake and a request's allocation, access
//! key and bounds — live here once, so each fabric serves only its transfer.

pub mod shm;
pub mod tcp;
pub mod verbs;

use std::io::{Read, Write};
use std::sync::Arc;

use oncilla_proto::auth::Token;
use oncilla_proto::wire::{self, Request, Status, Welcome};

use crate::memory::held::{Held, HeldTable};

/// Reads a client's hello and answers it. `Ok(true)` when the client may
/// go on; `Ok(false)` when it was refused (and told why).
///
/// # Errors
/// Malformed or failed I/O.
pub(crate) fn accept(
    stream: &mut (impl Read + Write),
    token: &Token,
) -> Result<bool, wire::WireError> {
    let (version, presented) = wire::read_hello(stream)?;
    if version != wire::VERSION {
        let msg = format!(
            "data protocol version {version} not supported (this agent speaks {})",
            wire::VERSION
        );
        wire::write_welcome(stream, Welcome::BadVersion, &msg)?;
        return Ok(false);
    }
    if !token.matches(&presented) {
        tracing::warn!("data connection with wrong token");
        wire::write_welcome(
            stream,
            Welcome::Denied,
            "permission denied: wrong cluster token",
        )?;
        return Ok(false);
    }
    wire::write_welcome(stream, Welcome::Ok, "")?;
    Ok(true)
}

/// A request that passed every check: the allocation's entry (held for the
/// duration of the transfer, so its memory cannot be recycled under it),
/// the index of the extent that holds the whole range, and the offset of the
/// range inside that extent.
pub(crate) struct Authorized {
    pub held: Arc<Held>,
    pub extent: usize,
    pub at: u64,
}

/// Checks that `req` names an allocation held here, with its access key,
/// and a range inside one extent; otherwise the status and message to send.
pub(crate) fn authorize(table: &HeldTable, req: &Request) -> Result<Authorized, (Status, String)> {
    let Some(held) = table.get(&req.alloc_id).map(|e| Arc::clone(e.value())) else {
        return Err((Status::NoSuchAllocation, table.not_held(req.alloc_id)));
    };
    if !held.key_matches(&req.key) {
        return Err((
            Status::BadKey,
            format!(
                "permission denied: wrong access key for allocation {}",
                req.alloc_id
            ),
        ));
    }
    match held.extent_for(req.offset, req.len) {
        Some(i) => {
            let at = req.offset - held.extents[i].alloc_offset;
            Ok(Authorized {
                held,
                extent: i,
                at,
            })
        }
        None => Err((
            Status::OutOfBounds,
            format!(
                "out of bounds: bytes {}..{} of allocation {} are not held by this node",
                req.offset,
                req.offset.saturating_add(req.len),
                req.alloc_id
            ),
        )),
    }
}
