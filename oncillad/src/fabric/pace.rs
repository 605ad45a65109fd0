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
        let (turn, wait) = self.turn(user, len, Instant::now())?;
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        Ok(turn)
    }

    /// [`Pace::admit`]'s bookkeeping at `now`: the pull's place and how
    /// long it must wait for its turn.
    fn turn(
        self: &Arc<Self>,
        user: Option<u32>,
        len: u64,
        now: Instant,
    ) -> Result<(Turn, Duration), String> {
        let Some(uid) = user else {
            return Ok((
                Turn {
                    pace: Arc::clone(self),
                    user: None,
                },
                Duration::ZERO,
            ));
        };
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
        Ok((turn, wait))
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
        let now = Instant::now();
        let wait = |user, len| pace.turn(user, len, now);
        let (a, w) = wait(Some(1), 1 << 20).unwrap();
        assert_eq!(w, Duration::ZERO);
        let (b, w) = wait(Some(1), 1 << 20).unwrap();
        assert_eq!(w, Duration::ZERO, "no wait within the burst");
        let (c, w) = wait(Some(1), 1 << 20).unwrap();
        assert_eq!(w, Duration::from_secs(1), "the third waits its turn");
        // Another user has a rate of its own, and operators none.
        assert_eq!(wait(Some(2), 1 << 20).unwrap().1, Duration::ZERO);
        assert_eq!(wait(None, 1 << 30).unwrap().1, Duration::ZERO);
        // Twelve seconds of bytes (after a 2 s wait): the next turn is too far.
        let (d, w) = wait(Some(1), 12 << 20).unwrap();
        assert_eq!(w, Duration::from_secs(2));
        let err = wait(Some(1), 1).map(|_| ()).unwrap_err();
        assert!(err.contains("next pull may start in"), "{err}");
        drop((a, b, c, d));
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
