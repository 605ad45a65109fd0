//! How the writes to a replicated allocation's primary ranges on this node
//! reach the other copies: the replicas' data addresses, the lock that puts
//! the writes in one order, and the ranges a replica missed.
//!
//! The primary applies and copies one write at a time (holding
//! [`Copying::order`] from before its bytes land until every replica has
//! acknowledged them), so every copy sees the writes in the same order and
//! two writers to overlapping bytes leave the same bytes everywhere. A copy
//! that fails leaves its range in [`Order::missed`] for that replica; the
//! next write sends those ranges again (from the primary's memory, under
//! the same lock) before its own bytes, so a replica never keeps a range
//! that differs from the primary once any later write was acknowledged.
//!
//! It owns that state only; sending is `fabric::replicate`'s. It never
//! talks to the network.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// Most missed ranges remembered per replica; past it they merge into
/// one range that covers them all (sent again whole).
pub const MAX_MISSED: usize = 64;

/// One allocation's copying on this node (every holder of a replicated
/// allocation has one; only a primary share uses it).
#[derive(Debug, Default)]
pub struct Copying {
    order: Mutex<Order>,
}

/// What the lock guards.
#[derive(Debug, Default)]
pub struct Order {
    /// The data addresses of the replicas of this node's primary ranges
    /// (empty: this node holds only replica ranges, or every replica was
    /// lost).
    pub replicas: Vec<String>,
    /// Per replica address: `(offset, len)` ranges it has not taken.
    pub missed: BTreeMap<String, Vec<(u64, u64)>>,
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

    /// Copies go to `replicas` from now on; ranges missed by replicas no
    /// longer in the list are forgotten, and each of `resend` is sent to
    /// every replica before the next write (a promoted primary's ranges:
    /// the old primary may have reached some replicas and not others).
    pub fn copy_to(&mut self, replicas: Vec<String>, resend: &[(u64, u64)]) {
        self.missed.retain(|addr, _| replicas.contains(addr));
        for addr in &replicas {
            for &(offset, len) in resend {
                self.miss(addr, offset, len);
            }
        }
        self.replicas = replicas;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missed_ranges_merge_past_the_bound() {
        let c = Copying::default();
        let mut o = c.order();
        o.copy_to(vec!["a:1".into()], &[]);
        for i in 0..MAX_MISSED as u64 {
            o.miss("a:1", i * 10, 5);
        }
        assert_eq!(o.missed["a:1"].len(), MAX_MISSED);
        o.miss("a:1", 10_000, 1);
        assert_eq!(o.missed["a:1"], [(0, 10_001)]);
    }

    #[test]
    fn new_replicas_forget_the_old_ones_and_take_what_is_resent() {
        let c = Copying::default();
        let mut o = c.order();
        o.copy_to(vec!["a:1".into(), "b:1".into()], &[]);
        o.miss("a:1", 0, 10);
        o.copy_to(vec!["b:1".into()], &[(100, 50)]);
        assert_eq!(o.replicas, ["b:1"]);
        assert!(!o.missed.contains_key("a:1"));
        assert_eq!(o.missed["b:1"], [(100, 50)]);
    }
}
