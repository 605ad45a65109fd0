//! The authenticated connections of one listener: at most `max` at once.
//! When all seats are taken, a newcomer gets the seat of a connection that
//! sits idle (between requests, nothing waiting to be read, and no request
//! begun for at least [`MIN_IDLE`] as far as the seats have seen), which
//! is shut down; only when none is idle is it refused. The last
//! `reserve` seats are for members (operators with the cluster token):
//! users count against the others and never take one of the reserve's
//! (an idle member's seat past the reserve is anyone's), so the operator
//! can always connect. So no principal can hold every seat with connections
//! it never uses, and a client whose pooled connection was taken this way
//! opens another (liboncilla replaces a pooled connection that fails
//! before its first reply).
//!
//! The serving side marks each request's beginning and end: two relaxed
//! atomic stores per request, no system call. The seats compare what they
//! saw last time they looked, so a connection in the middle of a copy
//! (between pipelined requests) is never taken for idle. Eviction is a `shutdown(2)`
//! through a duplicate descriptor kept here, as in [`super::pending`]. It
//! never reads or writes a connection and knows nothing of requests.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::pending::has_bytes_waiting;

/// A connection counts as idle once no request has begun on it for this
/// long (from when it was seated, or when the seats last saw it active).
pub const MIN_IDLE: Duration = Duration::from_secs(1);

/// Seats for authenticated connections (see the module doc).
pub struct Seats {
    slots: Mutex<Vec<Slot>>,
    max: usize,
    /// Of `max`, seats only members take while they are free.
    reserve: usize,
    next: AtomicU64,
    evicted: AtomicU64,
}

struct Slot {
    id: u64,
    fd: OwnedFd,
    /// A member's (an operator's): users never take its seat.
    member: bool,
    /// Requests begun, times two, plus one while one is being served.
    state: Arc<AtomicU64>,
    /// `state` when last looked at, and when that was (or seating time).
    seen: u64,
    seen_at: Instant,
}

/// One connection's seat; dropping it frees the seat.
pub struct Seat {
    seats: Arc<Seats>,
    id: u64,
    state: Arc<AtomicU64>,
    begun: u64,
}

impl Seat {
    /// A request begins.
    #[inline]
    pub fn begin(&mut self) {
        self.begun = self.begun.wrapping_add(1);
        self.state.store(self.begun << 1 | 1, Ordering::Relaxed);
    }

    /// The request is answered.
    #[inline]
    pub fn end(&self) {
        self.state.store(self.begun << 1, Ordering::Relaxed);
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut slots = self.seats.lock();
        if let Some(i) = slots.iter().position(|s| s.id == self.id) {
            slots.swap_remove(i);
        }
    }
}

impl Seats {
    /// `max` seats (at least 1), the last `reserve` of them (less than
    /// `max`) for members.
    pub fn new(max: usize, reserve: usize) -> Arc<Self> {
        let max = max.max(1);
        Arc::new(Self {
            slots: Mutex::new(Vec::new()),
            max,
            reserve: reserve.min(max - 1),
            next: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        })
    }

    /// Seats the connection `fd` (a duplicate of its descriptor, kept for
    /// eviction) of a member or not, taking an idle connection's seat when
    /// all it may take are taken.
    ///
    /// # Errors
    /// `why`, when every seat it may take is in use.
    pub fn take(
        self: &Arc<Self>,
        fd: OwnedFd,
        member: bool,
        why: &'static str,
    ) -> Result<Seat, &'static str> {
        let mut slots = self.lock();
        // Users count against all seats but the reserve, operators against
        // all of them; a user takes only a user's idle seat.
        let users = slots.iter().filter(|s| !s.member).count();
        // Operators' seats past the reserve are anyone's once idle.
        let spare_members = slots.len() - users > self.reserve;
        let full = if member {
            slots.len() >= self.max
        } else {
            users >= self.max - self.reserve || slots.len() >= self.max
        };
        if full {
            let now = Instant::now();
            let mut idle = None;
            for (i, s) in slots.iter_mut().enumerate() {
                let state = s.state.load(Ordering::Relaxed);
                if state != s.seen {
                    // Active since we last looked: not idle, note when.
                    s.seen = state;
                    s.seen_at = now;
                } else if idle.is_none()
                    && (member || !s.member || spare_members)
                    && state & 1 == 0
                    && now.saturating_duration_since(s.seen_at) >= MIN_IDLE
                    && !has_bytes_waiting(&s.fd)
                {
                    idle = Some(i);
                }
            }
            let Some(i) = idle else {
                return Err(why);
            };
            let old = slots.swap_remove(i);
            self.evicted.fetch_add(1, Ordering::Relaxed);
            // An error means the socket is already shut or gone: nothing to do.
            let _ =
                nix::sys::socket::shutdown(old.fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(AtomicU64::new(0));
        slots.push(Slot {
            id,
            fd,
            member,
            state: Arc::clone(&state),
            seen: 0,
            seen_at: Instant::now(),
        });
        Ok(Seat {
            seats: Arc::clone(self),
            id,
            state,
            begun: 0,
        })
    }

    /// Seats taken now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no seat is taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connections evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        // The list holds only descriptors and flags; a panic elsewhere
        // cannot leave it inconsistent.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    fn dup(s: &UnixStream) -> OwnedFd {
        std::os::fd::AsFd::as_fd(s).try_clone_to_owned().unwrap()
    }

    #[test]
    fn a_full_house_gives_an_idle_seat_and_keeps_busy_and_new_ones() {
        let seats = Seats::new(2, 0);
        let (a, mut a_peer) = pair();
        let (b, mut b_peer) = pair();
        let (c, _c_peer) = pair();
        let mut sa = seats.take(dup(&a), false, "full").unwrap();
        let sb = seats.take(dup(&b), false, "full").unwrap();
        // Both new: nobody gives up a seat yet.
        assert_eq!(seats.take(dup(&c), false, "full").err(), Some("full"));
        std::thread::sleep(MIN_IDLE);
        // `a` is inside a request, `b` idle: `b` goes.
        sa.begin();
        let _sc = seats.take(dup(&c), false, "full").unwrap();
        assert_eq!(seats.len(), 2);
        assert_eq!(seats.evicted(), 1);
        let mut buf = [0u8; 1];
        assert_eq!(
            b_peer.read(&mut buf).unwrap(),
            0,
            "the idle one was shut down"
        );
        a_peer.set_nonblocking(true).unwrap();
        assert!(a_peer.read(&mut buf).is_err(), "the busy one is still open");
        // `a` answered its request just now: not idle yet, so the next
        // newcomer is refused.
        sa.end();
        let (d, _d_peer) = pair();
        assert_eq!(seats.take(dup(&d), false, "full").err(), Some("full"));
        drop(sb); // already evicted: nothing to remove
        assert_eq!(seats.len(), 2);
        drop(sa);
        assert_eq!(seats.len(), 1);
    }

    #[test]
    fn the_last_seats_are_kept_for_members() {
        let seats = Seats::new(3, 1);
        let conns: Vec<_> = (0..4).map(|_| pair()).collect();
        let mut u1 = seats.take(dup(&conns[0].0), false, "full").unwrap();
        let mut u2 = seats.take(dup(&conns[1].0), false, "full").unwrap();
        // Users have taken all theirs (none idle yet): the reserve stays.
        let user = |i: usize| seats.take(dup(&conns[i].0), false, "full");
        assert_eq!(user(2).err(), Some("full"));
        let op = seats
            .take(dup(&conns[2].0), true, "full")
            .expect("the operator's seat");
        assert_eq!(seats.len(), 3);
        // The operator's seat, idle, still goes to no user; a user's idle
        // seat does.
        std::thread::sleep(MIN_IDLE);
        u1.begin();
        let _u3 = user(3).expect("u2 was idle: its seat went");
        u2.begin();
        let (e, _e_peer) = pair();
        assert_eq!(
            seats.take(dup(&e), false, "full").err(),
            Some("full"),
            "only the operator's is idle"
        );
        drop(op);
    }
}
