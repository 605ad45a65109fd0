//! How much one user's pulls may move into this agent: at most
//! [`MAX_PULLS_PER_USER`] at once, and at most `--pull-rate` bytes a
//! second over time (a second's worth may come at once), so a few bytes
//! of requests cannot turn into an unbounded stream of bytes between
//! agents at others' expense. Operators (the cluster token) are not paced.
//!
//! A pull waits for its turn (the user's earlier bytes paid off at the
//! rate) up to [`MAX_WAIT`]; past that it is refused with when to come
//! back. This module only counts and waits; it never reads or writes a
//! socket.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oncilla_model::size::HumanBytes;

/// Most pulls one user has in flight (or waiting for their turn) here.
pub const MAX_PULLS_PER_USER: usize = 8;
/// Longest a pull waits for its turn: with the 22 s a 4 MiB pull may take
/// (`super::pull::STALL`), inside a client's 30 s.
pub const MAX_WAIT: Duration = Duration::from_secs(5);
/// Bytes a user may move at once, in seconds of its rate.
const BURST: Duration = Duration::from_secs(1);

/// Every user's pulls on this agent.
#[derive(Debug)]
pub struct Pace {
    /// Bytes a second one user may pull; `None`: no limit on the rate.
    rate: Option<u64>,
    users: Mutex<HashMap<u32, User>>,
}

#[derive(Debug)]
struct User {
    in_flight: usize,
    /// When the user's bytes so far are paid off at the rate.
    paid: Instant,
}

/// A pull's place among its user's; given back on drop.
#[derive(Debug)]
pub struct Turn {
    pace: Arc<Pace>,
    user: Option<u32>,
}

impl Pace {
    /// `rate` bytes a second per user (`None` or 0: no limit on the rate;
    /// pulls in flight stay bounded).
    pub fn new(rate: Option<u64>) -> Arc<Self> {
        Arc::new(Self {
            rate: rate.filter(|&r| r > 0),
            users: Mutex::new(HashMap::new()),
        })
    }

    /// Admits a pull of `len` bytes for `user`, waiting for its turn.
    ///
    /// # Errors
    /// What the client is told: the user has [`MAX_PULLS_PER_USER`] in
    /// flight, or its turn is more than [`MAX_WAIT`] away.
    pub fn admit(self: &Arc<Self>, user: Option<u32>, len: u64) -> Result<Turn, String> {
        let Some(uid) = user else {
            return Ok(Turn {
                pace: Arc::clone(self),
                user: None,
            });
        };
        let now = Instant::now();
        let wait = {
            let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
            let u = users.entry(uid).or_insert(User {
                in_flight: 0,
                paid: now,
            });
            if u.in_flight >= MAX_PULLS_PER_USER {
                return Err(format!(
                    "uid {uid} has {MAX_PULLS_PER_USER} pulls in flight on this node, the most \
                     one user may; wait for them"
                ));
            }
            let start = u.paid.max(now);
            let wait = start.saturating_duration_since(now + BURST);
            if let Some(rate) = self.rate {
                if wait > MAX_WAIT {
                    return Err(format!(
                        "uid {uid} pulls at this node's rate for one user ({}/s); its next pull \
                         may start in {:.1} s",
                        HumanBytes(rate),
                        wait.as_secs_f64()
                    ));
                }
                u.paid = start + Duration::from_secs_f64(len as f64 / rate as f64);
            }
            u.in_flight += 1;
            wait
        };
        let turn = Turn {
            pace: Arc::clone(self),
            user,
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        Ok(turn)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let Some(uid) = self.user else {
            return;
        };
        let mut users = self.pace.users.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = users.get_mut(&uid) {
            u.in_flight -= 1;
            // Forgotten once idle and paid off: the map holds only users
            // with pulls in flight or bytes still to pay.
            if u.in_flight == 0 && u.paid <= Instant::now() {
                users.remove(&uid);
            }
        }
        // Users paid off while others pulled are forgotten too.
        let now = Instant::now();
        users.retain(|_, u| u.in_flight > 0 || u.paid > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_waits_for_its_rate_and_holds_at_most_its_pulls() {
        // 1 MiB/s: the first second's worth goes at once, the next waits.
        let pace = Pace::new(Some(1 << 20));
        let started = Instant::now();
        let a = pace.admit(Some(1), 1 << 20).unwrap();
        let b = pace.admit(Some(1), 1 << 20).unwrap();
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "no wait within the burst"
        );
        let c = pace.admit(Some(1), 1 << 20).unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(990),
            "the third waited its turn"
        );
        // Another user has a rate of its own, and operators none.
        let _d = pace.admit(Some(2), 1 << 20).unwrap();
        let _op = pace.admit(None, 1 << 30).unwrap();
        // Twelve seconds of bytes: the next turn is too far.
        let err = pace
            .admit(Some(1), 12 << 20)
            .map(|_| ())
            .and_then(|()| pace.admit(Some(1), 1).map(|_| ()));
        assert!(err.unwrap_err().contains("next pull may start in"));
        drop((a, b, c));
    }

    #[test]
    fn pulls_in_flight_are_bounded_per_user() {
        let pace = Pace::new(None);
        let turns: Vec<_> = (0..MAX_PULLS_PER_USER)
            .map(|_| pace.admit(Some(7), 1 << 30).unwrap())
            .collect();
        let err = pace.admit(Some(7), 1).unwrap_err();
        assert!(err.contains("8 pulls in flight"), "{err}");
        let _other = pace.admit(Some(8), 1).unwrap();
        drop(turns);
        let _again = pace.admit(Some(7), 1).unwrap();
        assert!(pace.users.lock().unwrap().len() <= 2);
    }
}
