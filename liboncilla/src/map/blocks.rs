//! The pages of a mapped remote allocation, counted in blocks: which are
//! absent, being fetched, held clean or dirty, or on their way back; which
//! was faulted in least recently; how far sequential faults read ahead; and
//! which blocks must go to keep the mapping within its budget.
//!
//! Pure bookkeeping: it never touches memory, a file descriptor or the
//! network. The pager ([`super::pager`]) asks it what to do and tells it
//! what was done.

use std::collections::VecDeque;

/// Where one block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Not in local memory: the next touch faults.
    Absent,
    /// A fetch is queued or running. `write`: a write started it, so it is
    /// installed writable and dirty (the writer would fault at once again).
    Fetching { write: bool },
    /// Present and write-protected: its bytes are the allocation's.
    Clean,
    /// Present and writable: written since it was fetched or written back.
    Dirty,
    /// Dirty, write-protected while its bytes go back (flush).
    Writing,
    /// Leaving local memory for the budget (written back first if dirty).
    Evicting { dirty: bool },
    /// Its fetch failed for good: touching it raises SIGBUS.
    Failed,
}

/// What to do about a write to a write-protected block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnWrite {
    /// Lift the protection (and wake the writer): the block is now dirty.
    Unprotect,
    /// The block's bytes are being written back or dropped: the writer
    /// waits until that ends ([`Blocks::written`], [`Blocks::evicted`]
    /// say to wake it).
    Wait,
    /// The block is not present (any more): wake the writer, whose retry
    /// faults it in.
    Wake,
}

/// The blocks of one mapping.
pub(crate) struct Blocks {
    state: Vec<State>,
    /// When each present block was faulted in (a tick), for the LRU.
    stamp: Vec<u64>,
    /// A write arrived while the block was write-protected for a write-back
    /// or an eviction; the writer waits for it to end.
    waiting: Vec<bool>,
    /// Present blocks by the tick they came in; stale entries (a block
    /// dropped and fetched again since) are skipped.
    lru: VecDeque<(u64, usize)>,
    tick: u64,
    present: usize,
    /// Fetched blocks whose pages are going in (room kept for them).
    filling: usize,
    /// Present blocks chosen to leave and not gone yet.
    leaving: usize,
    budget: usize,
    /// Read-ahead: the last faulted block, the last block fetched ahead of
    /// it, and how many blocks the next sequential fault fetches.
    last: Option<usize>,
    ahead_end: usize,
    window: usize,
    max_window: usize,
}

impl Blocks {
    /// `count` blocks, at most `budget` of them present (at least 1), and
    /// read-ahead of up to `max_window` blocks (1: none).
    pub(crate) fn new(count: usize, budget: usize, max_window: usize) -> Self {
        Self {
            state: vec![State::Absent; count],
            stamp: vec![0; count],
            waiting: vec![false; count],
            lru: VecDeque::new(),
            tick: 0,
            present: 0,
            filling: 0,
            leaving: 0,
            budget: budget.max(1),
            last: None,
            ahead_end: 0,
            window: 1,
            max_window: max_window.max(1),
        }
    }

    pub(crate) fn state(&self, block: usize) -> State {
        self.state[block]
    }

    pub(crate) fn count(&self) -> usize {
        self.state.len()
    }

    /// Blocks in local memory (fetched and not dropped).
    pub(crate) fn present(&self) -> usize {
        self.present
    }

    /// A touch of absent `block`: the blocks to fetch now, `block` first,
    /// then those read ahead. Faults that follow each other (the next block,
    /// or the first past what was read ahead) double the window up to its
    /// bound; any other fault starts it again at one block.
    pub(crate) fn fault(&mut self, block: usize, write: bool) -> Vec<usize> {
        let sequential = self
            .last
            .is_some_and(|last| block > last && block <= self.ahead_end + 1);
        self.window = if sequential {
            (self.window * 2).min(self.max_window)
        } else {
            1
        };
        self.last = Some(block);
        let mut fetch = Vec::new();
        if self.state[block] == State::Absent {
            self.state[block] = State::Fetching { write };
            fetch.push(block);
        }
        let end = block.saturating_add(self.window).min(self.count());
        for b in block + 1..end {
            if self.state[b] == State::Absent {
                self.state[b] = State::Fetching { write: false };
                fetch.push(b);
            }
        }
        self.ahead_end = end.saturating_sub(1).max(block);
        fetch
    }

    /// Whether a fetched block goes in writable (a write started its fetch).
    pub(crate) fn fetch_writes(&self, block: usize) -> bool {
        matches!(self.state[block], State::Fetching { write: true })
    }

    /// `block`'s bytes are in place.
    pub(crate) fn fetched(&mut self, block: usize) {
        let write = self.fetch_writes(block);
        self.state[block] = if write { State::Dirty } else { State::Clean };
        self.tick += 1;
        self.stamp[block] = self.tick;
        self.lru.push_back((self.tick, block));
        self.present += 1;
    }

    /// `block` could not be fetched within the timeout.
    pub(crate) fn failed(&mut self, block: usize) {
        self.state[block] = State::Failed;
    }

    /// A thread touched `block` while its pages are being dropped: it
    /// waits until they are ([`Blocks::evicted`] says to wake it).
    pub(crate) fn wait_on(&mut self, block: usize) {
        self.waiting[block] = true;
    }

    /// A write to write-protected `block`.
    pub(crate) fn write_fault(&mut self, block: usize) -> OnWrite {
        match self.state[block] {
            State::Clean | State::Dirty => {
                self.state[block] = State::Dirty;
                OnWrite::Unprotect
            }
            State::Writing | State::Evicting { .. } => {
                self.waiting[block] = true;
                OnWrite::Wait
            }
            State::Absent | State::Fetching { .. } | State::Failed => OnWrite::Wake,
        }
    }

    /// Whether one more block fits within the budget now.
    pub(crate) fn has_room(&self) -> bool {
        self.has_room_for(1)
    }

    /// Whether `n` more blocks fit within the budget now (room kept for
    /// blocks going in counts as taken).
    pub(crate) fn has_room_for(&self, n: usize) -> bool {
        self.present + self.filling + n <= self.budget
    }

    /// Keeps room for `n` fetched blocks whose pages go in next, outside
    /// the table's lock; [`Blocks::filled`] gives it back.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.filling += n;
    }

    /// Gives back room kept for `n` blocks ([`Blocks::reserve`]): their
    /// pages went in (and [`Blocks::fetched`] counts each) or they failed.
    pub(crate) fn filled(&mut self, n: usize) {
        self.filling -= n;
    }

    /// Present blocks chosen to leave and not gone yet.
    pub(crate) fn leaving(&self) -> usize {
        self.leaving
    }

    /// The least recently faulted present blocks that must leave for
    /// `extra` more to fit within the budget (counting those already
    /// leaving), now marked leaving. Blocks being written back are skipped
    /// and keep their place.
    pub(crate) fn make_room(&mut self, extra: usize) -> Vec<(usize, bool)> {
        let mut leaving = Vec::new();
        let mut skipped = Vec::new();
        while (self.present + self.filling + extra).saturating_sub(self.leaving) > self.budget {
            let Some((tick, b)) = self.lru.pop_front() else {
                break;
            };
            if self.stamp[b] != tick {
                continue; // dropped and fetched again since
            }
            match self.state[b] {
                State::Clean | State::Dirty => {
                    let dirty = self.state[b] == State::Dirty;
                    self.state[b] = State::Evicting { dirty };
                    self.leaving += 1;
                    leaving.push((b, dirty));
                }
                // Present but busy: keep its place for a later round.
                _ => skipped.push((tick, b)),
            }
        }
        for entry in skipped.into_iter().rev() {
            self.lru.push_front(entry);
        }
        leaving
    }

    /// `block` left local memory. Returns whether a writer waits on it.
    pub(crate) fn evicted(&mut self, block: usize) -> bool {
        self.state[block] = State::Absent;
        self.stamp[block] = 0;
        self.present -= 1;
        self.leaving -= 1;
        std::mem::take(&mut self.waiting[block])
    }

    /// An eviction whose write-back failed: the block stays, dirty (its
    /// bytes exist nowhere else). Returns whether a writer waits on it.
    pub(crate) fn kept(&mut self, block: usize) -> bool {
        self.state[block] = State::Dirty;
        self.leaving -= 1;
        self.tick += 1;
        self.stamp[block] = self.tick;
        self.lru.push_back((self.tick, block));
        std::mem::take(&mut self.waiting[block])
    }

    /// The dirty blocks of `range`, now marked as being written back.
    pub(crate) fn begin_write_back(&mut self, range: std::ops::Range<usize>) -> Vec<usize> {
        range
            .filter(|&b| {
                let dirty = self.state[b] == State::Dirty;
                if dirty {
                    self.state[b] = State::Writing;
                }
                dirty
            })
            .collect()
    }

    /// A write-back of `block` ended (`ok`: its bytes are the allocation's).
    /// Returns whether a writer waits on it; that write makes it dirty again.
    pub(crate) fn written(&mut self, block: usize, ok: bool) -> bool {
        let waiting = std::mem::take(&mut self.waiting[block]);
        self.state[block] = if ok && !waiting {
            State::Clean
        } else {
            State::Dirty
        };
        waiting
    }

    /// The clean blocks of `range`, now absent (their memory is to be
    /// dropped); dirty ones stay.
    pub(crate) fn drop_clean(&mut self, range: std::ops::Range<usize>) -> Vec<usize> {
        let dropped: Vec<usize> = range.filter(|&b| self.state[b] == State::Clean).collect();
        for &b in &dropped {
            self.state[b] = State::Absent;
            self.stamp[b] = 0;
            self.present -= 1;
        }
        dropped
    }

    /// Dirty blocks (what an unmap would lose if it could not write back).
    pub(crate) fn dirty(&self) -> usize {
        self.state
            .iter()
            .filter(|s| matches!(s, State::Dirty | State::Writing))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_kept_for_a_fill_counts_against_the_budget() {
        let mut b = Blocks::new(10, 2, 1);
        assert_eq!(b.fault(0, false), vec![0]);
        b.reserve(1);
        assert!(b.has_room_for(1) && !b.has_room_for(2));
        b.filled(1);
        b.fetched(0);
        assert_eq!(b.fault(1, false), vec![1]);
        b.reserve(1);
        // Block 0 present, block 1 going in: a third must make block 0 leave.
        assert!(!b.has_room());
        assert_eq!(b.make_room(1), vec![(0, false)]);
        b.filled(1);
        b.fetched(1);
        assert!(!b.evicted(0) && b.present() == 1 && b.has_room());
    }

    #[test]
    fn sequential_faults_widen_the_window_and_a_jump_resets_it() {
        let mut b = Blocks::new(100, 100, 8);
        assert_eq!(b.fault(0, false), vec![0]);
        b.fetched(0);
        assert_eq!(b.fault(1, false), vec![1, 2]);
        for x in [1, 2] {
            b.fetched(x);
        }
        // The next fault is past what was read ahead: still sequential.
        assert_eq!(b.fault(3, false), vec![3, 4, 5, 6]);
        for x in 3..=6 {
            b.fetched(x);
        }
        assert_eq!(
            b.fault(7, false),
            (7..15).collect::<Vec<_>>(),
            "bounded at 8"
        );
        assert_eq!(b.fault(50, false), vec![50], "a jump starts again");
        // Never past the end, never a block twice.
        let mut b = Blocks::new(4, 4, 8);
        b.fault(0, false);
        b.fetched(0);
        assert_eq!(b.fault(1, false), vec![1, 2]);
        assert_eq!(b.fault(3, false), vec![3]);
        assert_eq!(b.fault(2, false), Vec::<usize>::new(), "already on its way");
    }

    #[test]
    fn a_write_fault_installs_dirty_and_a_write_to_a_clean_block_dirties_it() {
        let mut b = Blocks::new(4, 4, 1);
        b.fault(0, true);
        assert!(b.fetch_writes(0));
        b.fetched(0);
        assert_eq!(b.state(0), State::Dirty);
        b.fault(1, false);
        b.fetched(1);
        assert_eq!(b.state(1), State::Clean);
        assert_eq!(b.write_fault(1), OnWrite::Unprotect);
        assert_eq!(b.state(1), State::Dirty);
        assert_eq!(
            b.write_fault(2),
            OnWrite::Wake,
            "absent: its retry faults it in"
        );
        assert_eq!(b.dirty(), 2);
    }

    #[test]
    fn the_budget_evicts_the_least_recently_faulted_and_skips_busy_blocks() {
        let mut b = Blocks::new(10, 3, 1);
        for x in 0..3 {
            b.fault(x, x == 1);
            b.fetched(x);
        }
        assert!(b.make_room(0).is_empty());
        assert_eq!(b.begin_write_back(0..1), Vec::<usize>::new(), "0 is clean");
        assert_eq!(b.begin_write_back(1..2), vec![1]);
        b.fault(3, false);
        b.fetched(3);
        b.fault(4, false);
        b.fetched(4);
        // 5 present, budget 3: 0 goes (clean), 1 is being written: 2 goes.
        assert_eq!(b.make_room(0), vec![(0, false), (2, false)]);
        assert!(!b.evicted(0));
        assert!(!b.evicted(2));
        assert_eq!(b.present(), 3);
        // 1 keeps its place at the front once its write-back ends.
        assert!(!b.written(1, true));
        b.fault(5, false);
        b.fetched(5);
        assert_eq!(b.make_room(0), vec![(1, false)]);
    }

    #[test]
    fn a_write_during_a_write_back_waits_and_leaves_the_block_dirty() {
        let mut b = Blocks::new(2, 2, 1);
        b.fault(0, true);
        b.fetched(0);
        assert_eq!(b.begin_write_back(0..2), vec![0]);
        assert_eq!(b.write_fault(0), OnWrite::Wait);
        assert!(b.written(0, true), "the writer is woken");
        assert_eq!(b.state(0), State::Dirty, "its write comes after the copy");
        // A failed write-back keeps the block dirty.
        assert_eq!(b.begin_write_back(0..1), vec![0]);
        assert!(!b.written(0, false));
        assert_eq!(b.state(0), State::Dirty);
    }

    #[test]
    fn an_eviction_that_cannot_write_back_keeps_the_block() {
        let mut b = Blocks::new(3, 1, 1);
        b.fault(0, true);
        b.fetched(0);
        b.fault(1, false);
        b.fetched(1);
        assert_eq!(b.make_room(0), vec![(0, true)]);
        assert_eq!(b.write_fault(0), OnWrite::Wait);
        assert!(b.kept(0), "its writer is woken");
        assert_eq!(b.state(0), State::Dirty);
        assert_eq!(b.present(), 2, "over budget until it can go");
        // Next round: 1 is now the least recent.
        assert_eq!(b.make_room(0), vec![(1, false)]);
    }

    #[test]
    fn invalidate_drops_only_clean_blocks() {
        let mut b = Blocks::new(4, 4, 1);
        for x in 0..4 {
            b.fault(x, x % 2 == 1);
            b.fetched(x);
        }
        assert_eq!(b.drop_clean(0..4), vec![0, 2]);
        assert_eq!(b.present(), 2);
        assert_eq!(b.state(0), State::Absent);
        assert_eq!(b.state(1), State::Dirty);
        // A dropped block faulted again is a new LRU entry, the old one stale.
        b.fault(0, false);
        b.fetched(0);
        let mut small = b;
        small.budget = 1;
        assert_eq!(small.make_room(0), vec![(1, true), (3, true)]);
    }
}
