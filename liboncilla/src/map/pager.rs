//! Demand paging of one mapped allocation: workers that take the kernel's
//! fault reports themselves (the one that reads a fault fetches the
//! faulted block, so a fault waits for no hand-off between threads), fetch
//! blocks read ahead over the allocation's own route and fill them in,
//! write dirty blocks back, and keep the mapping within its budget.
//!
//! Ordering rules, which make it correct with any number of application
//! threads touching the range:
//! - A block changes state under the block table's lock. While it is
//!   fetching, it belongs to the worker fetching it: eviction, flush and
//!   invalidation take present blocks only, so the fill runs outside the
//!   lock (room kept for it), and the kernel wakes every thread waiting on
//!   its pages when they go in, whether or not its report was read yet.
//! - A fetched block arrives write-protected (unless a write faulted it
//!   in), so its first write is always seen; a dirty block is
//!   write-protected again *before* its bytes are read for a write-back,
//!   so no write can slip between the copy and the mark "clean".
//! - A block's pages are dropped only after it is written back, and a
//!   thread that touches a block while it is written back or dropped waits
//!   (the kernel holds it) until that ends, then retries.
//! - A fetch that still fails after the timeout seals the block: the
//!   threads that touch it get SIGBUS, never zeros, never a hang.
//!
//! It owns its threads and the block table; it never chooses a route (the
//! [`Backing`] copies as the allocation does).

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::blocks::{Blocks, OnWrite, State};
use super::region::Region;
use super::uffd::{Fault, Faults};
use crate::error::{Error, Result};

/// Where a mapping's bytes come from and go back to.
pub(crate) trait Backing: Send + Sync + 'static {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    fn write(&self, offset: u64, data: &[u8]) -> Result<()>;
}

/// How a pager works (validated by [`super::MapOptions`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// Bytes of the allocation.
    pub(crate) size: u64,
    /// Bytes per block (a multiple of the page size).
    pub(crate) block: usize,
    /// Most blocks present at once.
    pub(crate) budget_blocks: usize,
    /// Most blocks one sequential fault fetches.
    pub(crate) window: usize,
    /// How long a block's fetch is retried before its pages are sealed
    /// (touching them raises SIGBUS).
    pub(crate) timeout: Duration,
    /// Fetching threads.
    pub(crate) workers: usize,
}

/// What a mapping has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapStats {
    /// Faults on pages not present (each fetches or waits for one block).
    pub faults: u64,
    /// Bytes fetched (faulted in or read ahead).
    pub fetched: u64,
    /// Bytes written back (by flush, eviction or unmap).
    pub written_back: u64,
    /// Blocks dropped to stay within the budget.
    pub evicted: u64,
    /// Bytes of local memory the mapping holds now.
    pub resident: u64,
}

struct Shared {
    plan: Plan,
    /// Blocks in the allocation.
    count: usize,
    faults: Faults,
    region: Region,
    backing: Box<dyn Backing>,
    blocks: Mutex<Blocks>,
    /// Runs of blocks to fetch: `(first, count)`.
    jobs: Mutex<VecDeque<Run>>,
    /// Counts the queued runs (a semaphore): a worker takes a run only
    /// after taking one count, and its epoll wakes one waiting worker per
    /// run queued.
    queued: EventFd,
    /// Signalled when a block leaves (room for a fetched one).
    room: Condvar,
    stop: AtomicBool,
    /// Written to when stopping, so every worker's wait returns.
    stop_write: OwnedFd,
    stop_read: OwnedFd,
    last_error: Mutex<Option<String>>,
    faults_seen: AtomicU64,
    fetched: AtomicU64,
    written_back: AtomicU64,
    evicted: AtomicU64,
}

/// A running pager; stopping it (or dropping it) joins its threads.
pub(crate) struct Pager {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Pager {
    /// Registers `region` with `faults` and starts paging it from `backing`.
    pub(crate) fn start(
        plan: Plan,
        faults: Faults,
        region: Region,
        backing: Box<dyn Backing>,
    ) -> Result<Self> {
        faults.register(region.base(), region.len())?;
        let (stop_read, stop_write) = nix::unistd::pipe()
            .map_err(|e| Error::Map(format!("cannot make the pager's wake-up pipe: {e}")))?;
        let count = usize::try_from(plan.size.div_ceil(plan.block as u64))
            .map_err(|_| Error::InvalidArgument("allocation too large to map".into()))?;
        let shared = Arc::new(Shared {
            blocks: Mutex::new(Blocks::new(count, plan.budget_blocks, plan.window)),
            plan,
            count,
            faults,
            region,
            backing,
            jobs: Mutex::new(VecDeque::new()),
            queued: EventFd::from_flags(
                EfdFlags::EFD_SEMAPHORE | EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC,
            )
            .map_err(|e| Error::Map(format!("cannot make the pager's run counter: {e}")))?,
            room: Condvar::new(),
            stop: AtomicBool::new(false),
            stop_write,
            stop_read,
            last_error: Mutex::new(None),
            faults_seen: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            written_back: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        });
        let mut pager = Pager {
            shared,
            threads: Vec::new(),
        };
        for i in 0..plan.workers.max(1) {
            let epoll = watch(&pager.shared)?;
            let s = Arc::clone(&pager.shared);
            let thread = std::thread::Builder::new()
                .name(format!("ocm-pager-{i}"))
                .spawn(move || worker(&s, &epoll))
                .map_err(|e| Error::Map(format!("cannot start the pager's threads: {e}")))?;
            pager.threads.push(thread);
        }
        Ok(pager)
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.shared.region.base()
    }

    /// Writes the dirty blocks of `[offset, offset + len)` back, each run of
    /// neighbours in one copy; returns the first failure after trying every
    /// run (its blocks stay dirty).
    pub(crate) fn flush(&self, offset: u64, len: u64) -> Result<()> {
        let s = &self.shared;
        let range = s.blocks_of(offset, len);
        let dirty = s.table().begin_write_back(range);
        let mut first = Ok(());
        for (start, count) in runs(&dirty, usize::MAX) {
            let r = s.write_back(start, count);
            for b in start..start + count {
                let dirty_again = {
                    let mut t = s.table();
                    t.written(b, r.is_ok());
                    t.state(b) == State::Dirty
                };
                if dirty_again {
                    // A writer waits, or it was not written: writable.
                    if let Err(e) = s.faults.unprotect(s.at(b), s.pages(b)) {
                        s.note(&e);
                    }
                }
            }
            if let Err(e) = r {
                s.note(&e);
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Drops the clean blocks of `[offset, offset + len)`: the next touch
    /// fetches them again (and sees what other processes wrote since).
    pub(crate) fn invalidate(&self, offset: u64, len: u64) -> Result<()> {
        let range = self.shared.blocks_of(offset, len);
        // Under the lock: no fetch can fill a block between its drop and
        // its mark "absent".
        let mut t = self.shared.table();
        for b in t.drop_clean(range) {
            self.shared
                .region
                .discard(b * self.shared.plan.block, self.shared.span(b).1)?;
        }
        Ok(())
    }

    pub(crate) fn stats(&self) -> MapStats {
        let s = &self.shared;
        let present = s.table().present() as u64;
        MapStats {
            faults: s.faults_seen.load(Ordering::Relaxed),
            fetched: s.fetched.load(Ordering::Relaxed),
            written_back: s.written_back.load(Ordering::Relaxed),
            evicted: s.evicted.load(Ordering::Relaxed),
            resident: present * s.plan.block as u64,
        }
    }

    pub(crate) fn last_error(&self) -> Option<String> {
        self.shared
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Blocks still dirty (what stopping now would lose).
    pub(crate) fn dirty_bytes(&self) -> u64 {
        self.shared.table().dirty() as u64 * self.shared.plan.block as u64
    }

    /// Writes every dirty block back, stops the threads and unregisters
    /// the range. Returns the write-back's failure, if any (the range is
    /// released all the same).
    pub(crate) fn stop(mut self) -> Result<()> {
        let flushed = self.flush(0, self.shared.plan.size);
        self.halt();
        flushed
    }

    fn halt(&mut self) {
        let s = &self.shared;
        s.stop.store(true, Ordering::SeqCst);
        let _ = nix::unistd::write(&s.stop_write, &[1]);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Err(e) = s.faults.unregister(s.region.base(), s.region.len()) {
            tracing::warn!(error = %e, "cannot unregister a mapped range");
        }
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.halt();
        }
    }
}

impl Shared {
    fn table(&self) -> MutexGuard<'_, Blocks> {
        // A panic while holding it leaves a consistent table: every change
        // is one assignment.
        self.blocks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The block indices covering `[offset, offset + len)`, clipped to the
    /// allocation.
    fn blocks_of(&self, offset: u64, len: u64) -> std::ops::Range<usize> {
        let block = self.plan.block as u64;
        let end = offset.saturating_add(len).min(self.plan.size);
        let first = usize::try_from(offset / block).unwrap_or(usize::MAX);
        let last = usize::try_from(end.div_ceil(block)).unwrap_or(usize::MAX);
        first..last.max(first)
    }

    /// Block `b`'s offset in the allocation and its bytes there (the last
    /// block may be short).
    fn span(&self, b: usize) -> (u64, usize) {
        let block = self.plan.block as u64;
        let offset = b as u64 * block;
        let len = (self.plan.size - offset).min(block);
        // At most `block`, a usize.
        (offset, usize::try_from(len).unwrap_or(self.plan.block))
    }

    /// Block `b`'s first byte in the region.
    fn at(&self, b: usize) -> *mut u8 {
        // In range: `b` is a block of the allocation, whose bytes the
        // region holds.
        self.region.base().wrapping_add(b * self.plan.block)
    }

    /// The block of a faulting address, if it is in the range.
    fn block_at(&self, addr: usize) -> Option<usize> {
        let base = self.region.base() as usize;
        let b = addr.checked_sub(base)? / self.plan.block;
        (b < self.count).then_some(b)
    }

    /// Page-rounded length of block `b` (what fills and seals cover).
    fn pages(&self, b: usize) -> usize {
        let page = page_size();
        self.span(b).1.div_ceil(page) * page
    }

    /// Blocks that cannot be filled (`e` says why): marked failed, and
    /// sealed so that touching them raises SIGBUS.
    fn give_up(&self, blocks: std::ops::Range<usize>, e: &Error) {
        self.note(e);
        for b in blocks {
            self.table().failed(b);
            self.seal(b);
        }
    }

    /// Makes failed block `b` raise SIGBUS when touched, and wakes the
    /// threads waiting on it so that they take the signal.
    fn seal(&self, b: usize) {
        let pages = self.pages(b);
        let sealed = self
            .region
            .seal(b * self.plan.block, pages)
            .and_then(|()| self.faults.wake(self.at(b), pages));
        if let Err(e) = sealed {
            self.note(&e);
        }
    }

    fn note(&self, e: &Error) {
        tracing::warn!(error = %e, "mapped allocation");
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
    }

    /// The allocation's bytes of blocks `first..first + count`: their
    /// offset and length (the last block may be short).
    fn run_span(&self, first: usize, count: usize) -> (u64, usize) {
        let (offset, _) = self.span(first);
        let (last, last_len) = self.span(first + count - 1);
        // At most `count` blocks, which the region holds: a usize.
        let len = usize::try_from(last - offset).unwrap_or(usize::MAX) + last_len;
        (offset, len)
    }

    /// Reads blocks `first..first + count` in one copy, retrying what may
    /// pass (a node restarting, a broken connection) until the timeout.
    fn fetch(&self, first: usize, count: usize, buf: &mut [u8]) -> Result<()> {
        let (offset, len) = self.run_span(first, count);
        let deadline = Instant::now() + self.plan.timeout;
        let mut pause = Duration::from_millis(20);
        loop {
            match self.backing.read(offset, &mut buf[..len]) {
                Ok(()) => return Ok(()),
                Err(e) if transient(&e) && Instant::now() + pause < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes blocks `first..first + count` back in one copy, after
    /// write-protecting them (so nobody changes them while they are read).
    fn write_back(&self, first: usize, count: usize) -> Result<()> {
        let (offset, len) = self.run_span(first, count);
        let last = first + count - 1;
        let pages = last * self.plan.block + self.pages(last) - first * self.plan.block;
        self.faults.protect(self.at(first), pages)?;
        // SAFETY: the blocks are present (dirty blocks are) and write-
        // protected, so their `len` bytes are mapped and nobody changes
        // them while they are read; they lie inside the region.
        let bytes = unsafe { std::slice::from_raw_parts(self.at(first), len) };
        self.backing.write(offset, bytes)?;
        self.written_back.fetch_add(len as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Evicts `victims` (written back first where dirty, each run of dirty
    /// neighbours in one copy).
    fn evict(&self, victims: Vec<(usize, bool)>) {
        let mut dirty: Vec<usize> = victims.iter().filter(|v| v.1).map(|v| v.0).collect();
        dirty.sort_unstable();
        let mut failed = Vec::new();
        for (start, count) in runs(&dirty, usize::MAX) {
            if let Err(e) = self.write_back(start, count) {
                // Their bytes exist nowhere else: they stay, over budget.
                self.note(&e);
                failed.extend(start..start + count);
            }
        }
        for (b, _) in victims {
            let pages = self.pages(b);
            if failed.contains(&b) {
                self.table().kept(b);
                self.room.notify_all();
                if let Err(e) = self.faults.unprotect(self.at(b), pages) {
                    self.note(&e);
                }
                continue;
            }
            let dropped = self.region.discard(b * self.plan.block, pages);
            let waiting = self.table().evicted(b);
            self.room.notify_all();
            self.evicted.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = dropped {
                self.note(&e);
            }
            if waiting {
                if let Err(e) = self.faults.wake(self.at(b), pages) {
                    self.note(&e);
                }
            }
        }
    }

    /// The block table once one more block fits within the budget: the
    /// least recently faulted blocks are evicted first (written back where
    /// dirty), so the mapping never holds more than its budget. Where
    /// nothing can leave (every present block busy, or kept because its
    /// write-back failed) the block goes in over budget rather than wait
    /// for ever.
    fn make_room(&self) -> MutexGuard<'_, Blocks> {
        let mut t = self.table();
        while !t.has_room() {
            let victims = t.make_room(1);
            if !victims.is_empty() {
                drop(t);
                self.evict(victims);
                t = self.table();
            } else if t.leaving() > 0 {
                // Others' evictions are under way: they make the room.
                t = self.room.wait(t).unwrap_or_else(|e| e.into_inner());
            } else {
                break;
            }
        }
        t
    }

    /// The runs for a fault on `faulted`, given the blocks to fetch
    /// (`faulted` first if it was absent, then those read ahead): the
    /// faulted block alone, so the thread waits for one block, not a whole
    /// run; then the blocks read ahead in runs of neighbours of up to
    /// [`RUN_MAX`] bytes, which the workers fetch side by side.
    fn runs_to_fetch(&self, faulted: usize, fetch: &[usize]) -> (Option<Run>, Vec<Run>) {
        let (first, ahead) = match fetch.split_first() {
            Some((&b, rest)) if b == faulted => (Some((b, 1)), rest),
            _ => (None, fetch),
        };
        (first, runs(ahead, self.per_run()))
    }

    /// Most blocks in one run ([`RUN_MAX`] bytes, at least one block).
    fn per_run(&self) -> usize {
        (RUN_MAX / self.plan.block).max(1)
    }

    /// Handles one fault report. Returns the run this worker fetches now
    /// (the faulted block, when nobody fetches it yet); runs read ahead go
    /// to the queue.
    fn on_fault(&self, fault: Fault) -> Result<Option<Run>> {
        match fault {
            Fault::Missing { addr, write } => {
                let Some(b) = self.block_at(addr) else {
                    return Ok(None);
                };
                self.faults_seen.fetch_add(1, Ordering::Relaxed);
                let mut t = self.table();
                match t.state(b) {
                    State::Absent | State::Fetching { .. } => {
                        let fetch = t.fault(b, write);
                        drop(t);
                        let (mine, ahead) = self.runs_to_fetch(b, &fetch);
                        self.queue(ahead);
                        Ok(mine)
                    }
                    // Being dropped: the thread waits, then refaults.
                    State::Evicting { .. } => {
                        t.wait_on(b);
                        Ok(None)
                    }
                    // Present already (the fill raced this report), or
                    // sealed: the retry finds the page or the signal.
                    State::Clean | State::Dirty | State::Writing | State::Failed => {
                        self.faults.wake(self.at(b), self.pages(b)).map(|()| None)
                    }
                }
            }
            Fault::Protected { addr } => {
                let Some(b) = self.block_at(addr) else {
                    return Ok(None);
                };
                let action = self.table().write_fault(b);
                match action {
                    OnWrite::Unprotect => self.faults.unprotect(self.at(b), self.pages(b)),
                    OnWrite::Wait => Ok(()),
                    OnWrite::Wake => self.faults.wake(self.at(b), self.pages(b)),
                }
                .map(|()| None)
            }
        }
    }

    /// Queues runs read ahead, one count each, so that each wakes one
    /// waiting worker (not all of them: on a busy machine the others would
    /// only contend for the queue).
    fn queue(&self, runs: Vec<Run>) {
        if runs.is_empty() {
            return;
        }
        let n = runs.len();
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(runs);
        for _ in 0..n {
            if let Err(e) = self.queued.write(1) {
                // Only past 2^64 - 2 counts, which a queue of runs never
                // reaches; an uncounted run waits for the next count.
                self.note(&Error::Map(format!("cannot count a queued run: {e}")));
            }
        }
    }

    /// A queued run, if one is left (taken with its count).
    fn take_run(&self) -> Option<Run> {
        match self.queued.read() {
            Ok(_) => self
                .jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front(),
            Err(_) => None, // EAGAIN: none queued
        }
    }

    /// Fetches run `first..first + count` in one copy and fills it in, or
    /// seals it when the fetch fails for good.
    fn fetch_run(&self, first: usize, count: usize, buf: &mut [u8]) {
        match self.fetch(first, count, buf) {
            Ok(()) => self.fill_run(first, count, buf),
            Err(e) => {
                let (offset, len) = self.run_span(first, count);
                let e = Error::Map(format!(
                    "cannot fetch {len} mapped bytes at offset {offset}; their pages raise \
                     SIGBUS: {e}"
                ));
                self.give_up(first..first + count, &e);
            }
        }
    }
}

/// A worker, until the pager stops: fault reports first (the one that
/// reads a fault fetches the faulted block itself), then queued runs, and
/// when there is neither, a wait for either. The fault descriptor and the
/// counter are watched with `EPOLLEXCLUSIVE`, so an event wakes one
/// waiting worker, not all.
fn worker(s: &Shared, epoll: &Epoll) {
    let mut buf = vec![0u8; s.per_run() * s.plan.block];
    // One report at a time: the others stay for the other workers.
    let mut msg = super::uffd::message_buffer(1);
    let mut events = [EpollEvent::empty(); 3];
    while !s.stop.load(Ordering::SeqCst) {
        match s.faults.read(&mut msg) {
            Ok(faults) if !faults.is_empty() => {
                for f in faults {
                    match s.on_fault(f) {
                        Ok(Some((first, count))) => s.fetch_run(first, count, &mut buf),
                        Ok(None) => {}
                        Err(e) => s.note(&e),
                    }
                }
                continue;
            }
            Ok(_) => {}
            Err(e) => s.note(&e),
        }
        if let Some((first, count)) = s.take_run() {
            s.fetch_run(first, count, &mut buf);
            continue;
        }
        match epoll.wait(&mut events, EpollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                return s.note(&Error::Map(format!("cannot wait for page faults: {e}")));
            }
        }
    }
}

/// An epoll of the fault descriptor and the run counter (one waiter woken
/// per event) and the stop pipe (all woken). Its events carry no tag: a
/// woken worker looks at every source.
fn watch(s: &Shared) -> Result<Epoll> {
    let fail = |e: nix::errno::Errno| Error::Map(format!("cannot watch for page faults: {e}"));
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(fail)?;
    let one = EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE;
    epoll
        .add(s.faults.as_fd(), EpollEvent::new(one, 0))
        .map_err(fail)?;
    epoll
        .add(s.queued.as_fd(), EpollEvent::new(one, 0))
        .map_err(fail)?;
    epoll
        .add(s.stop_read.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 0))
        .map_err(fail)?;
    Ok(epoll)
}

/// Consecutive blocks `(first, count)`, fetched in one copy.
type Run = (usize, usize);

/// Most bytes one fetch reads: queued neighbours (read ahead) come in one
/// copy, up to this.
const RUN_MAX: usize = 4 << 20;

impl Shared {
    /// Fills fetched blocks `first..first + count` (their bytes in `buf`)
    /// into the range: room made for each, then one fill per stretch of
    /// neighbours that go in alike (write-protected, or writable because a
    /// write faulted them). The fill itself runs outside the table's lock,
    /// with room kept for it, so workers fill side by side: a fill copies
    /// the bytes again, page by page, and costs as much as their fetch.
    /// Nothing else changes a block while it is fetching (eviction, flush
    /// and invalidation take present blocks only), and the fill wakes the
    /// threads that fault on it.
    fn fill_run(&self, first: usize, count: usize, buf: &mut [u8]) {
        let end = first + count;
        // Past the allocation's end, the last page reads zeros.
        let (_, len) = self.run_span(first, count);
        let whole = (count - 1) * self.plan.block + self.pages(end - 1);
        buf[len..whole].fill(0);
        let mut b = first;
        while b < end {
            let mut t = self.make_room();
            let writable = t.fetch_writes(b);
            let mut stop = b + 1;
            while stop < end && t.fetch_writes(stop) == writable && t.has_room_for(stop - b + 1) {
                stop += 1;
            }
            t.reserve(stop - b);
            drop(t);
            let at = (b - first) * self.plan.block;
            let pages = (stop - 1 - b) * self.plan.block + self.pages(stop - 1);
            // SAFETY: blocks `b..stop` are page-aligned inside the
            // registered region and `pages` long together; `buf` holds
            // `pages` bytes from `at` (the run's bytes, zeroed past the
            // allocation's end).
            let filled = unsafe {
                self.faults
                    .fill(self.at(b), buf[at..].as_ptr(), pages, writable)
            };
            let mut t = self.table();
            t.filled(stop - b);
            match filled {
                Ok(()) => {
                    for x in b..stop {
                        t.fetched(x);
                        self.fetched
                            .fetch_add(self.span(x).1 as u64, Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    drop(t);
                    self.room.notify_all();
                    self.give_up(b..stop, &e);
                }
            }
            b = stop;
        }
    }
}

/// Runs of consecutive blocks in `sorted`: `(first, count)`, each at most
/// `max` long.
fn runs(sorted: &[usize], max: usize) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for &b in sorted {
        match out.last_mut() {
            Some((first, count)) if *first + *count == b && *count < max => *count += 1,
            _ => out.push((b, 1)),
        }
    }
    out
}

/// Failures a retry may get past.
pub(crate) fn transient(e: &Error) -> bool {
    matches!(
        e,
        Error::NodeUnreachable { .. }
            | Error::Fabric { .. }
            | Error::Unavailable(_)
            | Error::NodeDown(_)
    )
}

pub(crate) fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_group_neighbours_up_to_a_bound() {
        assert_eq!(runs(&[], 4), vec![]);
        assert_eq!(
            runs(&[3, 4, 5, 9, 10, 12], 8),
            vec![(3, 3), (9, 2), (12, 1)]
        );
        assert_eq!(runs(&[0, 1, 2, 3, 4], 2), vec![(0, 2), (2, 2), (4, 1)]);
    }
}
