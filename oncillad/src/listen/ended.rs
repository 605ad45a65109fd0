//! Sessions of this node that ended: their credentials stop working here
//! at once (elsewhere they stop at their expiry, which the agent no longer
//! renews), and the data and map connections they opened here are shut.
//!
//! An ended session is remembered for as long as a credential it was
//! given could still be good (the credential lifetime and the clock skew),
//! at most [`MAX_ENDED`] of them (the oldest forgotten first: theirs then
//! stop at their expiry). Connections of sessions register with
//! [`Ended::admit`] and leave on drop; ending a session shuts the socket
//! of each (a duplicate descriptor kept here: the thread serving it sees
//! end-of-file and ends by itself). It never reads or writes a socket.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most ended sessions remembered.
pub const MAX_ENDED: usize = 1 << 20;

/// This node's ended sessions and the open connections of its sessions.
pub struct Ended {
    keep: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Ended sessions, oldest first, with when they ended.
    order: VecDeque<(Instant, String)>,
    ended: HashMap<String, Instant>,
    /// Open connections by session: (registration id, duplicate socket).
    open: HashMap<String, Vec<(u64, OwnedFd)>>,
    next: u64,
}

/// A connection's registration under its session; leaves on drop.
pub struct Registered {
    ended: Arc<Ended>,
    session: String,
    id: u64,
}

impl Ended {
    /// Remembers ended sessions as long as a credential good for
    /// `lifetime` may still be presented (its lifetime and the clock skew
    /// allowed past it).
    pub fn for_credentials(lifetime: Duration) -> Arc<Self> {
        Self::new(lifetime + oncilla_net::credential::CLOCK_SKEW)
    }

    /// Remembers ended sessions for `keep`.
    pub fn new(keep: Duration) -> Arc<Self> {
        Arc::new(Self {
            keep,
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Maps of ids and descriptors; a panic cannot leave them invalid.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Session `id` ended: refuse its credential from now on and shut its
    /// open connections.
    pub fn end(&self, id: &str) {
        let now = Instant::now();
        let mut st = self.lock();
        while let Some((at, _)) = st.order.front() {
            if now.duration_since(*at) < self.keep && st.order.len() < MAX_ENDED {
                break;
            }
            if let Some((_, old)) = st.order.pop_front() {
                st.ended.remove(&old);
            }
        }
        if st.ended.insert(id.to_string(), now).is_none() {
            st.order.push_back((now, id.to_string()));
        }
        let open = st.open.remove(id).unwrap_or_default();
        drop(st);
        for (_, fd) in open {
            // An error means the socket is already shut or gone.
            let _ = nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
    }

    /// Whether session `id` ended here (and is still remembered).
    pub fn has_ended(&self, id: &str) -> bool {
        self.ended_in(&self.lock(), id)
    }

    /// [`Ended::has_ended`] under the caller's lock.
    fn ended_in(&self, st: &State, id: &str) -> bool {
        st.ended.get(id).is_some_and(|at| at.elapsed() < self.keep)
    }

    /// Registers `conn`, a connection of session `id`, to be shut when the
    /// session ends.
    ///
    /// # Errors
    /// The session ended already ("session ended"), or the descriptor
    /// cannot be duplicated.
    pub fn admit(self: &Arc<Self>, id: &str, conn: impl AsFd) -> Result<Registered, &'static str> {
        let fd = conn
            .as_fd()
            .try_clone_to_owned()
            .map_err(|_| "out of descriptors")?;
        // Checked and registered under one lock, so an end in between
        // cannot miss the connection.
        let mut st = self.lock();
        if self.ended_in(&st, id) {
            return Err("permission denied: the session of this credential has ended");
        }
        let reg = st.next;
        st.next += 1;
        st.open.entry(id.to_string()).or_default().push((reg, fd));
        Ok(Registered {
            ended: Arc::clone(self),
            session: id.to_string(),
            id: reg,
        })
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut st = self.ended.lock();
        if let Some(list) = st.open.get_mut(&self.session) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                st.open.remove(&self.session);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    #[test]
    fn an_ended_session_is_refused_and_its_connections_shut() {
        let ended = Ended::new(Duration::from_secs(60));
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (other, mut other_peer) = UnixStream::pair().unwrap();
        let _reg = ended.admit("n-1", &ours).unwrap();
        let _kept = ended.admit("n-2", &other).unwrap();
        ended.end("n-1");
        let mut b = [0u8; 1];
        assert_eq!(theirs.read(&mut b).unwrap(), 0, "shut at the end");
        assert!(ended.admit("n-1", &ours).is_err());
        other_peer.set_nonblocking(true).unwrap();
        assert!(
            other_peer.read(&mut b).is_err(),
            "another session's stays open"
        );
        assert!(ended.admit("n-2", &other).is_ok());
    }

    #[test]
    fn ended_sessions_are_forgotten_after_they_could_matter() {
        let ended = Ended::new(Duration::ZERO);
        ended.end("n-1");
        assert!(!ended.has_ended("n-1"));
        ended.end("n-2");
        assert_eq!(ended.lock().order.len(), 1, "the first was dropped");
    }
}
