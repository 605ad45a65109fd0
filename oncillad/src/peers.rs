//! The cluster's data addresses as this agent last heard them from the
//! master: the only places the data server dials to pull bytes for a
//! client, so no client can make this agent connect anywhere else.
//!
//! It owns the set and its updates (each registration and heartbeat that
//! carries a new list replaces it whole). It never dials and never decides
//! what a pull may read: the agent it dials checks the client's credential
//! and the source's access key as for any client.

use std::collections::HashSet;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The longest a pull waits for an address to show up: a pull must end
/// well inside a client's 30 s I/O timeout.
pub const MAX_WAIT: Duration = Duration::from_secs(5);
/// The shortest such wait.
const MIN_WAIT: Duration = Duration::from_secs(1);

/// The data addresses of the cluster's nodes.
#[derive(Debug, Default)]
pub struct Peers {
    known: Mutex<Known>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Known {
    addrs: HashSet<String>,
    /// The master's version of the list (0: none yet).
    version: u64,
    /// How long an unknown address is waited for: two heartbeats (the
    /// next update), within [`MIN_WAIT`] and [`MAX_WAIT`].
    wait: Duration,
}

impl Peers {
    /// The version of the list held (0: none yet), for the heartbeat to
    /// say which it has.
    pub fn version(&self) -> u64 {
        self.lock().version
    }

    /// Notes the interval at which the master's next update comes.
    pub fn heartbeat(&self, interval: Duration) {
        self.lock().wait = (interval * 2).clamp(MIN_WAIT, MAX_WAIT);
    }

    /// Replaces the set with version `version` of the master's list.
    pub fn set(&self, version: u64, addrs: impl IntoIterator<Item = String>) {
        let mut now = self.lock();
        now.version = version;
        now.addrs = addrs.into_iter().collect();
        self.changed.notify_all();
    }

    /// Whether `addr` is a node's data address. One that is not waits up
    /// to two heartbeats for the next update (a node that joined since the
    /// last one).
    pub fn admits(&self, addr: &str) -> bool {
        self.admits_by(addr, None)
    }

    /// [`Self::admits`], waiting no later than `by` when given.
    pub fn admits_by(&self, addr: &str, by: Option<Instant>) -> bool {
        let mut now = self.lock();
        let own = Instant::now() + now.wait.max(MIN_WAIT);
        let until = by.map_or(own, |by| own.min(by));
        loop {
            if now.addrs.contains(addr) {
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

    fn lock(&self) -> MutexGuard<'_, Known> {
        // Replaced whole: a panic elsewhere cannot leave it half-written.
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn only_named_addresses_are_admitted_and_a_late_join_is_waited_for() {
        let peers = Arc::new(Peers::default());
        peers.heartbeat(Duration::from_millis(200));
        peers.set(1, ["10.0.0.1:7001".to_string()]);
        assert_eq!(peers.version(), 1);
        assert!(peers.admits("10.0.0.1:7001"));
        let started = Instant::now();
        assert!(!peers.admits("10.0.0.2:7001"));
        assert!(
            started.elapsed() >= MIN_WAIT,
            "an unknown address is waited for"
        );
        let later = Arc::clone(&peers);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            later.set(
                2,
                ["10.0.0.1:7001".to_string(), "10.0.0.2:7001".to_string()],
            );
        });
        assert!(peers.admits("10.0.0.2:7001"));
        t.join().unwrap();
        peers.heartbeat(Duration::from_secs(60));
        assert_eq!(peers.lock().wait, MAX_WAIT);
        peers.heartbeat(Duration::from_millis(10));
        assert_eq!(peers.lock().wait, MIN_WAIT);
        peers.set(3, []);
        assert!(!peers.admits("10.0.0.1:7001"));
    }
}
