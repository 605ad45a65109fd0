//! Same-node sharing: hands the pool's memfd to a local application over a
//! Unix socket (`SCM_RIGHTS`), so it can map an extent it holds the access
//! key for and use it as plain memory.
//!
//! The exchange reuses the data protocol's framing: hello/welcome with the
//! cluster token, then one request (`op` read, the extent's allocation
//! offset and length), answered by a reply whose `len` is the extent's page-
//! aligned offset in the pool, with the fd attached. The fd reaches the whole
//! pool, so this trusts local token holders exactly as far as the token
//! already does (a token holder can read any allocation through the master).
//! This module never maps memory itself and never changes the held table.

use std::io::{IoSlice, Read};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use oncilla_proto::auth::Token;
use oncilla_proto::wire::{self, Reply, Request, Status, REQUEST_LEN};

use crate::agent::held::HeldTable;
use crate::pool::Pool;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Serves mapping requests until the listener fails.
pub fn serve(listener: UnixListener, pool: Arc<Pool>, held: HeldTable, token: Token) {
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "map accept failed");
                continue;
            }
        };
        // Each exchange is one short request; serve it inline with timeouts
        // so a stuck client cannot hold the loop for long.
        if let Err(e) = serve_one(stream, &pool, &held, &token) {
            tracing::debug!(error = %e, "map request failed");
        }
    }
}

fn serve_one(
    mut stream: UnixStream,
    pool: &Pool,
    held: &HeldTable,
    token: &Token,
) -> Result<(), wire::WireError> {
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    if !super::accept(&mut stream, token)? {
        return Ok(());
    }
    let mut head = [0u8; REQUEST_LEN];
    stream.read_exact(&mut head)?;
    let req = Request::decode(&head)?;
    let (status, msg, pool_offset) = match super::authorize(held, &req) {
        Ok(ok) if ok.at != 0 || ok.held.extents[ok.extent].len != req.len => {
            (Status::OutOfBounds, "map whole extents only".to_string(), 0)
        }
        Ok(ok) => (
            Status::Ok,
            String::new(),
            ok.held.extents[ok.extent].memory.offset(),
        ),
        Err((status, msg)) => (status, msg, 0),
    };
    if status != Status::Ok {
        let reply = Reply {
            status,
            len: msg.len() as u64,
        }
        .encode();
        std::io::Write::write_all(&mut stream, &reply)?;
        std::io::Write::write_all(&mut stream, msg.as_bytes())?;
        return Ok(());
    }
    let reply = Reply {
        status,
        len: pool_offset,
    }
    .encode();
    let fd: BorrowedFd<'_> = pool.fd();
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(&reply)],
        &cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(std::io::Error::from)?;
    Ok(())
}
