//! Reaching the leading master among several: every address a client was
//! given, the one that answered last, and leaders that standbys name. It
//! owns which address a call goes to next; it never waits (callers wrap a
//! call in [`crate::client::through_recovery`], which waits while no
//! master leads or the leader recovers) and never reads an answer beyond
//! its status.

use std::sync::Mutex;

use tonic::{Code, Status};

use crate::client::AddrError;
use crate::status::{retry_after, standby_leader};

/// Most leaders named by standbys that are kept beside the given
/// addresses (a standby's word is trusted only this far).
const MAX_NAMED: usize = 8;

/// Makes the client of one address (lazily connected).
type Make<C> = Box<dyn Fn(&str) -> Result<C, AddrError> + Send + Sync>;

/// The masters of one cluster, as one client reaches them.
pub struct Masters<C> {
    given: usize,
    at: Mutex<At<C>>,
    make: Make<C>,
}

struct At<C> {
    /// The given addresses first, then leaders standbys named.
    list: Vec<(String, C)>,
    /// Where the next call goes.
    current: usize,
}

impl<C: Clone> Masters<C> {
    /// The masters at `addrs` (at least one), with clients made by `make`.
    ///
    /// # Errors
    /// An address `make` refuses; [`AddrError`] for an empty list.
    pub fn new(
        addrs: &[String],
        make: impl Fn(&str) -> Result<C, AddrError> + Send + Sync + 'static,
    ) -> Result<Self, AddrError> {
        if addrs.is_empty() {
            return Err(AddrError::new("", "no master address given"));
        }
        let list = addrs
            .iter()
            .map(|a| Ok((a.clone(), make(a)?)))
            .collect::<Result<Vec<_>, AddrError>>()?;
        Ok(Self {
            given: list.len(),
            at: Mutex::new(At { list, current: 0 }),
            make: Box::new(make),
        })
    }

    fn at(&self) -> std::sync::MutexGuard<'_, At<C>> {
        self.at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The address the next call goes to, and its client.
    pub fn current(&self) -> (String, C) {
        let at = self.at();
        at.list[at.current].clone()
    }

    /// The client of `addr`, when it is known.
    pub fn client(&self, addr: &str) -> Option<C> {
        let at = self.at();
        at.list
            .iter()
            .find(|(a, _)| a == addr)
            .map(|(_, c)| c.clone())
    }

    /// How many masters this client knows (given, and named since).
    fn len(&self) -> usize {
        self.at().list.len()
    }

    /// The next given address after `addr` (the first, after a named
    /// one), unless another call moved on meanwhile.
    fn rotate_from(&self, addr: &str) {
        let mut at = self.at();
        if at.list[at.current].0 == addr {
            // A named leader that failed gives way to the given list.
            at.current = if at.current >= self.given {
                0
            } else {
                (at.current + 1) % self.given
            };
        }
    }

    /// `leader` from now on (added when it is not known yet).
    ///
    /// # Errors
    /// An address the client cannot dial.
    fn follow(&self, leader: &str) -> Result<(), AddrError> {
        let mut at = self.at();
        if let Some(i) = at.list.iter().position(|(a, _)| a == leader) {
            at.current = i;
            return Ok(());
        }
        let client = (self.make)(leader)?;
        if at.list.len() >= self.given + MAX_NAMED {
            at.list.truncate(self.given);
        }
        at.list.push((leader.to_string(), client));
        at.current = at.list.len() - 1;
        Ok(())
    }

    /// Moves on to the first master not in `tried`: the given ones in
    /// their order after the current one, then leaders standbys named.
    /// False when every one was tried.
    fn next_untried(&self, tried: &[String]) -> bool {
        let mut at = self.at();
        let given = self.given;
        let after = if at.current < given {
            at.current + 1
        } else {
            0
        };
        let order = (0..given)
            .map(|k| (after + k) % given)
            .chain(given..at.list.len());
        for i in order {
            if !tried.contains(&at.list[i].0) {
                at.current = i;
                return true;
            }
        }
        false
    }

    /// Runs `call` at the leader: follows a standby to the leader it names
    /// and moves past masters that cannot be reached; any other outcome is
    /// the caller's, with the address that gave it (and, on success, the
    /// address that answered). `status_of` finds the status in a failure.
    ///
    /// # Errors
    /// The last failure, and where: a standby that knows no leader yet
    /// (after which the next call tries another master), every master
    /// unreachable, a master that did not answer (its outcome unknown),
    /// or any answer that is not about leadership.
    pub async fn at_leader<T, E, F, Fut>(
        &self,
        status_of: fn(&E) -> Option<&Status>,
        mut call: F,
    ) -> Result<(String, T), (String, E)>
    where
        F: FnMut(C) -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        // Each master at most once a referral per call, and asked at most
        // once when it cannot be reached or did not answer. One that did
        // not answer may have done what was asked (the request went out):
        // it is never asked again in the call, and its failure (retried by
        // nobody) is the call's outcome unless another master does the work.
        let mut referrals = 0;
        let mut tried: Vec<String> = Vec::new();
        let mut unanswered: Option<(String, E)> = None;
        loop {
            let (addr, client) = self.current();
            let failed = match call(client).await {
                Ok(v) => return Ok((addr, v)),
                Err(e) => e,
            };
            let Some(s) = status_of(&failed) else {
                return Err((addr, failed));
            };
            match standby_leader(s) {
                Some(Some(leader))
                    if leader != addr && referrals <= self.len() && !tried.contains(&leader) =>
                {
                    referrals += 1;
                    if self.follow(&leader).is_ok() {
                        continue;
                    }
                    return Err(unanswered.unwrap_or((addr, failed)));
                }
                // No leader to be had now: the caller waits and asks
                // again, starting elsewhere.
                Some(_) => {
                    if self.len() > 1 {
                        self.rotate_from(&addr);
                    }
                    return Err(unanswered.unwrap_or((addr, failed)));
                }
                None => {}
            }
            // Refused before anything was sent: nobody there. Silent,
            // reset or broken after sending: it may have done it.
            let refused = s.code() == Code::Unavailable && retry_after(s).is_none();
            let no_answer = matches!(
                s.code(),
                Code::Cancelled | Code::DeadlineExceeded | Code::Unknown
            );
            if refused || no_answer {
                tried.push(addr.clone());
                let first_silent = no_answer && unanswered.is_none();
                if self.next_untried(&tried) {
                    if first_silent {
                        unanswered = Some((addr, failed));
                    }
                    continue;
                }
                if first_silent {
                    return Err((addr, failed));
                }
            }
            return Err(unanswered.unwrap_or((addr, failed)));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::status::standby;

    type Answer = Result<&'static str, Status>;

    fn masters(addrs: &[&str]) -> Masters<String> {
        let addrs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
        Masters::new(&addrs, |a| Ok(a.to_string())).unwrap()
    }

    /// Calls `m` once, each master answering as `answer` says; the
    /// addresses asked, in order, and the outcome.
    fn run(m: &Masters<String>, answer: impl Fn(&str) -> Answer) -> (Vec<String>, Answer) {
        let asked = std::cell::RefCell::new(Vec::new());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let out = rt.block_on(m.at_leader(
            |s: &Status| Some(s),
            |addr: String| {
                asked.borrow_mut().push(addr.clone());
                let a = answer(&addr);
                async move { a }
            },
        ));
        (asked.into_inner(), out.map(|(_, v)| v).map_err(|(_, e)| e))
    }

    #[test]
    fn a_standby_sends_the_call_to_the_leader_and_later_calls_go_there_first() {
        let m = masters(&["a:1", "b:1"]);
        let answer = |addr: &str| match addr {
            "a:1" => Err(standby("standby", Some("b:1"), Duration::ZERO)),
            _ => Ok("done"),
        };
        let (asked, out) = run(&m, answer);
        assert_eq!(asked, ["a:1", "b:1"]);
        assert_eq!(out.unwrap(), "done");
        let (asked, _) = run(&m, answer);
        assert_eq!(asked, ["b:1"], "the leader is remembered");
    }

    #[test]
    fn a_leader_nobody_was_given_is_followed_too() {
        let m = masters(&["a:1"]);
        let (asked, out) = run(&m, |addr| match addr {
            "a:1" => Err(standby("standby", Some("c:9"), Duration::ZERO)),
            _ => Ok("done"),
        });
        assert_eq!(asked, ["a:1", "c:9"]);
        assert!(out.is_ok());
    }

    #[test]
    fn an_unreachable_master_is_passed_over_only_where_there_are_others() {
        let m = masters(&["a:1", "b:1", "c:1"]);
        let (asked, out) = run(&m, |addr| match addr {
            "c:1" => Ok("done"),
            _ => Err(Status::unavailable("connection refused")),
        });
        assert_eq!(asked, ["a:1", "b:1", "c:1"]);
        assert!(out.is_ok());
        let (asked, out) = run(&m, |_| Err(Status::unavailable("connection refused")));
        assert_eq!(asked.len(), 3, "each once: {asked:?}");
        assert!(out.is_err());
        let one = masters(&["a:1"]);
        let (asked, out) = run(&one, |_| Err(Status::unavailable("connection refused")));
        assert_eq!(asked, ["a:1"]);
        assert!(out.is_err());
    }

    #[test]
    fn without_a_leader_the_caller_waits_and_asks_another_master_next() {
        let m = masters(&["a:1", "b:1"]);
        let (asked, out) = run(&m, |_| {
            Err(standby("standby", None, Duration::from_millis(100)))
        });
        assert_eq!(asked, ["a:1"]);
        assert_eq!(
            retry_after(&out.unwrap_err()),
            Some(Duration::from_millis(100))
        );
        assert_eq!(m.current().0, "b:1");
    }

    #[test]
    fn standbys_naming_each_other_cannot_loop_a_call_forever() {
        let m = masters(&["a:1", "b:1"]);
        let (asked, out) = run(&m, |addr| {
            let other = if addr == "a:1" { "b:1" } else { "a:1" };
            Err(standby("standby", Some(other), Duration::ZERO))
        });
        assert!(asked.len() <= 4, "{asked:?}");
        assert!(out.is_err());
    }

    #[test]
    fn a_master_that_did_not_answer_in_time_is_not_asked_twice_in_one_call() {
        let m = masters(&["a:1", "b:1"]);
        let (asked, out) = run(&m, |addr| match addr {
            "a:1" => Err(Status::cancelled("Timeout expired")),
            _ => Err(standby("standby", Some("a:1"), Duration::ZERO)),
        });
        assert_eq!(asked, ["a:1", "b:1"]);
        let err = out.unwrap_err();
        assert_eq!(
            err.code(),
            Code::Cancelled,
            "the unanswered call's outcome, which nobody retries"
        );
        assert_eq!(retry_after(&err), None);
        // The next call asks the named leader again: it may answer now.
        let (asked, out) = run(&m, |_| Ok("done"));
        assert_eq!(asked, ["a:1"]);
        assert!(out.is_ok());
    }

    #[test]
    fn a_named_leader_that_went_away_gives_way_to_the_given_masters() {
        let m = masters(&["a:1"]);
        let (asked, _) = run(&m, |addr| match addr {
            "a:1" => Err(standby("standby", Some("c:9"), Duration::ZERO)),
            _ => Ok("done"),
        });
        assert_eq!(asked, ["a:1", "c:9"]);
        let (asked, out) = run(&m, |addr| match addr {
            "c:9" => Err(Status::unavailable("connection refused")),
            _ => Ok("done"),
        });
        assert_eq!(asked, ["c:9", "a:1"]);
        assert!(out.is_ok());
    }

    #[test]
    fn a_silent_master_is_never_asked_twice_even_with_named_leaders_known() {
        let m = masters(&["a:1"]);
        let _ = run(&m, |addr| match addr {
            "a:1" => Err(standby("standby", Some("c:9"), Duration::ZERO)),
            _ => Ok("done"),
        });
        let _ = run(&m, |addr| match addr {
            "c:9" => Err(Status::unavailable("connection refused")),
            _ => Ok("done"),
        });
        let (asked, out) = run(&m, |addr| match addr {
            "a:1" => Err(Status::cancelled("Timeout expired")),
            _ => Err(Status::unavailable("connection refused")),
        });
        assert_eq!(asked, ["a:1", "c:9"]);
        assert_eq!(out.unwrap_err().code(), Code::Cancelled);
        let (asked, out) = run(&m, |_| Err(Status::unknown("broken pipe")));
        assert_eq!(asked.len(), 2, "each once: {asked:?}");
        assert_eq!(
            out.unwrap_err().code(),
            Code::Unknown,
            "sent: outcome unknown"
        );
    }

    #[test]
    fn other_refusals_are_the_callers() {
        let m = masters(&["a:1", "b:1"]);
        let (asked, out) = run(&m, |_| Err(Status::not_found("no such allocation")));
        assert_eq!(asked, ["a:1"]);
        assert_eq!(out.unwrap_err().code(), Code::NotFound);
    }
}
