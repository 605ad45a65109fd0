//! Host memory the GPU can DMA: registrations of host ranges with the
//! driver (`cuMemHostRegister`), made once per range and kept, so a copy
//! between that memory and a device is one DMA instead of a copy through
//! the driver's own bounce buffers.
//!
//! Registering costs about as much as copying the range once (29 ms for
//! 1 GiB on an H100, `shared/measured-facts.md`), so it must never happen
//! per copy: [`PinCache`] keeps each registration until its owner says the
//! memory goes ([`PinCache::release`]) or until the cache's byte bound
//! evicts it (least recently used first). A range the driver refuses is
//! remembered too, so the refusal costs one driver call, is counted, and is
//! logged once per cache; the caller then copies without the registration.
//!
//! The driver sits behind [`HostPinner`] so the cache's rules (hits,
//! eviction, release, refusal) are tested without a GPU. This module never
//! decides which memory is worth registering (the caller does) and never
//! copies bytes.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::driver::sys;

use crate::gpu::Gpu;
use crate::CudaError;

/// Registers host memory with a device driver (the seam the cache is
/// tested through).
pub trait HostPinner: Send + Sync {
    /// Makes `[addr, addr + len)` page-locked and reachable by every
    /// device's DMA engine.
    ///
    /// # Safety
    /// The range must be mapped in this process, and stay mapped until
    /// [`HostPinner::unpin`] of the same `addr` returned.
    ///
    /// # Errors
    /// Why the driver refused (the range, the driver's limits).
    unsafe fn pin(&self, addr: usize, len: usize) -> Result<(), CudaError>;

    /// Undoes [`HostPinner::pin`] of the range starting at `addr`.
    ///
    /// # Errors
    /// Driver failures.
    fn unpin(&self, addr: usize) -> Result<(), CudaError>;
}

/// The CUDA driver as a [`HostPinner`]: portable registrations (every
/// context sees them), made and dropped with one device's context current.
pub struct DriverPinner {
    gpu: Gpu,
}

impl DriverPinner {
    pub fn new(gpu: Gpu) -> Self {
        Self { gpu }
    }

    /// Runs `f` with this pinner's device context current, then makes the
    /// thread's previous context current again: registering (or freeing)
    /// host memory must not move the application's thread to another
    /// device.
    fn in_context(&self, f: impl FnOnce() -> Result<(), CudaError>) -> Result<(), CudaError> {
        let mut previous: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `previous` is a valid place for one context handle; the
        // call only reads the thread's current context (null when none).
        unsafe { sys::cuCtxGetCurrent(&raw mut previous) }
            .result()
            .map_err(|e| self.gpu.fail("cuCtxGetCurrent", e))?;
        self.gpu.bind()?;
        let outcome = f();
        // SAFETY: `previous` is the handle the driver just gave for this
        // thread (or null, which unbinds): making it current again has no
        // other effect.
        let restored = unsafe { sys::cuCtxSetCurrent(previous) }
            .result()
            .map_err(|e| self.gpu.fail("cuCtxSetCurrent", e));
        outcome.and(restored)
    }
}

impl HostPinner for DriverPinner {
    unsafe fn pin(&self, addr: usize, len: usize) -> Result<(), CudaError> {
        self.in_context(|| {
            // SAFETY: the caller keeps the range mapped until `unpin` (this
            // function's contract); the context is current (in_context).
            // PORTABLE makes the registration count in every context, so a
            // copy on any device of the process DMAs from it.
            unsafe {
                sys::cuMemHostRegister_v2(addr as *mut _, len, sys::CU_MEMHOSTREGISTER_PORTABLE)
            }
            .result()
            .map_err(|e| self.gpu.fail("cuMemHostRegister", e))
        })
    }

    fn unpin(&self, addr: usize) -> Result<(), CudaError> {
        self.in_context(|| {
            // SAFETY: `addr` starts a range this pinner registered (the
            // cache unpins only what `pin` accepted, once); unregistering
            // only unlocks the pages for the driver, the memory stays
            // mapped.
            unsafe { sys::cuMemHostUnregister(addr as *mut _) }
                .result()
                .map_err(|e| self.gpu.fail("cuMemHostUnregister", e))
        })
    }
}

/// One registered range, unregistered when the last holder drops it: the
/// cache holds one reference, every copy using it another, so an evicted
/// or released range stays registered until the copies through it end.
pub struct Pin {
    addr: usize,
    len: usize,
    pinner: Arc<dyn HostPinner>,
}

impl Pin {
    pub fn addr(&self) -> usize {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[addr, addr + len)` lies inside.
    pub fn covers(&self, addr: usize, len: usize) -> bool {
        contains((self.addr, self.len), (addr, len))
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        if let Err(e) = self.pinner.unpin(self.addr) {
            tracing::warn!(error = %e, addr = self.addr, len = self.len, "cannot unregister host memory");
        }
    }
}

/// What the cache has done, for tests, logs and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PinStats {
    /// Lookups answered by a registration already held.
    pub hits: u64,
    /// New registrations made.
    pub registered: u64,
    /// Registrations dropped to stay within the byte bound.
    pub evicted: u64,
    /// Registrations (and refusals) dropped because their memory went.
    pub released: u64,
    /// Ranges the driver refused (each once; later lookups of the range
    /// are answered from memory).
    pub refused: u64,
    /// Lookups of a range larger than the whole bound (not registered).
    pub too_large: u64,
}

/// What a lookup found.
pub enum Lookup {
    /// The range is registered while this lives.
    Pinned(Arc<Pin>),
    /// The range cannot be registered (refused now or before, or larger
    /// than the bound): copy without it.
    Unpinned,
}

struct Entry {
    pin: Arc<Pin>,
    last_use: u64,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    /// Registrations evicted while copies still held them: found again
    /// (never registered twice, which the driver refuses) until the last
    /// holder lets go.
    evicted: Vec<Weak<Pin>>,
    /// Ranges the driver refused, until their memory goes.
    refused: Vec<(usize, usize)>,
    bytes: u64,
    clock: u64,
    stats: PinStats,
    logged_refusal: bool,
}

/// Registered host ranges, bounded in bytes, least recently used first out.
pub struct PinCache {
    limit: u64,
    pinner: OnceLock<Arc<dyn HostPinner>>,
    state: Mutex<State>,
}

impl PinCache {
    /// A cache holding at most `limit` registered bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            pinner: OnceLock::new(),
            state: Mutex::new(State::default()),
        }
    }

    /// The registration of the range `[addr, addr + len)` (registered
    /// whole, as its owner maps it), made on the first lookup with the
    /// pinner `make` gives (asked once per cache).
    ///
    /// # Safety
    /// The range must be mapped in this process until
    /// [`PinCache::release`] is called for it (or for a range holding it)
    /// and every [`Pin`] handed out for it is dropped.
    pub unsafe fn get(
        &self,
        make: impl FnOnce() -> Arc<dyn HostPinner>,
        addr: usize,
        len: usize,
    ) -> Lookup {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.clock += 1;
        let now = st.clock;
        if let Some(e) = st.entries.iter_mut().find(|e| e.pin.covers(addr, len)) {
            e.last_use = now;
            let pin = Arc::clone(&e.pin);
            st.stats.hits += 1;
            return Lookup::Pinned(pin);
        }
        st.evicted.retain(|w| w.strong_count() > 0);
        if let Some(pin) = st
            .evicted
            .iter()
            .filter_map(Weak::upgrade)
            .find(|p| p.covers(addr, len))
        {
            st.stats.hits += 1;
            return Lookup::Pinned(pin);
        }
        if st.refused.iter().any(|&r| contains(r, (addr, len))) {
            return Lookup::Unpinned;
        }
        let size = len as u64;
        if size > self.limit {
            st.stats.too_large += 1;
            return Lookup::Unpinned;
        }
        while st.bytes + size > self.limit {
            if !evict_one(&mut st) {
                break;
            }
        }
        let pinner = Arc::clone(self.pinner.get_or_init(make));
        // SAFETY: the caller keeps the range mapped until it is released
        // and every Pin of it dropped (this function's contract); the Pin
        // made below unpins it when the last of those goes.
        match unsafe { pinner.pin(addr, len) } {
            Ok(()) => {
                let pin = Arc::new(Pin { addr, len, pinner });
                st.bytes += size;
                st.stats.registered += 1;
                st.entries.push(Entry {
                    pin: Arc::clone(&pin),
                    last_use: now,
                });
                Lookup::Pinned(pin)
            }
            Err(e) => {
                st.stats.refused += 1;
                st.refused.push((addr, len));
                if !std::mem::replace(&mut st.logged_refusal, true) {
                    tracing::warn!(
                        error = %e,
                        len,
                        "the GPU driver refused to register host memory; copies between it and GPU memory go through the driver's staging (logged once)"
                    );
                }
                Lookup::Unpinned
            }
        }
    }

    /// The memory `[addr, addr + len)` goes: forgets every registration and
    /// refusal inside it. A registration still used by a copy is
    /// unregistered when that copy drops it; the caller must keep the
    /// memory mapped until then.
    pub fn release(&self, addr: usize, len: usize) {
        let inside = |a: usize, l: usize| contains((addr, len), (a, l));
        let gone: Vec<Entry> = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let before = st.refused.len();
            st.refused.retain(|&(a, l)| !inside(a, l));
            let refusals = (before - st.refused.len()) as u64;
            let (gone, kept) = std::mem::take(&mut st.entries)
                .into_iter()
                .partition(|e| inside(e.pin.addr, e.pin.len));
            st.entries = kept;
            let freed: u64 = gone.iter().map(|e: &Entry| e.pin.len as u64).sum();
            st.bytes -= freed;
            st.stats.released += gone.len() as u64 + refusals;
            gone
        };
        // Unregistered here, outside the lock (each driver call takes
        // tens of microseconds to milliseconds).
        drop(gone);
    }

    /// Registered bytes held by the cache.
    pub fn bytes(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }

    pub fn stats(&self) -> PinStats {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).stats
    }
}

/// Whether the range `inner` (start, length) lies inside `outer`.
fn contains(outer: (usize, usize), inner: (usize, usize)) -> bool {
    inner.0 >= outer.0
        && inner
            .0
            .checked_add(inner.1)
            .is_some_and(|end| end <= outer.0.saturating_add(outer.1))
}

/// Drops the least recently used registration; false when none is left.
fn evict_one(st: &mut State) -> bool {
    let Some(i) = (0..st.entries.len()).min_by_key(|&i| st.entries[i].last_use) else {
        return false;
    };
    let e = st.entries.swap_remove(i);
    st.bytes -= e.pin.len as u64;
    st.stats.evicted += 1;
    if Arc::strong_count(&e.pin) > 1 {
        st.evicted.push(Arc::downgrade(&e.pin));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver that records what is registered and refuses what it is
    /// told to.
    #[derive(Default)]
    struct FakeDriver {
        pinned: Mutex<Vec<(usize, usize)>>,
        calls: Mutex<Vec<String>>,
        refuse_from: Mutex<Option<usize>>,
    }

    impl FakeDriver {
        fn pinned(&self) -> Vec<(usize, usize)> {
            self.pinned.lock().unwrap().clone()
        }
        fn calls(&self) -> usize {
            self.calls.lock().unwrap().len()
        }
    }

    impl HostPinner for Arc<FakeDriver> {
        unsafe fn pin(&self, addr: usize, len: usize) -> Result<(), CudaError> {
            self.calls.lock().unwrap().push(format!("pin {addr:#x}"));
            if self.refuse_from.lock().unwrap().is_some_and(|a| addr >= a) {
                return Err(CudaError::Driver {
                    device: 0,
                    op: "cuMemHostRegister",
                    detail: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED".into(),
                });
            }
            let mut p = self.pinned.lock().unwrap();
            assert!(
                p.iter().all(|&(a, l)| addr + len <= a || a + l <= addr),
                "overlapping registrations"
            );
            p.push((addr, len));
            Ok(())
        }
        fn unpin(&self, addr: usize) -> Result<(), CudaError> {
            self.calls.lock().unwrap().push(format!("unpin {addr:#x}"));
            let mut p = self.pinned.lock().unwrap();
            let i = p
                .iter()
                .position(|&(a, _)| a == addr)
                .expect("unpin of a range never pinned");
            p.swap_remove(i);
            Ok(())
        }
    }

    fn setup(limit: u64) -> (Arc<FakeDriver>, PinCache) {
        (Arc::new(FakeDriver::default()), PinCache::new(limit))
    }

    fn get(c: &PinCache, d: &Arc<FakeDriver>, addr: usize, len: usize) -> Option<Arc<Pin>> {
        let d = Arc::clone(d);
        // SAFETY: the fake driver touches no memory.
        match unsafe { c.get(move || Arc::new(d), addr, len) } {
            Lookup::Pinned(p) => Some(p),
            Lookup::Unpinned => None,
        }
    }

    #[test]
    fn a_range_is_registered_once_and_found_again() {
        let (d, c) = setup(1 << 30);
        let a = get(&c, &d, 0x10_0000, 1 << 20).expect("pinned");
        let b = get(&c, &d, 0x10_0000, 1 << 20).expect("pinned");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(d.pinned(), vec![(0x10_0000, 1 << 20)]);
        assert_eq!(c.stats().registered, 1);
        assert_eq!(c.stats().hits, 1);
        assert_eq!(c.bytes(), 1 << 20);
        // A part of a registered range is a hit too.
        assert!(get(&c, &d, 0x10_0000 + 4096, 8192).is_some_and(|p| Arc::ptr_eq(&p, &a)));
        assert_eq!(d.calls(), 1, "one driver call in all");
    }

    #[test]
    fn release_unregisters_once_the_last_copy_is_done() {
        let (d, c) = setup(1 << 30);
        let in_flight = get(&c, &d, 0x20_0000, 1 << 20).expect("pinned");
        get(&c, &d, 0x40_0000, 1 << 20).expect("pinned");
        c.release(0x20_0000, 1 << 20);
        assert_eq!(c.bytes(), 1 << 20, "the released range left the bound");
        assert_eq!(d.pinned().len(), 2, "still registered under the copy");
        drop(in_flight);
        assert_eq!(d.pinned(), vec![(0x40_0000, 1 << 20)]);
        c.release(0x40_0000, 1 << 20);
        assert!(d.pinned().is_empty(), "nothing left registered");
        assert_eq!(c.stats().released, 2);
        // Releasing a range never registered does nothing.
        c.release(0x90_0000, 4096);
        assert_eq!(c.stats().released, 2);
    }

    #[test]
    fn the_least_recently_used_goes_past_the_bound() {
        let (d, c) = setup(3 << 20);
        for i in 0..3 {
            get(&c, &d, 0x100_0000 * (i + 1), 1 << 20).expect("pinned");
        }
        // Touch the first, so the second is the oldest.
        get(&c, &d, 0x100_0000, 1 << 20).expect("pinned");
        get(&c, &d, 0x500_0000, 1 << 20).expect("pinned");
        assert_eq!(c.stats().evicted, 1);
        assert_eq!(c.bytes(), 3 << 20);
        let mut pinned: Vec<usize> = d.pinned().iter().map(|p| p.0).collect();
        pinned.sort_unstable();
        assert_eq!(pinned, vec![0x100_0000, 0x300_0000, 0x500_0000]);
        // Larger than the whole bound: not registered, nothing evicted.
        assert!(get(&c, &d, 0x900_0000, 4 << 20).is_none());
        assert_eq!(c.stats().too_large, 1);
        assert_eq!(c.stats().evicted, 1);
    }

    #[test]
    fn a_refusal_is_asked_once_then_answered_from_memory() {
        let (d, c) = setup(1 << 30);
        *d.refuse_from.lock().unwrap() = Some(0x800_0000);
        assert!(get(&c, &d, 0x800_0000, 1 << 20).is_none());
        assert!(get(&c, &d, 0x800_0000, 1 << 20).is_none());
        assert!(get(&c, &d, 0x800_0000 + 4096, 4096).is_none());
        assert_eq!(d.calls(), 1, "the driver was asked once");
        assert_eq!(c.stats().refused, 1);
        // Other memory still registers.
        assert!(get(&c, &d, 0x10_0000, 4096).is_some());
        // Once the refused memory goes, new memory at that address is asked
        // about again (the driver may accept it now).
        c.release(0x800_0000, 1 << 20);
        *d.refuse_from.lock().unwrap() = None;
        assert!(get(&c, &d, 0x800_0000, 1 << 20).is_some());
    }

    #[test]
    fn an_evicted_range_still_in_use_is_found_not_registered_twice() {
        let (d, c) = setup(1 << 20);
        let held = get(&c, &d, 0x10_0000, 1 << 20).expect("pinned");
        // Evicts the first while a copy holds it.
        get(&c, &d, 0x40_0000, 1 << 20).expect("pinned");
        assert_eq!(c.stats().evicted, 1);
        let again = get(&c, &d, 0x10_0000, 1 << 20).expect("found again");
        assert!(Arc::ptr_eq(&held, &again));
        assert_eq!(c.stats().refused, 0, "the driver was not asked twice");
        drop((held, again));
        assert_eq!(d.pinned(), vec![(0x40_0000, 1 << 20)]);
        // Once let go it is registered anew on demand.
        get(&c, &d, 0x10_0000, 1 << 20).expect("pinned");
        assert_eq!(c.stats().registered, 3);
    }

    #[test]
    fn dropping_the_cache_unregisters_everything() {
        let (d, c) = setup(1 << 30);
        get(&c, &d, 0x10_0000, 4096).expect("pinned");
        get(&c, &d, 0x20_0000, 4096).expect("pinned");
        drop(c);
        assert!(d.pinned().is_empty());
    }
}
