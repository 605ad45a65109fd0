//! The new copies this node holds that the master has not yet confirmed
//! whole. A reservation to be filled from a live copy
//! (`Reservation::fill`: a copy re-created, or moved off a drained node)
//! stamps its extents with a ticket; they are reported `filling` when the
//! agent registers, so a new master never takes them as a copy (the fill
//! may have been cut short with the master that ran it), until a
//! heartbeat's reply names their allocation `whole`, with the bytes the
//! master lists on this node. A reply speaks only of extents reserved
//! before its heartbeat was sent: a reservation that overtook the reply is
//! not what the master looked at. Of those, the ones inside the listed
//! bytes are whole; the others are copies the master gave up whose
//! reservation arrived after their give-back (nothing of the allocation
//! is being reserved, filled or owed here, or the master would not have
//! named it), and they are let go of.
//!
//! Never decides anything: the master's reply says what is whole and,
//! by what it leaves out, what it gave up.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use oncilla_model::cluster::{Listed, Range};

use super::Agent;

/// Tickets and the allocations holding extents stamped with one.
#[derive(Debug)]
pub struct Filling {
    /// The next ticket (tickets start at 1: 0 is a whole copy).
    next: AtomicU64,
    /// Allocations that may hold stamped extents (pruned when reported).
    ids: Mutex<BTreeSet<u64>>,
}

impl Default for Filling {
    fn default() -> Self {
        Self {
            next: AtomicU64::new(1),
            ids: Mutex::default(),
        }
    }
}

impl Filling {
    /// A ticket for a new copy being reserved.
    pub fn ticket(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst)
    }

    /// Notes that `alloc_id` holds stamped extents, once they are in the
    /// table (a report that sees the note sees them, so it never forgets
    /// an allocation whose extents are on their way).
    pub fn note(&self, alloc_id: u64) {
        self.ids().insert(alloc_id);
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a heartbeat reports of the copies being filled here: the
/// allocations, and the first ticket it does not cover.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FillingReport {
    pub ids: Vec<u64>,
    pub before: u64,
}

impl Agent {
    /// The allocations holding extents not yet confirmed whole, for the
    /// next heartbeat (those that hold none any more are forgotten).
    pub fn filling_report(&self) -> FillingReport {
        // The ticket first: an extent stamped after it is not covered.
        let before = self.filling.next.load(Ordering::SeqCst);
        let mut ids = self.filling.ids();
        ids.retain(|id| self.has_filling(*id));
        FillingReport {
            ids: ids.iter().copied().collect(),
            before,
        }
    }

    /// The master answered a heartbeat that carried `report`: of the
    /// allocations it names `whole`, the extents stamped before the
    /// heartbeat that lie inside the bytes it lists on this node are
    /// whole copies, and those outside them copies it gave up (a late
    /// reservation), let go of here. A list out of order is ignored.
    pub fn confirm_whole(&self, whole: &[Listed], report: &FillingReport) {
        for listed in whole {
            let id = listed.alloc_id;
            if !Range::in_order(&listed.ranges) {
                tracing::warn!(
                    alloc_id = id,
                    "the master listed bytes out of order; not confirmed"
                );
                continue;
            }
            let Some(held) = self.held.get(&id).map(|e| Arc::clone(e.value())) else {
                continue;
            };
            let inside = |offset: u64, len: u64| {
                let i = listed.ranges.partition_point(|g| g.alloc_offset <= offset);
                i.checked_sub(1).is_some_and(|i| {
                    let g = &listed.ranges[i];
                    offset + len <= g.alloc_offset + g.len
                })
            };
            let mut confirmed = 0usize;
            let mut given_up = Vec::new();
            for e in &held.extents {
                let ticket = e.filling.load(Ordering::SeqCst);
                if ticket == 0 || ticket >= report.before {
                    continue;
                }
                if !inside(e.alloc_offset, e.len) {
                    given_up.push((e.alloc_offset, e.len));
                } else if e
                    .filling
                    .compare_exchange(ticket, 0, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    confirmed += 1;
                }
            }
            if !given_up.is_empty() {
                match self.release_part(id, &given_up) {
                    Ok(_) => tracing::info!(
                        alloc_id = id,
                        extents = given_up.len(),
                        "let go of a new copy the master gave up (its reservation came after its give-back)"
                    ),
                    Err(e) => {
                        tracing::warn!(alloc_id = id, error = %e, "could not let go of a copy the master gave up");
                    }
                }
            }
            if confirmed > 0 {
                tracing::debug!(
                    alloc_id = id,
                    extents = confirmed,
                    "new copy confirmed whole"
                );
            }
        }
    }

    /// Whether allocation `id` holds an extent here not yet confirmed.
    fn has_filling(&self, id: u64) -> bool {
        self.held.get(&id).is_some_and(|e| {
            e.value()
                .extents
                .iter()
                .any(|x| x.filling.load(Ordering::SeqCst) != 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use oncilla_model::alloc::KEY_LEN;
    use oncilla_model::cluster::{Listed, Range};
    use oncilla_model::Fabric;

    use crate::agent::tests::{agent_of, rec, res};

    /// Which of allocation 1's extents the agent reports filling, by offset.
    fn reported(a: &crate::agent::Agent) -> Vec<(u64, bool)> {
        let (reg, _) = a.registration();
        reg.held
            .iter()
            .flat_map(|h| h.all_extents())
            .map(|e| (e.alloc_offset, e.filling))
            .collect()
    }

    /// The master's word that allocation 1's bytes `ranges` are listed here.
    fn listed(ranges: &[(u64, u64)]) -> Vec<Listed> {
        vec![Listed {
            alloc_id: 1,
            ranges: ranges
                .iter()
                .map(|&(alloc_offset, len)| Range { alloc_offset, len })
                .collect(),
        }]
    }

    #[test]
    fn a_new_copy_is_reported_filling_until_a_reply_to_a_later_heartbeat_confirms_it() {
        let a = agent_of(16);
        let copy = |at: u64, fill: bool| {
            let mut r = res(1, &[9; KEY_LEN], &[(at, 4096)], rec(), Fabric::Tcp);
            r.copy = 1;
            r.fill = fill;
            r
        };
        // A copy of a new allocation is whole from the start (zeroed).
        a.reserve(copy(0, false)).unwrap();
        assert!(a.filling_report().ids.is_empty());
        a.reserve(copy(4096, true)).unwrap();
        assert_eq!(reported(&a), [(0, false), (4096, true)]);
        let sent = a.filling_report();
        assert_eq!(sent.ids, [1]);
        // A second fill reserved after that heartbeat went out.
        a.reserve(copy(8192, true)).unwrap();
        // A reply naming another allocation changes nothing, nor one
        // whose list is out of order.
        let mut other = listed(&[(0, 12288)]);
        other[0].alloc_id = 2;
        a.confirm_whole(&other, &sent);
        a.confirm_whole(&listed(&[(4096, 4096), (0, 4096)]), &sent);
        assert_eq!(reported(&a), [(0, false), (4096, true), (8192, true)]);
        // The reply to it confirms what it covered, not the later fill.
        a.confirm_whole(&listed(&[(0, 12288)]), &sent);
        assert_eq!(reported(&a), [(0, false), (4096, false), (8192, true)]);
        let next = a.filling_report();
        assert_eq!(next.ids, [1]);
        a.confirm_whole(&listed(&[(0, 12288)]), &next);
        assert_eq!(reported(&a), [(0, false), (4096, false), (8192, false)]);
        assert!(a.filling_report().ids.is_empty(), "forgotten once whole");
        // A copy the master gave up whose reservation came late: the
        // reply names the allocation without its bytes, and it goes.
        a.reserve(copy(16384, true)).unwrap();
        let late = a.filling_report();
        a.confirm_whole(&listed(&[(0, 12288)]), &late);
        assert_eq!(reported(&a), [(0, false), (4096, false), (8192, false)]);
        assert!(a.filling_report().ids.is_empty());
        // Released before its confirmation: not reported.
        a.reserve(copy(12288, true)).unwrap();
        a.release_part(1, &[(12288, 4096)]).unwrap();
        assert!(a.filling_report().ids.is_empty());
    }
}
