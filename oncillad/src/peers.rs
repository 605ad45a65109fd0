//! The cluster's data addresses as this agent last heard them from the
//! master: the only places the data server dials to pull bytes for a
//! client, so no client can make this agent connect anywhere else.
//!
//! It owns the set and its updates (each registration and heartbeat
//! replaces it whole). It never dials and never decides what a pull may
//! read: the agent it dials checks the client's credential and the
//! source's access key as for any client.

use std::collections::HashSet;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The data addresses of the cluster's nodes.
#[derive(Debug, Default)]
pub struct Peers {
    addrs: Mutex<HashSet<String>>,
    changed: Condvar,
}

impl Peers {
    /// Replaces the set with what the master last said.
    pub fn set(&self, addrs: impl IntoIterator<Item = String>) {
        let fresh: HashSet<String> = addrs.into_iter().collect();
        let mut now = self.lock();
        if *now != fresh {
            *now = fresh;
            self.changed.notify_all();
        }
    }

    /// Whether `addr` is a node's data address. One that is not waits up
    /// to `wait` for the next update (a node that joined since the last
    /// heartbeat).
    pub fn admits(&self, addr: &str, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        let mut now = self.lock();
        loop {
            if now.contains(addr) {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            now = match self.changed.wait_timeout(now, left) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<String>> {
        // A set of strings replaced whole: a panic elsewhere cannot leave
        // it half-written.
        self.addrs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn only_named_addresses_are_admitted_and_a_late_join_is_waited_for() {
        let peers = Arc::new(Peers::default());
        peers.set(["10.0.0.1:7001".to_string()]);
        assert!(peers.admits("10.0.0.1:7001", Duration::ZERO));
        assert!(!peers.admits("10.0.0.2:7001", Duration::from_millis(20)));
        let later = Arc::clone(&peers);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            later.set(["10.0.0.1:7001".to_string(), "10.0.0.2:7001".to_string()]);
        });
        assert!(peers.admits("10.0.0.2:7001", Duration::from_secs(5)));
        t.join().unwrap();
        peers.set([]);
        assert!(!peers.admits("10.0.0.1:7001", Duration::ZERO));
    }
}
