//! The client's registration cache: memory registrations of caller
//! buffers, found again by address range, bounded in bytes, least recently
//! used first out.
//!
//! It is generic over what a registration is ([`Register`]), so the same
//! code serves the HCA and the tests. An evicted entry is only dropped by
//! the cache: a copy still using it holds its own `Arc`, so nothing is
//! deregistered under a request in flight. It never decides *whether* a
//! buffer may be cached (see the engine: only where the registration
//! follows the page tables).

use std::sync::Arc;

/// Makes registrations.
pub trait Register {
    type Region;
    /// Why a registration failed.
    type Error: std::error::Error + 'static;
    /// Registers `[addr, addr + len)`.
    ///
    /// # Errors
    /// Why the memory cannot be registered.
    fn register(&self, addr: u64, len: u64) -> Result<Self::Region, Self::Error>;
}

/// Why the cache has no registration for a range.
#[derive(Debug, thiserror::Error)]
pub enum CacheError<E: std::error::Error + 'static> {
    /// The range runs past the end of the address space.
    #[error("buffer wraps the address space")]
    Wraps,
    /// The registration itself failed.
    #[error(transparent)]
    Register(E),
}

struct Entry<R> {
    addr: u64,
    len: u64,
    region: Arc<R>,
    last_use: u64,
}

/// Registrations by address range.
pub struct RegCache<R> {
    entries: Vec<Entry<R>>,
    bytes: u64,
    limit: u64,
    clock: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// Registrations are widened to whole pages, so neighbouring buffers in
/// one page share one.
const PAGE: u64 = 4096;

impl<R> RegCache<R> {
    /// A cache holding at most `limit` registered bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            entries: Vec::new(),
            bytes: 0,
            limit,
            clock: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    /// A registration covering `[addr, addr + len)`: a cached one that
    /// covers it whole, else a new one (cached when it fits the limit,
    /// evicting the least recently used entries to make room).
    ///
    /// # Errors
    /// What `with` says when it cannot register.
    pub fn get<G: Register<Region = R>>(
        &mut self,
        with: &G,
        addr: u64,
        len: u64,
    ) -> Result<Arc<R>, CacheError<G::Error>> {
        self.clock += 1;
        let end = addr.checked_add(len).ok_or(CacheError::Wraps)?;
        if let Some(e) = self
            .entries
            .iter_mut()
            .filter(|e| e.addr <= addr && end <= e.addr + e.len)
            // The smallest cover: keeps big entries free to age out.
            .min_by_key(|e| e.len)
        {
            e.last_use = self.clock;
            self.hits += 1;
            return Ok(Arc::clone(&e.region));
        }
        self.misses += 1;
        let start = addr & !(PAGE - 1);
        let stop = end.div_ceil(PAGE) * PAGE;
        let region = Arc::new(
            with.register(start, stop - start)
                .map_err(CacheError::Register)?,
        );
        let size = stop - start;
        if size <= self.limit {
            while self.bytes + size > self.limit {
                self.evict_one();
            }
            self.bytes += size;
            self.entries.push(Entry {
                addr: start,
                len: size,
                region: Arc::clone(&region),
                last_use: self.clock,
            });
        }
        Ok(region)
    }

    fn evict_one(&mut self) {
        if let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_use) {
            let e = self.entries.swap_remove(i);
            self.bytes -= e.len;
            self.evictions += 1;
        }
    }

    /// Registered bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Forgets every registration (each is released when the last copy
    /// using it drops it); returns how many there were. For when the HCA
    /// refuses a new registration: the locked-memory limit counts these.
    pub fn clear(&mut self) -> usize {
        self.bytes = 0;
        std::mem::take(&mut self.entries).len()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Records what it registered; a region is its range.
    struct Recorder(RefCell<Vec<(u64, u64)>>);

    impl Register for Recorder {
        type Region = (u64, u64);
        type Error = std::io::Error;
        fn register(&self, addr: u64, len: u64) -> Result<(u64, u64), std::io::Error> {
            if addr == 0 {
                return Err(std::io::Error::other("null buffer"));
            }
            self.0.borrow_mut().push((addr, len));
            Ok((addr, len))
        }
    }

    #[test]
    fn hits_reuse_and_misses_register_whole_pages() {
        let r = Recorder(RefCell::new(Vec::new()));
        let mut c = RegCache::new(1 << 20);
        let a = c.get(&r, 0x10010, 100).unwrap();
        assert_eq!(*a, (0x10000, 4096), "widened to the page");
        // Inside the same page: a hit, no new registration.
        let b = c.get(&r, 0x10100, 200).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!((c.hits, c.misses), (1, 1));
        assert_eq!(r.0.borrow().len(), 1);
        assert!(c.get(&r, 0, 8).is_err());
        assert!(c.get(&r, u64::MAX - 2, 8).is_err());
    }

    #[test]
    fn overlapping_ranges_need_a_cover() {
        let r = Recorder(RefCell::new(Vec::new()));
        let mut c = RegCache::new(1 << 20);
        c.get(&r, 0x20000, 8192).unwrap();
        // Overlaps the end of the first: not covered, so a new region.
        let b = c.get(&r, 0x21000, 8192).unwrap();
        assert_eq!(*b, (0x21000, 8192));
        // Now covered by the second.
        let d = c.get(&r, 0x22000, 100).unwrap();
        assert!(Arc::ptr_eq(&b, &d));
        // A range inside both picks the smaller cover.
        let big = c.get(&r, 0x20000, 0x10000).unwrap();
        assert_eq!(big.1, 0x10000);
        // Both 8 KiB regions cover it; either is the smallest cover.
        let small = c.get(&r, 0x21800, 16).unwrap();
        assert_eq!(small.1, 8192);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn least_recently_used_goes_first_and_users_keep_theirs() {
        let r = Recorder(RefCell::new(Vec::new()));
        let mut c = RegCache::new(3 * 4096);
        let first = c.get(&r, 0x1000, 10).unwrap();
        c.get(&r, 0x2000, 10).unwrap();
        c.get(&r, 0x3000, 10).unwrap();
        // Touch the first, so the second is the oldest.
        c.get(&r, 0x1000, 10).unwrap();
        c.get(&r, 0x4000, 10).unwrap();
        assert_eq!(c.evictions, 1);
        assert_eq!(c.bytes(), 3 * 4096);
        let before = r.0.borrow().len();
        c.get(&r, 0x2000, 10).unwrap();
        assert_eq!(
            r.0.borrow().len(),
            before + 1,
            "the evicted one is registered again"
        );
        c.get(&r, 0x1000, 10).unwrap();
        // The caller's handle outlives any eviction.
        assert_eq!(*first, (0x1000, 4096));
        // Larger than the whole cache: used, not kept.
        let huge = c.get(&r, 0x100000, 1 << 20).unwrap();
        assert_eq!(huge.1, 1 << 20);
        assert_eq!(c.bytes(), 3 * 4096);
    }
}
