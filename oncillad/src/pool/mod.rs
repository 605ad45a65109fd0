//! The node's exported memory: slabs of address space backed by locked
//! memory files, the extent allocator over them, and the refiller that
//! backs freed extents anew.
//!
//! The pool owns every byte it exports. An allocation gets one or more
//! [`PoolExtent`]s, page-aligned, each inside one slab and backed by memory
//! files that back nothing else ([`carve`]), so a same-node process given
//! those files reaches exactly that allocation. Dropping an extent hands it
//! to the refiller, which zeroes it (files never handed out) or releases
//! its pages and backs the range anew (files a process was given), off the
//! request path, before the free list may hand it out again, so no tenant
//! ever sees another's data, not even through a file it kept. Reserving does bounded work, so it costs the same at every
//! size. This module never decides *who* gets memory (placement, in the
//! master) and never touches the network.

mod backing;
mod carve;
mod file;
mod free_list;
mod limits;
mod refill;
mod room;
mod slab;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oncilla_model::size::{round_up, HumanBytes};
use serde::Deserialize;

use backing::Backing;
pub use carve::{Access, OWN_FILE_MAX};
use file::FileError;
pub use file::{MemFile, Part};
pub use free_list::FreeList;
pub use limits::open_file_limit;
use limits::{
    base_page, check_memlock, huge_page_info, max_map_count, memlock_limit, pages_needed,
    physical_memory, raise_file_limit, FileBudget,
};
use refill::Refill;
pub use slab::Slab;

/// Default slab size: large enough that a pool has few slabs (few RDMA
/// registrations, few fds to share), small enough to fall back gracefully.
pub const SLAB: u64 = 1 << 30;

/// Largest memory file the pool makes for free memory (larger in pools of
/// over 16 GiB: see [`file_len`]): when an allocation takes part of one,
/// the rest is backed anew in the background, so this bounds that work
/// (and how long that memory is out of use).
pub const START_FILE: u64 = 4 << 20;
/// Most files a pool starts with: each is a descriptor and a mapping.
const MAX_START_FILES: u64 = 4096;

/// How long a reservation waits for the refiller when only memory that is
/// still being refilled could satisfy it. Below the master's 15 s call
/// deadline, so a reservation never outlives the call that asked for it.
const SCRUB_WAIT: Duration = Duration::from_secs(10);

/// Whether the pool uses huge pages (`--hugepages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HugePages {
    /// Huge pages when enough are free, otherwise base pages (and say so).
    #[default]
    Auto,
    /// Huge pages or refuse to start.
    On,
    /// Base pages only.
    Off,
}

/// What pool to build.
#[derive(Debug, Clone, Copy)]
pub struct PoolSpec {
    /// Bytes to export (rounded up to the page size in use).
    pub capacity: u64,
    pub huge_pages: HugePages,
    /// Slab size (rounded up to the page size in use).
    pub slab: u64,
}

impl PoolSpec {
    /// A pool of `capacity` bytes with default slabs and huge-page policy `huge_pages`.
    pub fn new(capacity: u64, huge_pages: HugePages) -> Self {
        Self {
            capacity,
            huge_pages,
            slab: SLAB,
        }
    }
}

/// Why the pool could not be created or could not satisfy a request.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("capacity must be at least one page")]
    TooSmall,
    #[error("capacity {} exceeds this node's physical memory {}; choose a smaller --capacity", HumanBytes(*.requested), HumanBytes(*.physical))]
    AbovePhysical { requested: u64, physical: u64 },
    #[error("capacity {} is more than this process may still take: {} ({what}); choose a smaller --capacity, free memory, or raise the limit", HumanBytes(*.requested), HumanBytes(*.room))]
    AboveRoom {
        requested: u64,
        room: u64,
        what: String,
    },
    #[error("--hugepages on: {reason}; reserve more (`sysctl vm.nr_hugepages={needed}` or more), or use --hugepages auto")]
    HugePages { reason: String, needed: u64 },
    #[error("pool bookkeeping is inconsistent ({0}); this is a bug: the range is kept out of use")]
    Inconsistent(&'static str),
    #[error("cannot start the refiller thread: {0}")]
    Refiller(#[source] std::io::Error),
    #[error("cannot create a pool memfd: {0}")]
    Memfd(#[source] nix::Error),
    #[error("cannot reserve {} of address space for the pool: {source}", HumanBytes(*.len))]
    Reserve {
        len: u64,
        #[source]
        source: nix::Error,
    },
    #[error("this node holds {open} memory files, the most it may ({budget}: the open-file limit {limit} less a quarter kept for connections); each allocation of up to 128 KiB that a process may map (a persistent one, or a session's on its own node) holds one: free some, make larger allocations, or raise the agent's open-file limit (LimitNOFILE)")]
    Descriptors {
        open: usize,
        budget: usize,
        limit: usize,
    },
    #[error("uid {uid} holds {held} of this node's memory files, its share ({share}: half of what the node may hold); each allocation of up to 128 KiB that a process may map (a persistent one, or a session's on its own node) holds one: free some or make larger allocations")]
    DescriptorShare { uid: u32, held: usize, share: usize },
    #[error("this node's memory is in {runs} separate mappings, the most it may use (half of vm.max_map_count, {limit}); free allocations, use larger ones, or raise vm.max_map_count")]
    Fragmented { runs: usize, limit: usize },
    #[error(
        "cannot seal a pool slab's size (memfd sealing, Linux 3.17+; 4.16+ with huge pages): {0}"
    )]
    Seal(#[source] nix::Error),
    #[error("cannot size a pool slab to {}: {source}", HumanBytes(*.len))]
    Truncate {
        len: u64,
        #[source]
        source: nix::Error,
    },
    #[error("cannot map {} of pool memory: {source}", HumanBytes(*.len))]
    Map {
        len: u64,
        #[source]
        source: nix::Error,
    },
    #[error("cannot lock {} of pool memory ({source}); the locked-memory limit (RLIMIT_MEMLOCK) is {limit}: raise it (`ulimit -l unlimited`, LimitMEMLOCK=infinity in systemd, or CAP_IPC_LOCK in a container) or lower --capacity", HumanBytes(*.len))]
    Lock {
        len: u64,
        limit: String,
        #[source]
        source: nix::Error,
    },
    #[error("cannot lock {} of pool memory: the locked-memory limit (RLIMIT_MEMLOCK) is {limit}; raise it (`ulimit -l unlimited`, LimitMEMLOCK=infinity in systemd, or CAP_IPC_LOCK in a container) or lower --capacity", HumanBytes(*.len))]
    MemlockLimit { len: u64, limit: String },
    #[error("pool has {} free (largest hole {}) and {} freed but not back yet (held by a copy or mapping, or being scrubbed), cannot reserve {}", HumanBytes(*.free), HumanBytes(*.largest), HumanBytes(*.scrubbing), HumanBytes(*.requested))]
    Exhausted {
        requested: u64,
        free: u64,
        largest: u64,
        scrubbing: u64,
    },
}

impl PoolError {
    /// What a failed step on a memory file of `len` bytes means.
    fn from_file(e: FileError, len: u64) -> Self {
        match e {
            FileError::Memfd(e) => PoolError::Memfd(e),
            FileError::Truncate(source) => PoolError::Truncate { len, source },
            FileError::Seal(source) => PoolError::Seal(source),
            FileError::Map(source) => PoolError::Map { len, source },
            FileError::Lock(source) => PoolError::Lock {
                len,
                limit: memlock_limit(),
                source,
            },
        }
    }
}

/// A snapshot of the pool's accounting. `used + scrubbing + free == capacity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    pub capacity: u64,
    /// Held by allocations.
    pub used: u64,
    /// On its way back: freed (or cut off a file an allocation took) and
    /// waiting for the refiller, or freed while a copy or a local mapping
    /// that began before the free still holds it.
    pub scrubbing: u64,
    /// Ready to hand out.
    pub free: u64,
    /// Largest free extent (what one contiguous piece can get).
    pub largest_free: u64,
}

struct State {
    free: FreeList,
    /// The files behind the free memory.
    backing: Backing,
    used: u64,
    scrubbing: u64,
    /// Runs of files held by extents (each a mapping of the agent's).
    held_runs: usize,
    /// Files made for small extents, by the user whose allocation holds
    /// them (operators' are not counted): no user may hold more than its
    /// share ([`FileBudget::share`]).
    user_files: std::collections::HashMap<u32, usize>,
    /// Ranges waiting for the refiller, oldest first.
    dirty: VecDeque<Refill>,
    shutdown: bool,
}

/// What the pool, its extents and its refiller share.
struct Inner {
    slabs: Vec<Slab>,
    slab_len: u64,
    len: u64,
    page: u64,
    huge: bool,
    /// Size of the files the pool makes for free memory ([`file_len`]).
    file_len: u64,
    /// Most runs (mappings) the backing may be cut into.
    max_runs: usize,
    state: Mutex<State>,
    /// Signalled when refilled memory returns to the free list.
    cleaned: Condvar,
    /// Signalled when a range is queued for the refiller (or the pool shuts
    /// down).
    freed: Condvar,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked: every
        // mutation completes before the guard drops.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The address of pool offset `offset` in this process.
    fn addr(&self, offset: u64) -> Option<std::ptr::NonNull<u8>> {
        let index = usize::try_from(offset / self.slab_len).ok()?;
        self.slabs.get(index)?.at(offset)
    }

    /// Maps `[file_off, file_off + len)` of `file` at pool offset `at`
    /// ([`MemFile::map_at`]); an offset outside the slabs is `EFAULT`.
    ///
    /// # Safety
    /// `[at, at + len)` must lie in one slab, page-aligned, and nothing may
    /// read or write it during the call (a range out of the free list that
    /// no extent holds).
    unsafe fn map_file(
        &self,
        file: &MemFile,
        at: u64,
        file_off: u64,
        len: u64,
    ) -> Result<(), FileError> {
        match self.addr(at) {
            // SAFETY: the caller's contract is map_at's, at this address.
            Some(addr) => unsafe { file.map_at(addr, file_off, len) },
            None => Err(FileError::Map(nix::Error::EFAULT)),
        }
    }

    /// Hands a range whose reservation failed after its runs were taken
    /// to the refiller: `parts` are released, `restore` goes back to its
    /// files, the rest is backed anew; it counts as on its way back.
    fn requeue(
        &self,
        st: &mut State,
        offset: u64,
        len: u64,
        parts: Vec<Part>,
        restore: Vec<(u64, Part)>,
    ) {
        st.used -= len;
        st.scrubbing += len;
        st.dirty.push_back(Refill::Freed {
            offset,
            len,
            parts,
            restore,
        });
        self.freed.notify_one();
    }

    fn ptr(&self, offset: u64) -> *mut u8 {
        self.addr(offset)
            .map_or(std::ptr::null_mut(), std::ptr::NonNull::as_ptr)
    }

    /// Counts `len` bytes of an extent whose allocation is gone as on
    /// their way back, while a copy or mapping still holds them.
    fn release(&self, len: u64) {
        let mut st = self.lock();
        st.used -= len;
        st.scrubbing += len;
    }

    /// Queues a freed extent for the refiller; `released`: its bytes were
    /// already counted as on their way back ([`Self::release`]).
    fn retire(
        &self,
        offset: u64,
        len: u64,
        released: bool,
        parts: Vec<Part>,
        restore: Vec<(u64, Part)>,
        file_of: Option<u32>,
    ) {
        let mut st = self.lock();
        if !released {
            st.used -= len;
            st.scrubbing += len;
        }
        if let Some(uid) = file_of {
            if let std::collections::hash_map::Entry::Occupied(mut held) = st.user_files.entry(uid)
            {
                *held.get_mut() -= 1;
                if *held.get() == 0 {
                    held.remove();
                }
            }
        }
        st.held_runs -= parts.len();
        st.dirty.push_back(Refill::Freed {
            offset,
            len,
            parts,
            restore,
        });
        drop(st);
        self.freed.notify_one();
    }
}

/// The locked memory a node exports.
pub struct Pool {
    inner: Arc<Inner>,
    huge: bool,
    note: Option<String>,
    refiller: Option<JoinHandle<()>>,
}

impl Pool {
    /// Creates the pool: slabs of address space backed by memory files,
    /// huge pages as `spec` says, mapped shared, pre-faulted and locked;
    /// starts the refiller.
    ///
    /// # Errors
    /// [`PoolError`] when the capacity is impossible or the memory cannot be
    /// created, mapped or locked, with what to change.
    pub fn new(spec: PoolSpec) -> Result<Self, PoolError> {
        let base_page = base_page();
        if spec.capacity == 0 {
            return Err(PoolError::TooSmall);
        }
        let physical = physical_memory();
        if round_up(spec.capacity, base_page) > physical {
            return Err(PoolError::AbovePhysical {
                requested: spec.capacity,
                physical,
            });
        }
        check_memlock(round_up(spec.capacity, base_page))?;
        // Ordinary memory only: huge pages are reserved apart.
        let base_slabs = |spec: PoolSpec| {
            room::check(round_up(spec.capacity, base_page))?;
            make_slabs(spec, base_page, false)
        };
        let (slabs, page, huge, note) = match spec.huge_pages {
            HugePages::Off => (base_slabs(spec)?, base_page, false, None),
            HugePages::On => {
                let hp = huge_page_info();
                let needed = pages_needed(spec.capacity, hp.size);
                if hp.size == 0 || hp.free < needed {
                    return Err(PoolError::HugePages {
                        reason: hp.shortfall(needed),
                        needed: hp.total + needed.saturating_sub(hp.free),
                    });
                }
                let slabs = make_slabs(spec, hp.size, true).map_err(|e| match e {
                    PoolError::Map { source, .. } => PoolError::HugePages {
                        reason: format!("mapping huge pages failed: {source}"),
                        needed: hp.total + needed,
                    },
                    other => other,
                })?;
                (slabs, hp.size, true, None)
            }
            HugePages::Auto => {
                let hp = huge_page_info();
                let needed = pages_needed(spec.capacity, hp.size);
                let tried = if hp.size != 0 && hp.free >= needed {
                    make_slabs(spec, hp.size, true).map_err(|e| e.to_string())
                } else {
                    Err(hp.shortfall(needed))
                };
                match tried {
                    Ok(slabs) => (slabs, hp.size, true, None),
                    Err(why) => {
                        let note = format!(
                            "huge pages unavailable ({why}); using {} pages",
                            HumanBytes(base_page)
                        );
                        tracing::warn!("{note}");
                        (base_slabs(spec)?, base_page, false, Some(note))
                    }
                }
            }
        };
        let (slabs, backing) = slabs;
        let len = slabs.iter().map(Slab::len).sum();
        let slab_len = slabs.first().map_or(len, Slab::len);
        let inner = Arc::new(Inner {
            slabs,
            slab_len,
            len,
            page,
            huge,
            file_len: file_len(len, page),
            max_runs: max_map_count() / 2,
            state: Mutex::new(State {
                free: FreeList::new(len, slab_len),
                backing,
                used: 0,
                scrubbing: 0,
                held_runs: 0,
                user_files: std::collections::HashMap::new(),
                dirty: VecDeque::new(),
                shutdown: false,
            }),
            cleaned: Condvar::new(),
            freed: Condvar::new(),
        });
        let worker = Arc::clone(&inner);
        let refiller = std::thread::Builder::new()
            .name("oncilla-refill".into())
            .spawn(move || refill::run(&worker))
            .map_err(PoolError::Refiller)?;
        Ok(Self {
            inner,
            huge,
            note,
            refiller: Some(refiller),
        })
    }

    /// Total bytes in the pool.
    pub fn capacity(&self) -> u64 {
        self.inner.len
    }

    /// The page size extents are aligned to (a huge page size when huge
    /// pages are in use).
    pub fn page_size(&self) -> u64 {
        self.inner.page
    }

    /// Whether the slabs are huge-page backed.
    pub fn huge_pages(&self) -> bool {
        self.huge
    }

    /// Why the pool is not what was asked for (huge pages fell back), if so.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// The slabs, in pool-offset order.
    pub fn slabs(&self) -> &[Slab] {
        &self.inner.slabs
    }

    /// Accounting snapshot.
    pub fn stats(&self) -> PoolStats {
        let st = self.inner.lock();
        PoolStats {
            capacity: self.inner.len,
            used: st.used,
            scrubbing: st.scrubbing,
            free: st.free.free(),
            largest_free: st.free.largest(),
        }
    }

    /// Reserves `len` bytes (rounded up to a page) as one extent when a hole
    /// is big enough, otherwise as several, each backed by memory files of
    /// its own ([`carve`]: bounded work, so the cost does not depend on
    /// `len`). When the free memory is short but memory being refilled
    /// would cover the request, waits for the refiller (blocking; call it
    /// off async executors).
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] with the free space, the largest hole and
    /// what is still being refilled; [`PoolError::Fragmented`] when the
    /// backing has as many mappings as it may; a memory file the kernel
    /// refused.
    /// `user` is whose allocation it is (`None`: an operator's), for the
    /// share of memory files one user may hold; `access` whether a process
    /// may map it ([`Access::Copied`] small extents hold no file).
    pub fn reserve(
        &self,
        len: u64,
        user: Option<u32>,
        access: Access,
    ) -> Result<Vec<PoolExtent>, PoolError> {
        let want = round_up(len.max(1), self.inner.page);
        let deadline = Instant::now() + SCRUB_WAIT;
        let mut st = self.inner.lock();
        loop {
            if st.free.free() >= want {
                // One piece at a time: carving a piece can cut free runs
                // out of the free list (those of the files it takes), so
                // the next piece is chosen only after it.
                let mut out = Vec::new();
                let mut rest = want;
                let mut failed = None;
                while rest > 0 {
                    let Some((offset, len)) = st.free.take_piece(rest) else {
                        break;
                    };
                    st.used += len;
                    match carve::carve(&self.inner, &mut st, offset, len, user, access) {
                        Ok(c) => out.push(PoolExtent {
                            inner: Arc::clone(&self.inner),
                            offset,
                            len,
                            released: AtomicBool::new(false),
                            parts: c.parts,
                            restore: c.restore,
                            file_of: c.file_of,
                            access,
                        }),
                        // `carve` settled its own range.
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                    rest -= len;
                }
                if rest == 0 {
                    return Ok(out);
                }
                // What was carved goes back through the refiller.
                drop(st);
                drop(out);
                if let Some(e) = failed {
                    return Err(e);
                }
                st = self.inner.lock();
                // The refiller may have given back what was cut off while
                // the lock was let go: look again before waiting.
                if st.free.free() >= want {
                    continue;
                }
            }
            let now = Instant::now();
            if st.free.free() + st.scrubbing < want || now >= deadline {
                return Err(PoolError::Exhausted {
                    requested: want,
                    free: st.free.free(),
                    largest: st.free.largest(),
                    scrubbing: st.scrubbing,
                });
            }
            st = self
                .inner
                .cleaned
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    #[cfg(test)]
    fn holes(&self) -> Vec<(u64, u64)> {
        self.inner.lock().free.iter().collect()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.inner.lock().shutdown = true;
        self.inner.freed.notify_all();
        if let Some(t) = self.refiller.take() {
            if t.join().is_err() {
                tracing::error!("refiller panicked");
            }
        }
    }
}

/// A reserved, page-aligned range of the pool inside one slab, backed by
/// memory files that back nothing else. Dropping it queues the range for
/// the refiller; it returns to the free list zeroed, or backed anew.
pub struct PoolExtent {
    inner: Arc<Inner>,
    offset: u64,
    len: u64,
    /// The files behind it, in offset order.
    parts: Vec<Part>,
    /// What backed it before it got a file of its own.
    restore: Vec<(u64, Part)>,
    /// Its allocation is gone ([`Self::release`]).
    released: AtomicBool,
    /// The user charged for the file made for it (see [`State::user_files`]).
    file_of: Option<u32>,
    /// Whether a process may map it (a small [`Access::Copied`] extent's
    /// parts are runs borrowed from free memory's files).
    access: Access,
}

impl PoolExtent {
    /// Its allocation is gone: from now its bytes count as on their way
    /// back, so a reservation waits for them (as for the refiller) instead
    /// of failing while a copy or mapping that began before the free
    /// finishes. Idempotent.
    pub fn release(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            self.inner.release(self.len);
        }
    }

    /// Offset of the extent inside the pool.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reserved length (a whole number of pages, never zero).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Pointer to byte `at` of the extent; `at + len` of any access must stay
    /// within [`Self::len`].
    pub fn ptr(&self, at: u64) -> *mut u8 {
        self.inner.ptr(self.offset + at.min(self.len))
    }

    /// The memory files behind the extent, in offset order (lengths sum
    /// to [`Self::len`]), to hand to a process allowed to map it, each
    /// backing nothing outside this extent; `None` for an extent nobody may
    /// map ([`Access::Copied`]: a small one's files back other memory too).
    pub fn files(&self) -> Option<&[Part]> {
        (self.access == Access::Mapped).then_some(&self.parts[..])
    }

    #[cfg(test)]
    fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The pool's page size (the extent's alignment).
    pub fn page_size(&self) -> u64 {
        self.inner.page
    }
}

impl Drop for PoolExtent {
    fn drop(&mut self) {
        self.inner.retire(
            self.offset,
            self.len,
            *self.released.get_mut(),
            std::mem::take(&mut self.parts),
            std::mem::take(&mut self.restore),
            self.file_of,
        );
    }
}

/// The slabs of a pool and the files behind them ([`file_len`] each), mapped, populated and locked.
fn make_slabs(spec: PoolSpec, page: u64, huge: bool) -> Result<(Vec<Slab>, Backing), PoolError> {
    let len = round_up(spec.capacity, page);
    let slab_len = round_up(spec.slab.max(1), page);
    let file_len = file_len(len, page);
    raise_file_limit();
    let mut slabs = Vec::new();
    let mut backing = Backing::default();
    let mut start = 0;
    while start < len {
        let this = slab_len.min(len - start);
        let slab = Slab::reserve(start, this, page)
            .map_err(|source| PoolError::Reserve { len: this, source })?;
        let mut at = start;
        while at < start + this {
            let n = file_len.min(start + this - at);
            let addr = slab.at(at).ok_or(PoolError::Map {
                len,
                source: nix::Error::EFAULT,
            })?;
            // SAFETY: inside the slab just reserved, which nothing else
            // uses yet; `at` and `n` are page multiples.
            let part = unsafe { MemFile::create_at(n, huge, addr) }
                .map_err(|e| PoolError::from_file(e, len))?;
            backing.insert(at, part);
            at += n;
        }
        slabs.push(slab);
        start += this;
    }
    Ok((slabs, backing))
}

/// The size of the files a pool of `capacity` bytes makes for free memory:
/// [`START_FILE`], or enough that it starts with at most
/// [`MAX_START_FILES`], in whole pages.
fn file_len(capacity: u64, page: u64) -> u64 {
    round_up(START_FILE.max(capacity.div_ceil(MAX_START_FILES)), page)
}

#[cfg(test)]
mod tests;
