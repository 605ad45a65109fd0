//! What an accept loop does when `accept` fails: out of descriptors or
//! memory (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM` and anything else it
//! does not know to be harmless) it waits, doubling from [`MIN_PAUSE`] to
//! [`MAX_PAUSE`], so the pending connection that caused the error is not
//! retried in a tight loop; a connection that died in the queue
//! (`ECONNABORTED`, `EINTR`, ...) is skipped at once. It logs at most once
//! per [`LOG_EVERY`], with the number of failures it kept quiet about.
//!
//! It only decides how long to wait and when to log; the loop sleeps (a
//! thread or a timer) and accepts.

use std::io;
use std::time::{Duration, Instant};

/// First pause after a resource error.
pub const MIN_PAUSE: Duration = Duration::from_millis(10);
/// Longest pause between accepts while errors go on.
pub const MAX_PAUSE: Duration = Duration::from_secs(1);
/// At most one log line per this long per listener.
pub const LOG_EVERY: Duration = Duration::from_secs(1);

/// One accept loop's error state.
pub struct AcceptBackoff {
    what: &'static str,
    pause: Duration,
    quiet: u64,
    last_log: Option<Instant>,
}

impl AcceptBackoff {
    /// For the listener named `what` ("data", "map", "gRPC").
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            pause: Duration::ZERO,
            quiet: 0,
            last_log: None,
        }
    }

    /// An accept succeeded: the next error starts from the shortest pause.
    pub fn ok(&mut self) {
        self.pause = Duration::ZERO;
    }

    /// Records a failed accept (or a failure to take on an accepted
    /// connection); returns how long to wait before accepting again.
    pub fn failed(&mut self, e: &io::Error) -> Duration {
        self.failed_at(e, Instant::now())
    }

    fn failed_at(&mut self, e: &io::Error, now: Instant) -> Duration {
        let pause = if transient(e) {
            Duration::ZERO
        } else {
            self.pause = (self.pause * 2).clamp(MIN_PAUSE, MAX_PAUSE);
            self.pause
        };
        if self
            .last_log
            .is_none_or(|t| now.saturating_duration_since(t) >= LOG_EVERY)
        {
            tracing::warn!(
                listener = self.what,
                error = %e,
                suppressed = self.quiet,
                pause_ms = pause.as_millis(),
                "{} accept failed ({} more failures not logged since the last line); pausing {} ms",
                self.what,
                self.quiet,
                pause.as_millis()
            );
            self.last_log = Some(now);
            self.quiet = 0;
        } else {
            self.quiet += 1;
        }
        pause
    }
}

/// Errors that concern one queued connection only, not the process: the
/// next accept may well succeed.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EINTR
                | libc::EAGAIN
                | libc::EPROTO
                | libc::EPERM
                | libc::ENETDOWN
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::EOPNOTSUPP
                | libc::ENETUNREACH
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_errors_back_off_doubling_to_a_bound_and_reset_on_success() {
        let mut b = AcceptBackoff::new("test");
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        let t = Instant::now();
        let pauses: Vec<_> = (0..10).map(|_| b.failed_at(&emfile, t)).collect();
        assert_eq!(pauses[0], MIN_PAUSE);
        assert_eq!(pauses[1], MIN_PAUSE * 2);
        assert!(pauses.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*pauses.last().unwrap(), MAX_PAUSE);
        b.ok();
        assert_eq!(b.failed_at(&emfile, t), MIN_PAUSE);
    }

    #[test]
    fn a_dead_queued_connection_is_skipped_at_once() {
        let mut b = AcceptBackoff::new("test");
        let aborted = io::Error::from_raw_os_error(libc::ECONNABORTED);
        assert_eq!(b.failed(&aborted), Duration::ZERO);
    }

    #[test]
    fn logs_once_per_interval_and_counts_the_rest() {
        let mut b = AcceptBackoff::new("test");
        let e = io::Error::from_raw_os_error(libc::ENFILE);
        let t = Instant::now();
        b.failed_at(&e, t);
        for _ in 0..1000 {
            b.failed_at(&e, t + Duration::from_millis(10));
        }
        assert_eq!(b.quiet, 1000);
        b.failed_at(&e, t + LOG_EVERY);
        assert_eq!(
            b.quiet, 0,
            "a line after the interval reports and resets the count"
        );
    }
}
