//! The ids this agent reserved since its last heartbeat went through:
//! what a heartbeat carries between full reports (see
//! `membership::HeldReport`). Bounded: past [`MAX_FRESH`] ids it only
//! remembers that it overflowed, and the next heartbeat carries the full
//! list instead. It never decides what to release.

use std::sync::Mutex;

/// Most ids remembered between two heartbeats.
pub const MAX_FRESH: usize = 4096;

#[derive(Default)]
pub struct Fresh(Mutex<Ids>);

#[derive(Default)]
struct Ids {
    ids: Vec<u64>,
    overflowed: bool,
}

impl Fresh {
    /// Notes a reservation of `id`.
    pub fn note(&self, id: u64) {
        let mut f = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if f.ids.len() < MAX_FRESH {
            f.ids.push(id);
        } else {
            f.overflowed = true;
        }
    }

    /// The ids noted since the last call, or `None` when there were more
    /// than [`MAX_FRESH`] (report everything instead); starts afresh.
    pub fn take(&self) -> Option<Vec<u64>> {
        let f = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        (!f.overflowed).then_some(f.ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_ids_are_taken_once_and_overflow_asks_for_everything() {
        let f = Fresh::default();
        f.note(7);
        f.note(9);
        assert_eq!(f.take(), Some(vec![7, 9]));
        assert_eq!(f.take(), Some(vec![]));
        for id in 0..=MAX_FRESH as u64 {
            f.note(id);
        }
        assert_eq!(f.take(), None);
        assert_eq!(f.take(), Some(vec![]));
    }
}
