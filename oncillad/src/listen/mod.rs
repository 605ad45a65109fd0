//! Listener hardening shared by every server the daemon runs (the data
//! port, the map socket, the gRPC port): a small, separate budget for
//! connections that have not authenticated yet ([`pending`]), accept loops
//! that back off instead of spinning when the process runs out of file
//! descriptors or memory ([`backoff`]), and the gRPC port's connection
//! stream with both ([`incoming`]); and the authenticated connections,
//! counted ([`Place`]) or seated with idle ones giving way ([`seats`]),
//! and each user's share of them ([`users`]).
//!
//! It decides only whether a connection may exist and for how long before
//! it proves itself; it never reads a request, never checks a token and
//! never touches pool memory or the held table.

pub mod backoff;
pub mod ended;
pub mod incoming;
pub mod pending;
pub mod seats;
pub mod users;

pub use backoff::AcceptBackoff;
pub use pending::{Pending, Ticket};
pub use seats::{Seat, Seats};
pub use users::{UserPlace, Users};

use std::sync::atomic::{AtomicUsize, Ordering};

/// A place among a listener's authenticated connections: taken when the
/// handshake succeeds, given back on drop.
pub struct Place<'a>(&'a AtomicUsize);

impl<'a> Place<'a> {
    /// Takes a place if fewer than `max` are taken; otherwise `why`.
    ///
    /// # Errors
    /// `why`, when all `max` places are taken.
    pub fn take(
        live: &'a AtomicUsize,
        max: usize,
        why: &'static str,
    ) -> Result<Self, &'static str> {
        if live.fetch_add(1, Ordering::SeqCst) >= max {
            live.fetch_sub(1, Ordering::SeqCst);
            return Err(why);
        }
        Ok(Self(live))
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
