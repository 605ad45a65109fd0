//! Same-node mapping: asks the local agent for the memory files behind the
//! extents of an allocation that live on this node and maps the pool
//! extents holding them, back to back, into one range of this process, so
//! copies to them are memcpy and a wholly local allocation is one plain
//! buffer. The mapping is populated when it is made (`MAP_POPULATE`): the
//! agent already holds the pages resident and locked, so this only fills
//! page tables, once, instead of taking a fault on the first touch of
//! every page in the middle of the application's copies and loops.
//!
//! It owns the mapping and unmaps it on drop, after releasing its
//! registration with the GPU driver (made by device copies, kept in the
//! session's [`PinCache`]). It never frees the allocation (the handle
//! does, after dropping the mapping).

use std::io::{IoSliceMut, Read, Write};
use std::num::NonZeroUsize;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::mman::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use oncilla_cuda::hostreg::PinCache;
use oncilla_net::credential::Credential;
use oncilla_net::wire::{
    self, MapFile, MapGrant, Op, Reply, Request, Status, GRANT_LEN, KEY_LEN, MAP_FILE_LEN,
    REPLY_LEN,
};

use crate::descriptor::Extent;
use crate::error::{Error, Result};

const TIMEOUT: Duration = Duration::from_secs(10);

/// One mapped extent: `[alloc_offset, alloc_offset + len)` of the
/// allocation is at `base + at` in this process.
#[derive(Debug, Clone, Copy)]
struct Mapped {
    alloc_offset: u64,
    len: u64,
    at: usize,
}

/// The extents of an allocation that live on this node, mapped shared.
/// What a mapping's lease says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    Live,
    /// The allocation was freed.
    Released,
    /// The agent stopped: what stays mapped is no longer its memory.
    AgentGone,
}

pub struct Mapping {
    base: NonNull<u8>,
    map_len: usize,
    /// The part of the reservation the files were mapped into (the rest
    /// stays inaccessible): what the GPU driver registers.
    mapped_len: usize,
    /// Ordered by `alloc_offset`.
    extents: Vec<Mapped>,
    /// The map connection, kept open as the lease on the memory: the agent
    /// holds the extents until it closes and writes a byte on it when the
    /// allocation is released.
    lease: UnixStream,
    /// The node whose agent serves it (this one).
    node: String,
    /// The session's registrations with the GPU driver: this mapping's is
    /// released before it is unmapped.
    pins: Arc<PinCache>,
}

// SAFETY: the mapping is process-wide memory owned by this value; moving it
// between threads moves only the pointer.
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` hands out only raw pointers; callers synchronise.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `extents` of allocation `id` (all held by the local agent behind
    /// `socket`, in allocation order).
    ///
    /// # Errors
    /// [`Error::AgentUnreachable`], [`Error::PermissionDenied`],
    /// [`Error::NotFound`], and mapping failures.
    pub fn open(
        socket: &Path,
        credential: &Credential,
        id: u64,
        key: &[u8; KEY_LEN],
        extents: &[&Extent],
        pins: &Arc<PinCache>,
    ) -> Result<Self> {
        let path = oncilla_net::map_socket(socket);
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
        super::greet(&mut stream, credential, fail)?;
        let impossible = || {
            Error::Internal(format!(
                "the agent granted allocation {id} with an impossible layout"
            ))
        };

        // One address range for everything, reserved once the first grant
        // names the page size: each distinct pool extent is mapped into it
        // back to back as its files arrive (each fd closed once mapped), so
        // a wholly local allocation is one contiguous buffer. Extents that
        // lie in a pool extent already mapped (striped extents share them)
        // are not asked for again.
        let mut range: Option<Reserved> = None;
        let mut pools: Vec<(MapGrant, usize)> = Vec::new();
        let mut mapped = Vec::with_capacity(extents.len());
        for e in extents {
            let known = pools.iter().find(|(g, _)| {
                g.pool_offset <= e.pool_offset
                    && e.pool_offset
                        .checked_add(e.len)
                        .is_some_and(|end| end <= g.pool_offset + g.map_len)
            });
            if let Some((g, start)) = known {
                let within =
                    usize::try_from(e.pool_offset - g.pool_offset).map_err(|_| impossible())?;
                mapped.push(Mapped {
                    alloc_offset: e.alloc_offset,
                    len: e.len,
                    at: start + within,
                });
                continue;
            }
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
            let grant = receive_grant(&mut stream, &fail)?;
            if grant
                .at
                .checked_add(e.len)
                .is_none_or(|end| end > grant.map_len)
                || grant.pool_offset.checked_add(grant.at) != Some(e.pool_offset)
            {
                return Err(impossible());
            }
            if range.is_none() {
                // Pool extents hold only this allocation's bytes, so the
                // distinct ones add up to at most its extents' lengths,
                // each rounded up to a page.
                let mut total = 0u64;
                for x in extents {
                    total = total
                        .checked_add(oncilla_model::size::round_up(x.len, grant.page))
                        .ok_or_else(impossible)?;
                }
                let len = usize::try_from(total).map_err(|_| impossible())?;
                let align = usize::try_from(grant.page).map_err(|_| impossible())?;
                range = Some(Reserved {
                    base: reserve_aligned(len, align)?,
                    len,
                    page: grant.page,
                    used: 0,
                });
            }
            let Some(r) = range.as_mut() else {
                return Err(impossible());
            };
            if grant.page != r.page {
                return Err(impossible());
            }
            let start = r.used;
            r.map_files(&mut stream, &grant, &fail, id)?;
            pools.push((grant, start));
            mapped.push(Mapped {
                alloc_offset: e.alloc_offset,
                len: e.len,
                at: start + usize::try_from(grant.at).map_err(|_| impossible())?,
            });
        }
        let Some(r) = range else {
            return Err(Error::Internal(format!(
                "no extent of allocation {id} to map here"
            )));
        };
        // The Mapping unmaps the range from here on.
        let r = std::mem::ManuallyDrop::new(r);
        stream
            .set_nonblocking(true)
            .map_err(|e| fail(e.to_string()))?;
        mapped.sort_by_key(|m| m.alloc_offset);
        Ok(Self {
            base: r.base,
            map_len: r.len,
            mapped_len: r.used,
            extents: mapped,
            lease: stream,
            node: extents.first().map_or_else(String::new, |e| e.node.clone()),
            pins: Arc::clone(pins),
        })
    }

    /// The node whose pool is mapped.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Whether the allocation is still served: a non-blocking peek at the
    /// lease.
    pub fn lease(&self) -> Lease {
        let mut byte = [0u8; 1];
        match nix::sys::socket::recv(
            std::os::fd::AsRawFd::as_raw_fd(&self.lease),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            Err(nix::Error::EAGAIN) => Lease::Live,
            Ok(1) => Lease::Released,
            // End of stream or an error: the agent is gone.
            _ => Lease::AgentGone,
        }
    }

    /// Where bytes `[offset, offset + len)` of the allocation are in this
    /// process, when one mapped extent holds them all.
    pub fn ptr_for(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let i = self
            .extents
            .partition_point(|m| m.alloc_offset <= offset)
            .checked_sub(1)?;
        let m = self.extents[i];
        let within = offset - m.alloc_offset;
        (within.checked_add(len)? <= m.len).then(|| {
            self.base
                .as_ptr()
                .wrapping_add(m.at + usize::try_from(within).unwrap_or(usize::MAX))
        })
    }

    /// The mapped range in this process (start, length), the pool
    /// extents back to back: what is registered with the GPU driver, once,
    /// for device copies.
    pub fn range(&self) -> (*mut u8, usize) {
        (self.base.as_ptr(), self.mapped_len)
    }

    /// The start of the allocation when all of its `size` bytes are mapped
    /// in order without gaps (a wholly local, unstriped allocation).
    pub fn contiguous(&self, size: u64) -> Option<*mut u8> {
        let mut next = 0u64;
        for m in &self.extents {
            if m.alloc_offset != next || m.at != usize::try_from(next).ok()? {
                return None;
            }
            next += m.len;
        }
        (next == size && size > 0).then_some(self.base.as_ptr())
    }
}

/// Receives one reply of the map socket up to its grant (checked for a
/// layout that can be mapped: page multiples, a bounded file count), or
/// the agent's refusal. The files follow ([`Reserved::map_files`]).
fn receive_grant(stream: &mut UnixStream, fail: &impl Fn(String) -> Error) -> Result<MapGrant> {
    // Exact reads: the files' fds ride on later bytes, which a read past
    // this reply would take and drop.
    let mut head = [0u8; REPLY_LEN];
    stream
        .read_exact(&mut head)
        .map_err(|e| fail(e.to_string()))?;
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
            Status::Busy => Error::CapacityExhausted(msg),
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
    let grant = MapGrant::decode(&body);
    let page = grant.page;
    if !page.is_power_of_two()
        || page < oncilla_model::PAGE
        || !grant.map_len.is_multiple_of(page)
        || grant.files == 0
        || grant.files > grant.map_len / page
    {
        return Err(fail(
            "the agent granted memory with an impossible layout".into(),
        ));
    }
    Ok(grant)
}

/// The address range a [`Mapping`] is built in, while it is.
struct Reserved {
    base: NonNull<u8>,
    len: usize,
    page: u64,
    /// Bytes from `base` mapped so far.
    used: usize,
}

impl Reserved {
    /// Receives `grant`'s files and maps each at the end of what is mapped
    /// (closing its fd at once), checking that they add up to the pool
    /// extent and stay inside the range.
    fn map_files(
        &mut self,
        stream: &mut UnixStream,
        grant: &MapGrant,
        fail: &impl Fn(String) -> Error,
        id: u64,
    ) -> Result<()> {
        let impossible = || fail("the agent granted memory with an impossible layout".into());
        let end = usize::try_from(grant.map_len)
            .ok()
            .and_then(|n| self.used.checked_add(n))
            .filter(|&end| end <= self.len)
            .ok_or_else(impossible)?;
        for _ in 0..grant.files {
            let (fd, f) = receive_file(stream, fail)?;
            let size = usize::try_from(f.len)
                .ok()
                .filter(|&n| n > 0 && self.used.checked_add(n).is_some_and(|e| e <= end))
                .and_then(NonZeroUsize::new)
                .ok_or_else(impossible)?;
            if !f.len.is_multiple_of(self.page) || !f.file_offset.is_multiple_of(self.page) {
                return Err(impossible());
            }
            let off = i64::try_from(f.file_offset).map_err(|_| impossible())?;
            let addr = NonZeroUsize::new(self.base.as_ptr() as usize + self.used)
                .ok_or_else(impossible)?;
            // SAFETY: [addr, addr + size) lies inside the range reserved
            // for this mapping (checked against `end`, itself inside it),
            // which nothing else uses, so MAP_FIXED replaces only our own
            // reservation; the offset and length are page multiples
            // (checked) and so is everything mapped before, so `addr` is
            // aligned too.
            unsafe {
                mmap(
                    Some(addr),
                    size,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED | MapFlags::MAP_FIXED | MapFlags::MAP_POPULATE,
                    &fd,
                    off,
                )
            }
            .map_err(|err| Error::Internal(format!("cannot map local allocation {id}: {err}")))?;
            // The mapping keeps the memory; the descriptor is not needed.
            drop(fd);
            self.used += size.get();
        }
        if self.used != end {
            return Err(impossible());
        }
        Ok(())
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        // Only while building: a finished Mapping takes over the range.
        // SAFETY: the reservation made for this mapping, unmapped once.
        let _ = unsafe { munmap(self.base.cast(), self.len) };
    }
}

/// Receives one [`MapFile`] frame and the memfd that came with it.
fn receive_file(
    stream: &mut UnixStream,
    fail: &impl Fn(String) -> Error,
) -> Result<(OwnedFd, MapFile)> {
    let mut frame = [0u8; MAP_FILE_LEN];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let (got, fd) = {
        let mut iov = [IoSliceMut::new(&mut frame)];
        let msg = recvmsg::<()>(
            std::os::fd::AsRawFd::as_raw_fd(stream),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| fail(e.to_string()))?;
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(fail(
                "a memory descriptor did not fit (is this process out of file descriptors?)".into(),
            ));
        }
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
    if got < MAP_FILE_LEN {
        stream
            .read_exact(&mut frame[got..])
            .map_err(|e| fail(e.to_string()))?;
    }
    let fd = fd.ok_or_else(|| {
        fail("agent sent no memory descriptor (is this process out of file descriptors?)".into())
    })?;
    Ok((fd, MapFile::decode(&frame)))
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
        // Registered memory must be unregistered while it is still mapped.
        // No copy uses the registration now (each holds the mapping while
        // it runs), so this unregisters at once.
        self.pins
            .release(self.base.as_ptr() as usize, self.mapped_len);
        // SAFETY: exactly the mapping made in `open`, unmapped once.
        if let Err(e) = unsafe { munmap(self.base.cast(), self.map_len) } {
            tracing::warn!(error = %e, "cannot unmap local allocation");
        }
    }
}

/// The shared-memory transport: memcpy between caller memory and this
/// node's extents mapped into this process.
pub(crate) struct Memcpy;

impl super::Transport for Memcpy {
    /// Where a piece lies in a [`Mapping`] (from [`Mapping::ptr_for`],
    /// which checked that the mapping holds all of it) and the caller's
    /// memory.
    type Piece<'a> = (*mut u8, crate::fabric::tcp::IoBuf<'a>);

    fn execute(&self, _: super::Peer<'_>, pieces: &mut [Self::Piece<'_>]) -> Result<()> {
        use crate::fabric::tcp::IoBuf;
        for (ptr, buf) in pieces {
            match buf {
                // SAFETY: `ptr` maps exactly this piece of an extent on
                // this node (`ptr_for` checked the range) and stays valid
                // while the mapping is borrowed, which the caller's
                // transfer does for the whole copy; `b` is caller memory,
                // so they cannot overlap.
                IoBuf::Write(b) => unsafe {
                    std::ptr::copy_nonoverlapping(b.as_ptr(), *ptr, b.len());
                },
                // SAFETY: as above, with the roles swapped.
                IoBuf::Read(b) => unsafe {
                    std::ptr::copy_nonoverlapping(*ptr, b.as_mut_ptr(), b.len());
                },
                // Copies between allocations plan pulls only into
                // extents that are not mapped (`crate::between`).
                IoBuf::Pull(_) => {
                    return Err(Error::Internal(
                        "a pull was planned into a mapped extent".into(),
                    ))
                }
            }
        }
        Ok(())
    }
}
