//! What the master's allocation requests came to: allocations made, and
//! requests refused by reason, as running totals the metrics mirror
//! (`oncilla_master_allocations_made_total`,
//! `oncilla_master_allocation_failures_total`). It counts; it never
//! decides anything.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::CoreError;

/// Why an allocation request was refused, as the metrics label it. Its
/// discriminant is its slot in [`Refusals`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No node had room, or an agent's pool was exhausted.
    Capacity,
    /// The user's quota.
    Quota,
    /// The request itself (bounds, names, kinds, unknown nodes).
    Invalid,
    /// A node needed was down, draining or failed its part.
    Unavailable,
    /// The master was recovering, standing by, or lost its term.
    NotServing,
    /// The requester may not.
    Denied,
    /// Anything else.
    Other,
}

impl Refusal {
    /// Every reason, in discriminant order.
    pub const ALL: [Refusal; 7] = [
        Refusal::Capacity,
        Refusal::Quota,
        Refusal::Invalid,
        Refusal::Unavailable,
        Refusal::NotServing,
        Refusal::Denied,
        Refusal::Other,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Capacity => "capacity",
            Refusal::Quota => "quota",
            Refusal::Invalid => "invalid",
            Refusal::Unavailable => "unavailable",
            Refusal::NotServing => "not_serving",
            Refusal::Denied => "denied",
            Refusal::Other => "other",
        }
    }

    /// The reason `e` stands for.
    pub fn of(e: &CoreError) -> Self {
        match e {
            CoreError::CapacityExhausted { .. } | CoreError::Pool(_) => Refusal::Capacity,
            CoreError::Quota(_) | CoreError::QuotaStore(_) => Refusal::Quota,
            CoreError::InvalidArgument(_)
            | CoreError::Invalid(_)
            | CoreError::UnknownNode { .. }
            | CoreError::NameTaken(..)
            | CoreError::NoSuchSession(_) => Refusal::Invalid,
            CoreError::NodeDown(_)
            | CoreError::NodeDraining(_)
            | CoreError::Agent { .. }
            | CoreError::NoGpu(_) => Refusal::Unavailable,
            CoreError::Recovering(_)
            | CoreError::Standby { .. }
            | CoreError::Deposed { .. }
            | CoreError::Lapsed { .. } => Refusal::NotServing,
            CoreError::PermissionDenied(_) | CoreError::TooManySessions { .. } => Refusal::Denied,
            _ => Refusal::Other,
        }
    }
}

/// The running totals.
#[derive(Debug, Default)]
pub struct Refusals {
    made: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
}

impl Refusals {
    /// `n` allocations were made.
    pub fn made(&self, n: u64) {
        self.made.fetch_add(n, Ordering::Relaxed);
    }

    /// A request was refused with `e`.
    pub fn refused(&self, e: &CoreError) {
        self.refused[Refusal::of(e) as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Allocations made so far.
    pub fn made_total(&self) -> u64 {
        self.made.load(Ordering::Relaxed)
    }

    /// Requests refused so far for `r`.
    pub fn refused_total(&self, r: Refusal) -> u64 {
        self.refused[r as usize].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_count_by_reason() {
        let r = Refusals::default();
        r.made(3);
        r.refused(&CoreError::CapacityExhausted {
            requested: 1,
            detail: String::new(),
        });
        r.refused(&CoreError::Recovering(std::time::Duration::from_secs(1)));
        r.refused(&CoreError::Internal("x".into()));
        assert_eq!(r.made_total(), 3);
        assert_eq!(r.refused_total(Refusal::Capacity), 1);
        assert_eq!(r.refused_total(Refusal::NotServing), 1);
        assert_eq!(r.refused_total(Refusal::Other), 1);
        assert_eq!(r.refused_total(Refusal::Quota), 0);
        // Every reason has its own slot.
        for (i, r) in Refusal::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?}");
        }
    }
}
