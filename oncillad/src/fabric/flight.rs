//! Memory files in flight on map connections: sent with `SCM_RIGHTS` and
//! not yet taken by the process they were sent to.
//!
//! The kernel counts every descriptor in flight over Unix sockets against
//! the *sending* user and refuses more (`ETOOMANYREFS`) once that count
//! passes the sender's open-file limit: a process that asks for grants and
//! never reads them would otherwise stop the agent from sending anyone a
//! file. So each grant's files are charged to the user they go to before
//! they are sent ([`Flight::charge`]: a user holds at most an eighth of the
//! limit, users together three eighths, everyone half of it) and given back only once the
//! socket shows that the process took them, or went away
//! ([`wait_taken`]). This module only counts and watches a socket's send
//! queue; it never sends, reads or closes.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Files in flight: everyone's, and each user's (operators, with no
/// user, count only in the total).
#[derive(Debug, Default)]
pub struct Flight {
    held: Mutex<(usize, HashMap<u32, usize>)>,
}

/// Files charged to one grant; given back on drop.
#[derive(Debug)]
pub struct Charge {
    flight: Arc<Flight>,
    user: Option<u32>,
    files: usize,
}

impl Flight {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Charges `files` about to be sent to `user`'s process, against
    /// budgets taken from the open-file limit in force now (the kernel's
    /// own bound on what this process may have in flight).
    ///
    /// # Errors
    /// What the refusal tells the process: the user's share, or everyone's
    /// budget, would be passed.
    pub fn charge(self: &Arc<Self>, user: Option<u32>, files: usize) -> Result<Charge, String> {
        let limit = crate::pool::open_file_limit();
        self.charge_within(user, files, limit)
    }

    fn charge_within(
        self: &Arc<Self>,
        user: Option<u32>,
        files: usize,
        limit: usize,
    ) -> Result<Charge, String> {
        // Users together take at most three quarters of the budget, so
        // operators always have room.
        let (total_max, users_max, share) = (limit / 2, limit * 3 / 8, limit / 8);
        if files > share {
            return Err(format!(
                "this extent has {files} memory files, more than one user may have in flight \
                 at once ({share}, an eighth of the agent's open-file limit); raise the \
                 agent's LimitNOFILE"
            ));
        }
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let (total, users) = &mut *held;
        let by_users: usize = users.values().sum();
        if *total + files > total_max || (user.is_some() && by_users + files > users_max) {
            return Err(format!(
                "this node has {total} memory files in flight to processes that have not \
                 taken them yet, {files} more would pass its budget; retry shortly"
            ));
        }
        if let Some(uid) = user {
            let mine = users.entry(uid).or_default();
            if *mine + files > share {
                let now = *mine;
                if now == 0 {
                    users.remove(&uid);
                }
                return Err(format!(
                    "uid {uid} has {now} memory files in flight (sent to its processes and not \
                     taken yet), {files} more would pass its share ({share}); read the grants \
                     already asked for, or close those map connections"
                ));
            }
            *mine += files;
        }
        *total += files;
        Ok(Charge {
            flight: Arc::clone(self),
            user,
            files,
        })
    }

    /// Files in flight to `uid`'s processes now.
    #[cfg(test)]
    fn of(&self, uid: u32) -> usize {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.1.get(&uid).copied().unwrap_or(0)
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut held = self.flight.held.lock().unwrap_or_else(|e| e.into_inner());
        let (total, users) = &mut *held;
        *total -= self.files;
        if let Some(uid) = self.user {
            if let Some(n) = users.get_mut(&uid) {
                *n -= self.files;
                if *n == 0 {
                    users.remove(&uid);
                }
            }
        }
    }
}

/// Longest pause between two looks at the send queue.
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// Returns once the peer of `stream` has taken every byte (and every file)
/// sent on it, or has gone away (its unread bytes, files included, are
/// dropped then): the send queue of a Unix stream socket holds what the
/// peer has not read. Looks again after a pause that doubles up to
/// [`MAX_PAUSE`]: a process that never reads holds its charge, and this
/// thread, for as long as it keeps the connection, both within its share.
///
/// # Errors
/// The queue cannot be read (the socket is broken).
pub fn wait_taken(stream: &UnixStream) -> io::Result<()> {
    let mut pause = Duration::from_micros(20);
    loop {
        let mut queued: libc::c_int = 0;
        // SIOCOUTQ (what the peer has not read) is TIOCOUTQ's number.
        // SAFETY: SIOCOUTQ writes one c_int through the pointer, which
        // points at `queued`, alive for the call; the fd is open (borrowed
        // from `stream`).
        let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        if queued == 0 {
            return Ok(());
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_user_holds_its_share_and_everyone_the_budget() {
        let flight = Flight::new();
        // Limit 800: everyone 400, a user 100.
        let a = flight.charge_within(Some(1), 60, 800).unwrap();
        let err = flight.charge_within(Some(1), 41, 800).unwrap_err();
        assert!(
            err.contains("uid 1 has 60") && err.contains("share (100)"),
            "{err}"
        );
        let _b = flight.charge_within(Some(1), 40, 800).unwrap();
        let _c = flight.charge_within(Some(2), 100, 800).unwrap();
        // Users together: three quarters of the budget (300 of 400).
        let _d = flight.charge_within(Some(3), 100, 800).unwrap();
        let err = flight.charge_within(Some(4), 1, 800).unwrap_err();
        assert!(err.contains("would pass its budget"), "{err}");
        // Operators keep the rest.
        let _op = flight.charge_within(None, 100, 800).unwrap();
        assert!(flight.charge_within(None, 1, 800).is_err());
        // A grant larger than a share is refused for good, and says so.
        let err = flight.charge_within(Some(9), 101, 800).unwrap_err();
        assert!(
            err.contains("more than one user may have in flight"),
            "{err}"
        );
        drop(a);
        assert_eq!(flight.of(1), 40);
        let _e = flight.charge_within(Some(4), 1, 800).expect("given back");
        assert_eq!(flight.of(9), 0, "a refused user holds nothing");
    }

    #[test]
    fn what_the_peer_reads_or_drops_is_taken() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        (&ours).write_all(b"grant").unwrap();
        let waiter = std::thread::spawn(move || wait_taken(&ours).map(|()| ours));
        let mut got = [0u8; 5];
        theirs.read_exact(&mut got).unwrap();
        let ours = waiter.join().unwrap().unwrap();
        // Unread bytes are dropped with the peer's socket.
        (&ours).write_all(b"never read").unwrap();
        drop(theirs);
        wait_taken(&ours).unwrap();
    }
}
