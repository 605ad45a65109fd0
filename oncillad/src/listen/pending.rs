//! The budget for connections still in their handshake: at most `max` of
//! them at once and at most `per_peer` from one address. A new connection
//! over either limit evicts the oldest one it competes with (same peer
//! first) that has not spoken (its whole hello neither read by its server
//! nor waiting in the socket), else the oldest whose hello its server has
//! not finished reading, else the oldest; so idle or dripping strangers can
//! fill the budget but never lock out a client that speaks at once.
//!
//! Eviction is a `shutdown(2)` of the socket through a duplicate of its
//! descriptor kept here: the thread or task serving it sees end-of-file and
//! ends by itself. It never closes the serving side's descriptor, never
//! reads or writes, and knows nothing of protocols.

use std::collections::VecDeque;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Connections that have not authenticated yet (see the module doc).
pub struct Pending {
    slots: Mutex<Slots>,
    max: usize,
    per_peer: usize,
    evicted: AtomicU64,
}

#[derive(Default)]
struct Slots {
    next: u64,
    list: VecDeque<Entry>,
}

struct Entry {
    id: u64,
    peer: Option<IpAddr>,
    /// Set once the connection's whole hello is in.
    heard: Arc<AtomicBool>,
    /// A duplicate of the connection's descriptor, for eviction.
    fd: OwnedFd,
}

/// A connection's place in the budget; dropping it (the connection
/// authenticated or ended) gives the place back.
pub struct Ticket {
    pending: Arc<Pending>,
    id: u64,
    heard: Arc<AtomicBool>,
}

impl Ticket {
    /// The connection's whole hello is in: from now it is evicted only
    /// when every competitor has spoken too (its server is checking it).
    pub fn heard(&self) {
        self.heard.store(true, Ordering::Relaxed);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut slots = self.pending.lock();
        if let Some(i) = slots.list.iter().position(|e| e.id == self.id) {
            slots.list.remove(i);
        }
    }
}

impl Pending {
    /// A budget of `max` connections, `per_peer` from one address (both at
    /// least 1).
    pub fn new(max: usize, per_peer: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Mutex::new(Slots::default()),
            max: max.max(1),
            per_peer: per_peer.clamp(1, max.max(1)),
            evicted: AtomicU64::new(0),
        })
    }

    /// Takes a place for the connection `sock` from `peer` (`None`: all
    /// connections count as one peer, as on a Unix socket), evicting the
    /// oldest competing connection when the budget is full.
    ///
    /// # Errors
    /// The descriptor cannot be duplicated (out of descriptors): the caller
    /// should drop the connection and back off.
    pub fn admit(self: &Arc<Self>, sock: impl AsFd, peer: Option<IpAddr>) -> io::Result<Ticket> {
        let fd = sock.as_fd().try_clone_to_owned()?;
        let mut slots = self.lock();
        let same = slots.list.iter().filter(|e| e.peer == peer).count();
        let competes = |e: &Entry| same < self.per_peer || e.peer == peer;
        let victim = if same >= self.per_peer || slots.list.len() >= self.max {
            // Only when full, so a scan (one `recv` peek per entry) is rare.
            // The oldest that has not spoken; else the oldest whose hello is
            // not complete (a dripper's byte may be waiting); else the oldest.
            let unheard = |e: &Entry| competes(e) && !e.heard.load(Ordering::Relaxed);
            let list = &slots.list;
            list.iter()
                .position(|e| unheard(e) && !has_bytes_waiting(&e.fd))
                .or_else(|| list.iter().position(unheard))
                .or_else(|| list.iter().position(competes))
        } else {
            None
        };
        if let Some(old) = victim.and_then(|i| slots.list.remove(i)) {
            self.evicted.fetch_add(1, Ordering::Relaxed);
            // An error means the socket is already shut or gone: nothing to do.
            let _ =
                nix::sys::socket::shutdown(old.fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
        let id = slots.next;
        slots.next += 1;
        let heard = Arc::new(AtomicBool::new(false));
        slots.list.push_back(Entry {
            id,
            peer,
            heard: Arc::clone(&heard),
            fd,
        });
        Ok(Ticket {
            pending: Arc::clone(self),
            id,
            heard,
        })
    }

    /// Connections holding a place now.
    pub fn len(&self) -> usize {
        self.lock().list.len()
    }

    /// Whether no connection holds a place.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connections evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        // The list holds only descriptors; a panic elsewhere cannot leave it inconsistent.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether the peer has sent bytes its connection's server has not read
/// yet (a client's hello that its thread has not got to).
pub(crate) fn has_bytes_waiting(fd: &OwnedFd) -> bool {
    use nix::sys::socket::{recv, MsgFlags};
    let mut byte = [0u8; 1];
    matches!(
        recv(fd.as_raw_fd(), &mut byte, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT),
        Ok(n) if n > 0
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    #[test]
    fn a_full_budget_evicts_the_oldest_and_frees_places_on_drop() {
        let pending = Pending::new(2, 2);
        let (a, mut a_peer) = pair();
        let (b, _b_peer) = pair();
        let (c, _c_peer) = pair();
        let ta = pending.admit(&a, None).unwrap();
        let tb = pending.admit(&b, None).unwrap();
        assert_eq!(pending.len(), 2);
        let _tc = pending.admit(&c, None).unwrap();
        assert_eq!(pending.len(), 2);
        assert_eq!(pending.evicted(), 1);
        // The oldest was shut down: its peer sees end-of-file.
        let mut buf = [0u8; 1];
        assert_eq!(a_peer.read(&mut buf).unwrap(), 0);
        drop(ta); // already evicted: nothing to remove
        drop(tb);
        assert_eq!(pending.len(), 1);
    }

    /// Two connections admitted to a budget of two; `speak` makes the
    /// older one count as spoken; a third arrives: the silent one must be
    /// evicted and the one that spoke kept (`what` names how it spoke).
    fn spoken_is_spared(what: &str, speak: impl FnOnce(&Ticket, &mut UnixStream)) {
        let pending = Pending::new(2, 2);
        let (a, mut a_peer) = pair();
        let (b, mut b_peer) = pair();
        let (c, _c_peer) = pair();
        let ta = pending.admit(&a, None).unwrap();
        let _tb = pending.admit(&b, None).unwrap();
        speak(&ta, &mut a_peer);
        let _tc = pending.admit(&c, None).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(
            b_peer.read(&mut buf).unwrap(),
            0,
            "the silent one was evicted"
        );
        a_peer.set_nonblocking(true).unwrap();
        let a_open =
            matches!(a_peer.read(&mut buf), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
        assert!(a_open, "the one that {what} was evicted");
    }

    #[test]
    fn a_connection_that_has_spoken_is_spared() {
        // The oldest has its hello waiting in its socket.
        spoken_is_spared("spoke", |_, peer| {
            std::io::Write::write_all(peer, b"OCLD").unwrap();
        });
    }

    #[test]
    fn a_connection_whose_hello_was_read_is_spared() {
        // Nothing waits in its socket, but its server has read its hello.
        spoken_is_spared("was heard", |ticket, _| ticket.heard());
    }

    #[test]
    fn one_peer_evicts_only_its_own_connections() {
        let pending = Pending::new(8, 2);
        let ip = |n: u8| Some(IpAddr::from([10, 0, 0, n]));
        let socks: Vec<_> = (0..4).map(|_| pair()).collect();
        let _other = pending.admit(&socks[0].0, ip(2)).unwrap();
        let _t: Vec<_> = socks[1..]
            .iter()
            .map(|(s, _)| pending.admit(s, ip(1)).unwrap())
            .collect();
        assert_eq!(pending.len(), 3, "peer 1 keeps at most 2 places");
        assert_eq!(pending.evicted(), 1);
        let mut buf = [0u8; 1];
        socks[0].1.set_nonblocking(true).unwrap();
        let still_open =
            matches!((&socks[0].1).read(&mut buf), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
        assert!(still_open, "another peer's connection was evicted");
    }
}
