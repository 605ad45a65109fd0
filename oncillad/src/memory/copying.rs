//! How the writes to a replicated allocation's primary ranges on this node
//! reach the other copies: the replicas' data addresses, the lock that puts
//! the writes in one order, and the ranges a replica missed.
//!
//! A write lands in the primary's memory first; then the primary copies
//! one write at a time (holding [`Copying::order`] until every replica has
//! acknowledged it), each copy being of the memory at sending time, so the
//! last copy of every byte is sent after every write of it landed: every
//! copy ends with the primary's bytes, also with two writers to
//! overlapping bytes. A copy
//! that fails leaves its range in [`Order::missed`] for that replica; the
//! next write sends those ranges again (from the primary's memory, under
//! the same lock) before its own bytes, so a replica never keeps a range
//! that differs from the primary once any later write was acknowledged.
//!
//! A replica lets copies land one at a time and never one older than what
//! landed ([`Applied`]): a copy the primary gave up on and sent again
//! cannot land after a later one.
//!
//! It owns that state only; sending is `fabric::replicate`'s. It never
//! talks to the network.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use oncilla_model::cluster::ReplicaShare;

/// Most missed ranges remembered per replica; past it they merge into
/// one range that covers them all (sent again whole).
pub const MAX_MISSED: usize = 64;

/// One allocation's copying on this node (every holder of a replicated
/// allocation has one): the order of a primary share's writes, and what
/// its replica shares applied.
#[derive(Debug)]
pub struct Copying {
    order: Mutex<Order>,
    applied: Mutex<Applied>,
}

impl Default for Copying {
    fn default() -> Self {
        let mut order = Order::default();
        order.new_sender();
        Self {
            order: Mutex::new(order),
            applied: Mutex::default(),
        }
    }
}

/// Most replaced primaries a replica remembers per allocation.
const MAX_RETIRED: usize = 16;

/// A replica's side of one allocation here: per replica extent (named by
/// its first byte in the allocation) the stamp of the last copy applied,
/// and the primaries it no longer takes copies from. Stamps are per
/// extent, not per copy: a node may hold replica shares of one copy from
/// two primaries (a copy re-created beside another share), and one
/// primary's copies must not pass for the other's. A primary is retired
/// for the whole allocation once another sender wrote an extent it wrote
/// last (a replica promoted in its place, or its own node's new sender
/// after a promotion): a replaced primary never sends again, so a stale
/// copy of its is refused in every extent, also those it never wrote.
/// Held while a copy lands, so copies land one at a time.
#[derive(Debug, Default)]
pub struct Applied {
    /// Per extent: the sender (a primary agent's stamp) and sequence
    /// number of the last copy that landed.
    last: BTreeMap<u64, (u64, u64)>,
    retired: Vec<u64>,
}

impl Applied {
    /// Whether a copy stamped `(sender, seq)` (the wire's `Stamp`) may land
    /// in the replica extent starting at `extent`: a later one from the
    /// primary it last took one from, or the first from a new primary (a
    /// replica promoted in place of a lost one), never one from a primary
    /// that was replaced or one older than what landed.
    pub fn admits(&self, extent: u64, (sender, seq): (u64, u64)) -> bool {
        if self.retired.contains(&sender) {
            return false;
        }
        match self.last.get(&extent) {
            Some(&(last_sender, last_seq)) if last_sender == sender => seq > last_seq,
            _ => true,
        }
    }

    /// A copy stamped `(sender, seq)` landed in the replica extent starting
    /// at `extent`.
    pub fn landed(&mut self, extent: u64, (sender, seq): (u64, u64)) {
        if let Some((old, _)) = self.last.insert(extent, (sender, seq)) {
            if old != sender && !self.retired.contains(&old) {
                self.retired.push(old);
                if self.retired.len() > MAX_RETIRED {
                    self.retired.remove(0);
                }
            }
        }
    }

    /// Forgets the extents starting at `extents` (this node let go of them).
    pub fn forget(&mut self, extents: impl IntoIterator<Item = u64>) {
        for e in extents {
            self.last.remove(&e);
        }
    }
}

/// What the lock guards.
#[derive(Debug, Default)]
pub struct Order {
    /// The replicas of this node's primary ranges, each with the ranges it
    /// holds (empty: this node holds only replica ranges, or every replica
    /// was lost). A write goes to each replica holding some of its bytes:
    /// a node promoted in place of another holds two primary shares, whose
    /// replicas may be on different nodes.
    pub replicas: Vec<ReplicaShare>,
    /// Per replica address: `(offset, len)` ranges it has not taken.
    pub missed: BTreeMap<String, Vec<(u64, u64)>>,
    /// Who this primary share is to its replicas (the wire's `Stamp`
    /// sender): random per share, new when a replica is promoted here, so
    /// no replica mistakes it for an earlier primary on this node.
    pub sender: u64,
    /// The last copy's sequence number under `sender`.
    pub seq: u64,
    /// The generation of the latest copy change applied (0: none yet, the
    /// replicas are those the reservation brought).
    pub generation: u64,
}

impl Order {
    /// Notes that `replica` missed `[offset, offset + len)`.
    pub fn miss(&mut self, replica: &str, offset: u64, len: u64) {
        let list = self.missed.entry(replica.to_string()).or_default();
        list.push((offset, len));
        if list.len() > MAX_MISSED {
            let start = list.iter().map(|r| r.0).min().unwrap_or(0);
            let end = list.iter().map(|r| r.0 + r.1).max().unwrap_or(0);
            *list = vec![(start, end - start)];
        }
    }

    /// Takes at most `budget` bytes of the ranges `replica` missed (a range
    /// past it is split), leaving the rest noted; returns the parts of
    /// them the replica holds.
    pub fn take_missed(&mut self, replica: &str, budget: u64) -> Vec<(u64, u64)> {
        let Some(list) = self.missed.get_mut(replica) else {
            return Vec::new();
        };
        let (mut taken, mut left) = (Vec::new(), budget);
        while left > 0 {
            let Some(&(offset, len)) = list.first() else {
                break;
            };
            let n = len.min(left);
            taken.push((offset, n));
            left -= n;
            if n == len {
                list.remove(0);
            } else {
                list[0] = (offset + n, len - n);
            }
        }
        if list.is_empty() {
            self.missed.remove(replica);
        }
        // Merged past their bound, missed ranges may span bytes the
        // replica does not hold (another replica's, of a node that took
        // over another's bytes): only what it holds is sent.
        match self.replica(replica) {
            Some(r) => r.parts_of(taken),
            None => taken,
        }
    }

    /// Begins again as a new primary (a replica promoted here): a new
    /// sender, counted from 1.
    pub fn new_sender(&mut self) {
        self.sender = rand::random::<u64>() | 1;
        self.seq = 0;
    }

    /// Copies go to `replicas` from now on; ranges missed by replicas no
    /// longer in the list, or no longer held by them, are forgotten, and
    /// each of `resend` is sent to every replica holding some of it before
    /// the next write (a promoted primary's ranges: the old primary may
    /// have reached some replicas and not others).
    pub fn copy_to(&mut self, replicas: Vec<ReplicaShare>, resend: &[(u64, u64)]) {
        let missed = std::mem::take(&mut self.missed);
        for (addr, ranges) in missed {
            let Some(r) = replicas.iter().find(|r| r.data_addr == addr) else {
                continue;
            };
            for (o, l) in r.parts_of(ranges) {
                self.miss(&addr, o, l);
            }
        }
        for r in &replicas {
            for (o, l) in r.parts_of(resend.iter().copied()) {
                self.miss(&r.data_addr, o, l);
            }
        }
        self.replicas = replicas;
    }

    /// The replica at data address `addr`, if it is one.
    pub fn replica(&self, addr: &str) -> Option<&ReplicaShare> {
        self.replicas.iter().find(|r| r.data_addr == addr)
    }
}

impl Copying {
    /// The order lock; held across a write and its copies, and while the
    /// replicas change.
    pub fn order(&self) -> MutexGuard<'_, Order> {
        // A writer that panicked left the ranges it noted; they stay valid.
        self.order
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The replica side's lock; held while a copy lands.
    pub fn applied(&self) -> MutexGuard<'_, Applied> {
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncilla_model::cluster::Range;

    /// A replica at `addr` of `[0, 1 GiB)`.
    fn all(addr: &str) -> ReplicaShare {
        ReplicaShare::of(
            addr,
            &[Range {
                alloc_offset: 0,
                len: 1 << 30,
            }],
        )
    }

    #[test]
    fn missed_ranges_merge_past_the_bound() {
        let c = Copying::default();
        let mut o = c.order();
        o.copy_to(vec![all("a:1")], &[]);
        for i in 0..MAX_MISSED as u64 {
            o.miss("a:1", i * 10, 5);
        }
        assert_eq!(o.missed["a:1"].len(), MAX_MISSED);
        o.miss("a:1", 10_000, 1);
        assert_eq!(o.missed["a:1"], [(0, 10_001)]);
    }

    #[test]
    fn a_replica_extent_takes_copies_in_order_and_never_from_a_replaced_primary() {
        let mut a = Applied::default();
        let (p, q) = (7, 9);
        assert!(a.admits(1, (p, 1)));
        a.landed(1, (p, 5));
        assert!(!a.admits(1, (p, 5)), "again");
        assert!(!a.admits(1, (p, 4)), "older");
        assert!(a.admits(1, (p, 6)));
        assert!(a.admits(2, (q, 1)), "another extent");
        // A promoted primary takes over extent 1: the old one is refused,
        // there and in an extent it never wrote.
        assert!(a.admits(1, (q, 1)));
        a.landed(1, (q, 1));
        assert!(!a.admits(1, (p, 99)));
        assert!(!a.admits(3, (p, 99)));
        // Extents of two primaries here (a copy re-created beside another
        // share): neither retires the other.
        let (r, s) = (11, 13);
        a.landed(100, (r, 1));
        a.landed(200, (s, 1));
        a.landed(100, (r, 2));
        a.landed(200, (s, 2));
        assert!(a.admits(100, (r, 3)) && a.admits(200, (s, 3)));
        // Let go of, then held again: a new primary's copies land.
        a.forget([200]);
        assert!(a.admits(200, (q, 2)));
    }

    #[test]
    fn missed_ranges_are_taken_a_budget_at_a_time() {
        let c = Copying::default();
        let mut o = c.order();
        o.copy_to(vec![all("a:1")], &[(0, 100), (200, 50)]);
        assert_eq!(o.take_missed("a:1", 60), [(0, 60)]);
        assert_eq!(o.take_missed("a:1", 60), [(60, 40), (200, 20)]);
        assert_eq!(o.take_missed("a:1", 60), [(220, 30)]);
        assert!(o.take_missed("a:1", 60).is_empty());
        assert!(!o.missed.contains_key("a:1"));
    }

    #[test]
    fn new_replicas_forget_the_old_ones_and_take_what_is_resent() {
        let c = Copying::default();
        let mut o = c.order();
        o.copy_to(vec![all("a:1"), all("b:1")], &[]);
        o.miss("a:1", 0, 10);
        o.copy_to(vec![all("b:1")], &[(100, 50)]);
        assert_eq!(o.replicas, [all("b:1")]);
        assert!(!o.missed.contains_key("a:1"));
        assert_eq!(o.missed["b:1"], [(100, 50)]);
    }

    #[test]
    fn missed_ranges_are_taken_only_where_the_replica_holds_bytes() {
        let c = Copying::default();
        let mut o = c.order();
        let range = |alloc_offset, len| Range { alloc_offset, len };
        let r = ReplicaShare::of("r:1", &[range(0, 10), range(10, 10), range(40, 10)]);
        o.copy_to(vec![r], &[]);
        // Missed ranges merged past their bound span a gap (bytes of
        // this primary another replica holds) and two adjacent ranges.
        o.miss("r:1", 0, 100);
        assert_eq!(
            o.take_missed("r:1", u64::MAX),
            [(0, 10), (10, 10), (40, 10)]
        );
        o.miss("r:1", 5, 10);
        o.miss("r:1", 45, 100);
        assert_eq!(o.take_missed("r:1", u64::MAX), [(5, 5), (10, 5), (45, 5)]);
        o.miss("r:1", 20, 20);
        assert!(o.take_missed("r:1", u64::MAX).is_empty());
    }

    #[test]
    fn each_replica_is_owed_only_the_bytes_it_holds() {
        let c = Copying::default();
        let mut o = c.order();
        let range = |alloc_offset, len| Range { alloc_offset, len };
        // b holds this node's own share, d the share it took over.
        let b = ReplicaShare::of("b:1", &[range(0, 100), range(200, 100)]);
        let d = ReplicaShare::of("d:1", &[range(100, 100)]);
        o.copy_to(vec![b.clone(), d.clone()], &[(50, 200)]);
        assert_eq!(o.missed["b:1"], [(50, 50), (200, 50)]);
        assert_eq!(o.missed["d:1"], [(100, 100)]);
        // b no longer holds [200, 300): what it missed there is forgotten.
        let b = ReplicaShare::of("b:1", &[range(0, 100)]);
        o.copy_to(vec![b, d], &[]);
        assert_eq!(o.missed["b:1"], [(50, 50)]);
        assert_eq!(o.replica("d:1").map(|r| r.ranges.len()), Some(1));
        assert!(o.replica("c:1").is_none());
    }
}
