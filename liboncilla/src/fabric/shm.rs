//! Same-node mapping: asks the local agent for the slab memfds behind a
//! local allocation and maps its extents, back to back, into one range of
//! this process, so a local allocation is plain contiguous memory.
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

use nix::sys::mman::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use oncilla_proto::auth::Token;
use oncilla_proto::wire::{
    self, MapGrant, Op, Reply, Request, Status, GRANT_LEN, KEY_LEN, REPLY_LEN,
};

use crate::descriptor::Extent;
use crate::error::{Error, Result};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A local allocation, mapped shared into this process as one range.
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
    /// Maps allocation `id`, whose `extents` are all held by the local agent
    /// behind `socket`, as one contiguous range.
    ///
    /// # Errors
    /// [`Error::AgentUnreachable`], [`Error::PermissionDenied`],
    /// [`Error::NotFound`], and mapping failures.
    pub fn open(
        socket: &Path,
        token: &Token,
        id: u64,
        key: &[u8; KEY_LEN],
        extents: &[Extent],
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
        let mut grants = Vec::with_capacity(extents.len());
        for e in extents {
            let req = Request {
                op: Op::Read,
                alloc_id: id,
                key: *key,
                offset: e.alloc_offset,
                len: e.len,
            };
            stream
                .write_all(&req.encode())
                .map_err(|err| fail(err.to_string()))?;
            grants.push(receive_grant(&mut stream, &fail)?);
        }
        let (Some(last), Some((_, last_grant))) = (extents.last(), grants.last()) else {
            return Err(Error::Internal(format!("allocation {id} has no extents")));
        };
        let page = last_grant.page.max(oncilla_proto::PAGE);
        for (e, (_, g)) in extents.iter().zip(&grants) {
            // Back to back only works when every extent but the last fills
            // whole pages of one page size.
            let whole = e.alloc_offset % page == 0 && (g.map_len == e.len.div_ceil(page) * page);
            if g.page != last_grant.page || !whole || g.slab_offset % page != 0 {
                return Err(Error::Internal(format!(
                    "agent granted extent at {} of allocation {id} with a layout that cannot be mapped contiguously",
                    e.alloc_offset
                )));
            }
        }
        let total = last.alloc_offset + last_grant.map_len;
        let len = usize::try_from(extents.iter().map(|e| e.len).sum::<u64>())
            .map_err(|_| Error::Internal("allocation too large to map".into()))?;
        let map_len = usize::try_from(total)
            .map_err(|_| Error::Internal("allocation too large to map".into()))?;
        let base = reserve_aligned(map_len, usize::try_from(page).unwrap_or(usize::MAX))?;
        let mapping = Self {
            ptr: base,
            len,
            map_len,
        };
        for (e, (fd, g)) in extents.iter().zip(&grants) {
            let at = base
                .as_ptr()
                .wrapping_add(usize::try_from(e.alloc_offset).unwrap_or(usize::MAX));
            let addr = NonZeroUsize::new(at as usize)
                .ok_or_else(|| Error::Internal("null mapping address".into()))?;
            let size = usize::try_from(g.map_len)
                .ok()
                .and_then(NonZeroUsize::new)
                .ok_or_else(|| Error::Internal("empty extent".into()))?;
            let off = i64::try_from(g.slab_offset)
                .map_err(|_| Error::Internal("slab offset too large".into()))?;
            // SAFETY: [at, at + size) lies inside the range reserved above,
            // which this Mapping owns and nothing else uses, so MAP_FIXED
            // replaces only our own reservation; the offset is page-aligned
            // as the agent vouched and checked above.
            unsafe {
                mmap(
                    Some(addr),
                    size,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
                    fd,
                    off,
                )
            }
            .map_err(|err| Error::Internal(format!("cannot map local allocation {id}: {err}")))?;
        }
        Ok(mapping)
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

/// Receives one reply of the map socket: the slab fd and where the extent
/// lies in it, or the agent's refusal.
fn receive_grant(
    stream: &mut UnixStream,
    fail: &impl Fn(String) -> Error,
) -> Result<(OwnedFd, MapGrant)> {
    let mut head = [0u8; REPLY_LEN];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let (got, fd) = {
        let mut iov = [IoSliceMut::new(&mut head)];
        let msg = recvmsg::<()>(
            std::os::fd::AsRawFd::as_raw_fd(stream),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| fail(e.to_string()))?;
        let mut fd = None;
        for c in msg.cmsgs().map_err(|e| fail(e.to_string()))? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: the kernel just installed this descriptor in
                    // our table for us; nothing else owns it.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    fd.get_or_insert(owned);
                }
            }
        }
        (msg.bytes, fd)
    };
    if got == 0 {
        return Err(fail("agent closed the map socket".into()));
    }
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
    if reply.len != GRANT_LEN as u64 {
        return Err(fail(format!("map grant of {} bytes", reply.len)));
    }
    let mut body = [0u8; GRANT_LEN];
    stream
        .read_exact(&mut body)
        .map_err(|e| fail(e.to_string()))?;
    let fd = fd.ok_or_else(|| fail("agent sent no memory descriptor".into()))?;
    Ok((fd, MapGrant::decode(&body)))
}

/// Reserves `len` bytes of address space aligned to `align` (inaccessible
/// until mapped over).
fn reserve_aligned(len: usize, align: usize) -> Result<NonNull<u8>> {
    let fail = |e: nix::Error| Error::Internal(format!("cannot reserve address space: {e}"));
    let padded = len
        .checked_add(align)
        .and_then(NonZeroUsize::new)
        .ok_or_else(|| Error::Internal("allocation too large to map".into()))?;
    // SAFETY: a fresh private, inaccessible anonymous mapping at an address
    // the kernel picks; it aliases nothing.
    let raw = unsafe {
        mmap_anonymous(
            None,
            padded,
            ProtFlags::PROT_NONE,
            MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
        )
    }
    .map_err(fail)?;
    let start = raw.as_ptr() as usize;
    let aligned = start.div_ceil(align) * align;
    let head = aligned - start;
    let tail = padded.get() - head - len;
    if head > 0 {
        // SAFETY: the unaligned front of the reservation just made.
        unsafe { munmap(raw, head) }.map_err(fail)?;
    }
    if tail > 0 {
        let end = NonNull::new((aligned + len) as *mut std::ffi::c_void)
            .ok_or_else(|| Error::Internal("null reservation".into()))?;
        // SAFETY: the part of the reservation past `len`, which we never use.
        unsafe { munmap(end, tail) }.map_err(fail)?;
    }
    NonNull::new(aligned as *mut u8).ok_or_else(|| Error::Internal("null reservation".into()))
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `open`, unmapped once.
        if let Err(e) = unsafe { munmap(self.ptr.cast(), self.map_len) } {
            tracing::warn!(error = %e, "cannot unmap local allocation");
        }
    }
}
