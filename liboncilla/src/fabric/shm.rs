//! Same-node mapping: asks the local agent for its pool's memfd and maps one
//! extent of it into this process, so a local allocation is plain memory.
//!
//! It owns the mapping and unmaps it on drop. It never frees the allocation
//! (the handle does, after dropping the mapping).

use std::io::{IoSliceMut, Read, Write};
use std::num::NonZeroUsize;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::ptr::NonNull;
use std::time::Duration;

use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use oncilla_proto::auth::Token;
use oncilla_proto::wire::{self, Op, Reply, Request, Status, KEY_LEN, REPLY_LEN};
use oncilla_proto::PAGE;

use crate::error::{Error, Result};

const TIMEOUT: Duration = Duration::from_secs(10);

/// One extent of a local allocation, mapped shared into this process.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
}

// SAFETY: the mapping is process-wide memory owned by this value; moving it
// between threads moves only the pointer.
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` hands out only raw pointers; callers synchronise.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of allocation `id` starting at allocation offset
    /// `offset` (an extent held by the local agent behind `socket`).
    ///
    /// # Errors
    /// [`Error::AgentUnreachable`], [`Error::PermissionDenied`],
    /// [`Error::NotFound`], and mapping failures.
    pub fn open(
        socket: &Path,
        token: &Token,
        id: u64,
        key: &[u8; KEY_LEN],
        offset: u64,
        len: u64,
    ) -> Result<Self> {
        let path = oncilla_proto::map_socket(socket);
        let fail = |reason: String| Error::AgentUnreachable {
            path: path.display().to_string(),
            reason,
        };
        let mut stream = UnixStream::connect(&path).map_err(|e| fail(e.to_string()))?;
        stream
            .set_read_timeout(Some(TIMEOUT))
            .map_err(|e| fail(e.to_string()))?;
        stream
            .set_write_timeout(Some(TIMEOUT))
            .map_err(|e| fail(e.to_string()))?;
        super::greet(&mut stream, token, fail)?;
        let req = Request {
            op: Op::Read,
            alloc_id: id,
            key: *key,
            offset,
            len,
        };
        stream
            .write_all(&req.encode())
            .map_err(|e| fail(e.to_string()))?;

        let mut head = [0u8; REPLY_LEN];
        let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let (got, fd) = {
            let mut iov = [IoSliceMut::new(&mut head)];
            let msg = recvmsg::<()>(
                std::os::fd::AsRawFd::as_raw_fd(&stream),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(|e| fail(e.to_string()))?;
            let mut fd = None;
            for c in msg.cmsgs().map_err(|e| fail(e.to_string()))? {
                if let ControlMessageOwned::ScmRights(fds) = c {
                    for raw in fds {
                        // SAFETY: the kernel just installed this descriptor
                        // in our table for us; nothing else owns it.
                        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                        fd.get_or_insert(owned);
                    }
                }
            }
            (msg.bytes, fd)
        };
        if got < REPLY_LEN {
            stream
                .read_exact(&mut head[got..])
                .map_err(|e| fail(e.to_string()))?;
        }
        let reply = Reply::decode(&head).map_err(|e| fail(e.to_string()))?;
        if reply.status != Status::Ok {
            let mut msg = vec![0u8; usize::try_from(reply.len.min(wire::MAX_MESSAGE)).unwrap_or(0)];
            stream
                .read_exact(&mut msg)
                .map_err(|e| fail(e.to_string()))?;
            let msg = String::from_utf8_lossy(&msg).into_owned();
            return Err(match reply.status {
                Status::NoSuchAllocation => Error::NotFound(msg),
                Status::BadKey => Error::PermissionDenied(msg),
                _ => Error::InvalidArgument(msg),
            });
        }
        let fd = fd.ok_or_else(|| fail("agent sent no memory descriptor".into()))?;
        let pool_offset = reply.len;
        let len_usize =
            usize::try_from(len).map_err(|_| Error::Internal("extent too large".into()))?;
        let map_len = usize::try_from(len.div_ceil(PAGE) * PAGE)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| Error::Internal("empty extent".into()))?;
        let off = i64::try_from(pool_offset)
            .map_err(|_| Error::Internal("pool offset too large".into()))?;
        // SAFETY: a fresh shared mapping of the agent's memfd at a page-aligned
        // offset the agent vouched for; the kernel picks the address, so it
        // aliases nothing in this process.
        let ptr = unsafe {
            mmap(
                None,
                map_len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &fd,
                off,
            )
        }
        .map_err(|e| Error::Internal(format!("cannot map local allocation {id}: {e}")))?;
        Ok(Self {
            ptr: ptr.cast(),
            len: len_usize,
            map_len: map_len.get(),
        })
    }

    /// Start of the mapped bytes.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length that belongs to the allocation.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty mapping (never, for a real extent).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `open`, unmapped once.
        if let Err(e) = unsafe { munmap(self.ptr.cast(), self.map_len) } {
            tracing::warn!(error = %e, "cannot unmap local allocation");
        }
    }
}
