//! How long an elected master may act: its term and the moment its lease
//! may end, as measured here. It owns that deadline and answers whether it
//! has passed; it never talks to etcd (the election loop renews it) and
//! never decides what a lapsed tenure means beyond "do not act".

use std::sync::Mutex;
use std::time::Instant;

/// An elected master's term and the time up to which it may act.
#[derive(Debug)]
pub struct Tenure {
    term: u64,
    /// Never later than etcd's own expiry of the lease: each renewal counts
    /// from when it was sent, not from when etcd answered.
    until: Mutex<Instant>,
}

impl Tenure {
    /// The tenure of the master elected in `term`, acting up to `until`.
    pub fn new(term: u64, until: Instant) -> Self {
        Self {
            term,
            until: Mutex::new(until),
        }
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    /// Up to when it may act.
    pub fn until(&self) -> Instant {
        *self.until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A renewal took: it may act up to `until` (never shortened here).
    pub fn extend(&self, until: Instant) {
        let mut u = self.until.lock().unwrap_or_else(|e| e.into_inner());
        *u = (*u).max(until);
    }

    /// Ends it now (the lease is known gone, or the daemon stops).
    pub fn end(&self) {
        *self.until.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// Whether it may act now.
    pub fn holds(&self) -> bool {
        Instant::now() < self.until()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_tenure_holds_until_its_deadline_and_renewals_never_shorten_it() {
        let now = Instant::now();
        let t = Tenure::new(7, now + Duration::from_secs(60));
        assert!(t.holds());
        assert_eq!(t.term(), 7);
        t.extend(now + Duration::from_secs(1));
        assert_eq!(t.until(), now + Duration::from_secs(60), "not shortened");
        t.end();
        assert!(!t.holds());
        let lapsed = Tenure::new(8, now);
        assert!(!lapsed.holds());
    }
}
