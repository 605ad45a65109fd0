//! The extent allocator: which byte ranges of the pool are free.
//!
//! Pure bookkeeping over pool offsets, so every rule is property-tested
//! without touching memory. Holes are indexed by offset (for coalescing) and
//! by size (for best fit). Two holes merge only inside one slab: slabs are
//! separate mappings, so no extent may straddle a slab boundary. This module
//! never touches memory and never decides when memory is clean (the pool's
//! refiller gives ranges back only once they are backed anew).

use std::collections::{BTreeMap, BTreeSet};

/// Free ranges of a pool whose slabs are `slab` bytes each (the last one may
/// be shorter). All offsets and lengths are multiples of the caller's page.
#[derive(Debug)]
pub struct FreeList {
    /// offset -> length.
    by_offset: BTreeMap<u64, u64>,
    /// (length, offset), for best fit and for the largest hole.
    by_size: BTreeSet<(u64, u64)>,
    slab: u64,
    free: u64,
}

impl FreeList {
    /// A list with all of `[0, capacity)` free, cut into slabs of `slab` bytes.
    pub fn new(capacity: u64, slab: u64) -> Self {
        let mut list = Self {
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            slab: slab.max(1),
            free: 0,
        };
        let mut start = 0;
        while start < capacity {
            let len = list.slab.min(capacity - start);
            list.insert(start, len);
            start += len;
        }
        list
    }

    /// Free bytes.
    pub fn free(&self) -> u64 {
        self.free
    }

    /// Length of the largest hole (what one contiguous extent can get).
    pub fn largest(&self) -> u64 {
        self.by_size.last().map_or(0, |&(len, _)| len)
    }

    /// Number of holes.
    pub fn holes(&self) -> usize {
        self.by_offset.len()
    }

    /// Takes `want` bytes as `(offset, len)` pieces: the smallest hole that
    /// holds it all when there is one (one piece), otherwise the largest
    /// holes first until the rest fits one hole. `None` when fewer than
    /// `want` bytes are free; nothing is taken then.
    pub fn take(&mut self, want: u64) -> Option<Vec<(u64, u64)>> {
        if want == 0 || want > self.free {
            return None;
        }
        let mut pieces = Vec::new();
        let mut rest = want;
        while rest > 0 {
            let piece = self.take_piece(rest)?;
            pieces.push(piece);
            rest -= piece.1;
        }
        Some(pieces)
    }

    /// The next piece [`FreeList::take`] would take for `rest` bytes: the
    /// smallest hole that holds them all, else the largest hole (all of
    /// it). `None` when nothing is free.
    pub fn take_piece(&mut self, rest: u64) -> Option<(u64, u64)> {
        if rest == 0 {
            return None;
        }
        let fit = self.by_size.range((rest, 0)..).next().copied();
        let (len, off) = match fit {
            Some(hole) => hole,
            None => *self.by_size.last()?,
        };
        self.remove(off, len);
        let used = len.min(rest);
        if len > used {
            self.insert(off + used, len - used);
        }
        Some((off, used))
    }

    /// Whether all of `[offset, offset + len)` is free, in one hole.
    pub fn holds(&self, offset: u64, len: u64) -> bool {
        self.by_offset
            .range(..=offset)
            .next_back()
            .is_some_and(|(&start, &size)| len > 0 && offset.saturating_add(len) <= start + size)
    }

    /// Takes exactly `[offset, offset + len)`, which must lie inside one
    /// hole; false (and nothing taken) when it does not.
    pub fn take_range(&mut self, offset: u64, len: u64) -> bool {
        let Some((&start, &size)) = self.by_offset.range(..=offset).next_back() else {
            return false;
        };
        let end = offset.saturating_add(len);
        if len == 0 || end > start + size {
            return false;
        }
        self.remove(start, size);
        if offset > start {
            self.insert(start, offset - start);
        }
        if start + size > end {
            self.insert(end, start + size - end);
        }
        true
    }

    /// Returns `[offset, offset + len)`, merging it with free neighbours in
    /// the same slab.
    pub fn give(&mut self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let mut start = offset;
        let mut size = len;
        let slab = offset / self.slab;
        if let Some((&prev, &plen)) = self.by_offset.range(..offset).next_back() {
            if prev + plen == offset && prev / self.slab == slab {
                self.remove(prev, plen);
                start = prev;
                size += plen;
            }
        }
        let next = offset + len;
        if let Some(&nlen) = self.by_offset.get(&next) {
            if next / self.slab == slab {
                self.remove(next, nlen);
                size += nlen;
            }
        }
        self.insert(start, size);
    }

    /// Every hole as `(offset, len)`, by offset.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_offset.iter().map(|(&o, &l)| (o, l))
    }

    fn insert(&mut self, offset: u64, len: u64) {
        self.by_offset.insert(offset, len);
        self.by_size.insert((len, offset));
        self.free += len;
    }

    fn remove(&mut self, offset: u64, len: u64) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(len, offset));
        self.free -= len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: u64 = 4096;

    #[test]
    fn take_range_cuts_a_hole() {
        let mut fl = FreeList::new(16 * P, 16 * P);
        assert!(fl.take_range(4 * P, 2 * P));
        assert_eq!(fl.iter().collect::<Vec<_>>(), [(0, 4 * P), (6 * P, 10 * P)]);
        assert!(!fl.take_range(5 * P, 2 * P), "not wholly free");
        assert!(!fl.take_range(15 * P, 2 * P), "past the end");
        assert!(fl.take_range(0, 4 * P));
        assert_eq!(fl.free(), 10 * P);
    }

    #[test]
    fn best_fit_then_largest_first() {
        let mut fl = FreeList::new(16 * P, 16 * P);
        let a = fl.take(2 * P).unwrap();
        let b = fl.take(P).unwrap();
        let c = fl.take(4 * P).unwrap();
        let _d = fl.take(P).unwrap();
        assert_eq!(a, vec![(0, 2 * P)]);
        fl.give(a[0].0, a[0].1);
        fl.give(c[0].0, c[0].1);
        // Holes: 2P at 0, 4P at 3P, 8P at 8P. Best fit for 3P is the 4P hole.
        assert_eq!(fl.take(3 * P).unwrap(), vec![(3 * P, 3 * P)]);
        // 11P free in holes of 2P, 1P, 8P: no single fit, largest first.
        assert_eq!(fl.free(), 11 * P);
        assert_eq!(
            fl.take(11 * P).unwrap(),
            vec![(8 * P, 8 * P), (0, 2 * P), (6 * P, P)]
        );
        assert_eq!(fl.free(), 0);
        assert!(fl.take(P).is_none());
        fl.give(b[0].0, b[0].1);
        assert_eq!(fl.largest(), P);
    }

    #[test]
    fn never_merges_across_slabs() {
        let mut fl = FreeList::new(10 * P, 4 * P);
        assert_eq!(
            fl.iter().collect::<Vec<_>>(),
            [(0, 4 * P), (4 * P, 4 * P), (8 * P, 2 * P)]
        );
        let all = fl.take(10 * P).unwrap();
        assert_eq!(all.len(), 3, "one piece per slab");
        for (o, l) in all {
            fl.give(o, l);
        }
        assert_eq!(fl.holes(), 3);
        assert_eq!(fl.largest(), 4 * P);
    }

    #[test]
    fn refuses_more_than_free_and_takes_nothing() {
        let mut fl = FreeList::new(4 * P, 4 * P);
        assert!(fl.take(5 * P).is_none());
        assert!(fl.take(0).is_none());
        assert_eq!(fl.free(), 4 * P);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Random alloc/free sequences: pieces never overlap each other or a
        /// live range, stay inside one slab, account exactly, and everything
        /// coalesces back to one hole per slab.
        #[test]
        fn random_sequences_never_overlap_or_leak(
            slab_pages in 1u64..12,
            ops in prop::collection::vec((any::<bool>(), 1u64..10), 1..120),
        ) {
            let capacity = 32 * P;
            let slab = slab_pages * P;
            let mut fl = FreeList::new(capacity, slab);
            let mut live: Vec<Vec<(u64, u64)>> = Vec::new();
            for (alloc, pages) in ops {
                if alloc || live.is_empty() {
                    let before = fl.free();
                    match fl.take(pages * P) {
                        Some(pieces) => {
                            prop_assert_eq!(pieces.iter().map(|p| p.1).sum::<u64>(), pages * P);
                            for &(o, l) in &pieces {
                                prop_assert!(l > 0 && o + l <= capacity);
                                prop_assert_eq!(o / slab, (o + l - 1) / slab, "piece straddles a slab");
                                for &(o2, l2) in live.iter().flatten() {
                                    prop_assert!(o + l <= o2 || o2 + l2 <= o, "overlap");
                                }
                            }
                            for (i, &(o, l)) in pieces.iter().enumerate() {
                                for &(o2, l2) in &pieces[i + 1..] {
                                    prop_assert!(o + l <= o2 || o2 + l2 <= o, "pieces overlap");
                                }
                            }
                            live.push(pieces);
                        }
                        None => prop_assert!(before < pages * P, "refused with enough free"),
                    }
                } else {
                    let i = (pages as usize) % live.len();
                    for (o, l) in live.swap_remove(i) {
                        fl.give(o, l);
                    }
                }
                let held: u64 = live.iter().flatten().map(|p| p.1).sum();
                prop_assert_eq!(fl.free() + held, capacity);
                let holes: u64 = fl.iter().map(|h| h.1).sum();
                prop_assert_eq!(holes, fl.free());
            }
            for (o, l) in live.into_iter().flatten() {
                fl.give(o, l);
            }
            prop_assert_eq!(fl.holes() as u64, capacity.div_ceil(slab));
            prop_assert_eq!(fl.free(), capacity);
        }
    }
}
