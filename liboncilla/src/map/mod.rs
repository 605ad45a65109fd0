//! Remote memory in the process's address space ([`crate::Allocation::map`]):
//! a remote allocation of any size gets a virtual range of its size, and a
//! touch of a page that is not here yet fetches its block over the
//! allocation's own route (userfaultfd demand paging). An allocation wholly
//! in this node's memory is its own mapping, with no paging.
//!
//! Consistency: a write through the pointer reaches the allocation, and so
//! other processes, at [`Mapped::flush`] (or when its block is evicted, or
//! at unmap); [`Mapped::invalidate`] drops clean blocks so that the next
//! touch sees what others wrote since. Between those, each mapping is a
//! private cache: two mappings of one allocation are not coherent.
//!
//! It owns the options and the handle; paging is [`pager`], its
//! bookkeeping [`blocks`], the kernel's side [`uffd`], the range [`region`];
//! [`OwnedMapping`] holds its allocation instead of borrowing it.

mod blocks;
mod owned;
mod pager;
mod region;
mod uffd;

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

pub use owned::OwnedMapping;
pub use pager::MapStats;

use crate::allocation::Allocation;
use crate::client::Client;
use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use crate::fabric::shm::Mapping;
use crate::fabric::tcp::IoBuf;
use crate::fabric::{Target, Transfer};
use crate::failover::Failover;
use crate::route::Route;
use crate::spec::Kind;
use pager::{Backing, Pager, Plan};

/// Largest block a mapping fetches at once.
pub const MAX_BLOCK: u64 = 64 << 20;

/// How a remote allocation is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MapOptions {
    /// Bytes fetched per fault: a multiple of the page size, up to
    /// [`MAX_BLOCK`] (default 64 KiB).
    pub block: u64,
    /// Most bytes fetched ahead of sequential faults (default 32 MiB; the
    /// block size: none).
    pub read_ahead: u64,
    /// Most bytes of local memory the mapping holds; past it the least
    /// recently faulted blocks are written back if dirty and dropped
    /// (default 1 GiB).
    pub budget: u64,
    /// How long a block's fetch is retried (a node restarting) before its
    /// pages raise SIGBUS (default 30 s; each try is also bounded by the
    /// copy's own deadline).
    pub timeout: Duration,
    /// Threads fetching blocks (default 4).
    pub threads: usize,
}

impl Default for MapOptions {
    fn default() -> Self {
        Self {
            block: 64 << 10,
            read_ahead: 32 << 20,
            budget: 1 << 30,
            timeout: Duration::from_secs(30),
            threads: 4,
        }
    }
}

impl MapOptions {
    pub fn block(mut self, bytes: u64) -> Self {
        self.block = bytes;
        self
    }
    pub fn read_ahead(mut self, bytes: u64) -> Self {
        self.read_ahead = bytes;
        self
    }
    pub fn budget(mut self, bytes: u64) -> Self {
        self.budget = bytes;
        self
    }
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// The pager's plan for `size` bytes, or what is wrong with the options.
    fn plan(&self, size: u64) -> Result<Plan> {
        let page = pager::page_size() as u64;
        let bad = |what: String| Err(Error::InvalidArgument(format!("map: {what}")));
        if self.block == 0 || !self.block.is_multiple_of(page) || self.block > MAX_BLOCK {
            return bad(format!(
                "block {} is not a multiple of the page size ({page}) up to {MAX_BLOCK}",
                self.block
            ));
        }
        if self.budget < self.block {
            return bad(format!(
                "budget {} is smaller than one block ({})",
                self.budget, self.block
            ));
        }
        if self.threads == 0 || self.threads > 64 {
            return bad(format!("threads {} is not 1 to 64", self.threads));
        }
        if self.timeout.is_zero() {
            return bad("a timeout of zero".into());
        }
        let blocks = |bytes: u64| {
            usize::try_from(bytes / self.block)
                .unwrap_or(usize::MAX)
                .max(1)
        };
        let budget_blocks = blocks(self.budget);
        Ok(Plan {
            size,
            block: usize::try_from(self.block).unwrap_or(usize::MAX),
            budget_blocks,
            // Never read ahead more than half the budget: what was read
            // ahead must not push out what is being used.
            window: blocks(self.read_ahead).min((budget_blocks / 2).max(1)),
            timeout: self.timeout,
            workers: self.threads,
        })
    }
}

/// A mapped allocation: its bytes at [`Mapped::as_ptr`], for as long as the
/// mapping (and so the allocation it borrows) lives. Dropping it unmaps
/// after writing dirty blocks back ([`Mapped::unmap`] reports whether that
/// worked).
pub struct Mapped<'a> {
    ptr: *mut u8,
    len: usize,
    pager: Option<Pager>,
    _alloc: PhantomData<&'a Allocation>,
}

// SAFETY: the range is plain memory usable from any thread (faults are
// served by the pager's own threads, whoever touches it); the pager's state
// is behind locks.
unsafe impl Send for Mapped<'_> {}
// SAFETY: as above; `&Mapped` gives out the address and the pager's
// thread-safe calls.
unsafe impl Sync for Mapped<'_> {}

impl std::fmt::Debug for Mapped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapped")
            .field("len", &self.len)
            .field("paged", &self.pager.is_some())
            .finish_non_exhaustive()
    }
}

impl Mapped<'_> {
    /// The first byte of the allocation in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped (the allocation's size).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a touch may fetch (a remote allocation); false for an
    /// allocation in this node's memory, which is mapped directly.
    pub fn is_paged(&self) -> bool {
        self.pager.is_some()
    }

    /// Writes the blocks of `[offset, offset + len)` written through the
    /// pointer back to the allocation: other processes see them from now
    /// on. Nothing to do for a direct mapping.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`]; the first failed write-back (those blocks
    /// stay dirty, and a later flush tries them again).
    pub fn flush(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        match &self.pager {
            Some(p) => p.flush(offset, len),
            None => Ok(()),
        }
    }

    /// Drops the clean blocks of `[offset, offset + len)`, so that the next
    /// touch fetches what the allocation holds then (dirty blocks stay:
    /// flush them first). Nothing to do for a direct mapping.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`]; a failure to drop pages.
    pub fn invalidate(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        match &self.pager {
            Some(p) => p.invalidate(offset, len),
            None => Ok(()),
        }
    }

    /// What paging has done so far (all zero for a direct mapping).
    pub fn stats(&self) -> MapStats {
        self.pager.as_ref().map(Pager::stats).unwrap_or_default()
    }

    /// The last paging failure (a fetch that raised SIGBUS, a write-back
    /// that failed), if any.
    pub fn last_error(&self) -> Option<String> {
        self.pager.as_ref().and_then(Pager::last_error)
    }

    /// Writes dirty blocks back and releases the range.
    ///
    /// # Errors
    /// The write-back's failure, naming how many bytes were lost; the range
    /// is released all the same.
    pub fn unmap(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        let Some(pager) = self.pager.take() else {
            return Ok(());
        };
        let dirty = pager.dirty_bytes();
        pager.stop().map_err(|e| {
            Error::Map(format!(
                "unmapped, but up to {dirty} written bytes could not be written back: {e}"
            ))
        })
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        let size = self.len as u64;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::OutOfBounds { offset, len, size });
        }
        Ok(())
    }
}

impl Drop for Mapped<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            tracing::warn!(error = %e, "dropping a mapped allocation");
        }
    }
}

/// Maps `alloc` ([`Allocation::map`]). The caller ties the mapping's
/// lifetime to the allocation: a borrow of it, or a share it holds
/// ([`OwnedMapping`]).
pub(crate) fn map<'a>(
    alloc: &Allocation,
    client: &Arc<Client>,
    options: MapOptions,
) -> Result<Mapped<'a>> {
    let size = alloc.size();
    if size == 0 {
        return Err(Error::InvalidArgument(
            "cannot map an empty allocation".into(),
        ));
    }
    if matches!(alloc.kind(), Kind::LocalGpu | Kind::RemoteGpu) {
        return Err(Error::Map(format!(
            "allocation {} is GPU memory, which cannot be mapped into a process: copy it with \
             copy_in/copy_out, or use it on its device",
            alloc.id()
        )));
    }
    let plan = options.plan(size)?;
    if let Ok((ptr, len)) = alloc.local_range() {
        return Ok(Mapped {
            ptr,
            len,
            pager: None,
            _alloc: PhantomData,
        });
    }
    let len = usize::try_from(size)
        .map_err(|_| Error::InvalidArgument("allocation too large to map".into()))?;
    // One byte read now: a freed allocation, or a key that no longer opens
    // it, is refused here by name rather than met as a signal at the first
    // touch. A node that cannot be reached now may be back by then: its
    // blocks' fetches decide.
    match alloc.copy_out(0, &mut [0u8; 1]) {
        Ok(()) => {}
        Err(e) if pager::transient(&e) => {}
        Err(e) => return Err(e),
    }
    let page = pager::page_size();
    let faults = uffd::Faults::open()?;
    if !faults.kernel_faults {
        tracing::info!(
            "this process may only handle its own faults (user-mode-only userfaultfd): a \
             system call that writes into a mapped page not fetched yet (read(2) into the \
             mapping) fails with EFAULT; touch it first, or give the process /dev/userfaultfd"
        );
    }
    let region = region::Region::new(len.div_ceil(page) * page)?;
    let ptr = region.base();
    let backing = Box::new(Owned {
        client: Arc::clone(client),
        desc: Arc::clone(&alloc.desc),
        routes: Arc::clone(&alloc.routes),
        local: alloc.local.clone(),
        failover: Arc::clone(&alloc.failover),
        wait: plan.timeout,
    });
    let pager = Pager::start(plan, faults, region, backing)?;
    debug_assert_eq!(pager.base(), ptr);
    Ok(Mapped {
        ptr,
        len,
        pager: Some(pager),
        _alloc: PhantomData,
    })
}

/// What a pager copies through: the allocation's descriptor, routes and
/// same-node mapping, kept alive with the session for as long as it pages,
/// and its way through a loss or a move (the handle's [`Failover`]: a
/// replicated allocation's fetches go to the copies the master describes
/// now, as `copy_out` does).
struct Owned {
    client: Arc<Client>,
    desc: Arc<Descriptor>,
    routes: Arc<[Route]>,
    local: Option<Arc<Mapping>>,
    failover: Arc<Failover>,
    /// The mapping's timeout: no fetch or write-back waits out a loss for
    /// longer.
    wait: Duration,
}

impl Owned {
    fn target(&self) -> Target<'_> {
        Target {
            desc: &self.desc,
            routes: &self.routes,
            local: self.local.as_deref(),
        }
    }
}

impl Backing for Owned {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.failover.read(offset, buf, self.wait, |buf| {
            self.client.data.run([Transfer {
                target: self.target(),
                offset,
                buf: IoBuf::Read(buf),
            }])
        })
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.failover.write(offset, data, self.wait, |data| {
            self.client.data.run([Transfer {
                target: self.target(),
                offset,
                buf: IoBuf::Write(data),
            }])
        })
    }
}
