//! Local applications' sessions on this agent: opening one, who is behind
//! it (as the master records owners), what it is attached to, and the
//! queue of ended sessions the membership loop reports until the master
//! acknowledges them. Never frees memory itself: the master decides.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use oncilla_model::alloc::Owner;

use super::Agent;
use crate::error::CoreError;

/// A local application's session.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub id: String,
    pub pid: u32,
    pub program: String,
    /// The process's user, as the Unix socket saw it (`None` where the
    /// kernel did not say).
    pub uid: Option<u32>,
    /// Order of opening within this agent incarnation.
    pub seq: u64,
    /// Persistent allocations the session is attached to.
    pub attached: BTreeSet<u64>,
}

/// Most sessions one user may have open on one agent: each costs the
/// agent memory (about 12 kB) and a line in every registration.
pub const MAX_SESSIONS_PER_USER: usize = 1024;

impl Agent {
    /// Registers a new local session of process `pid`, user `uid`.
    ///
    /// # Errors
    /// [`CoreError::TooManySessions`] when the user has
    /// [`MAX_SESSIONS_PER_USER`] open here.
    pub fn open_session(
        &self,
        pid: u32,
        uid: Option<u32>,
        program: String,
    ) -> Result<SessionInfo, CoreError> {
        if let Some(uid) = uid {
            let open = self.sessions.iter().filter(|s| s.uid == Some(uid)).count();
            if open >= MAX_SESSIONS_PER_USER {
                return Err(CoreError::TooManySessions { uid, open });
            }
        }
        let seq = self.next_session.fetch_add(1, Ordering::SeqCst);
        let id = oncilla_model::alloc::session_id(&self.node.name, uid, rand::random::<u64>());
        let info = SessionInfo {
            id,
            pid,
            program,
            uid,
            seq,
            attached: BTreeSet::new(),
        };
        self.sessions.insert(info.id.clone(), info.clone());
        tracing::info!(session = %info.id, pid, program = %info.program, "session opened");
        Ok(info)
    }

    /// The process behind an open session, as the master records it.
    ///
    /// # Errors
    /// [`CoreError::NoSuchSession`].
    pub fn owner(&self, session_id: &str) -> Result<Owner, CoreError> {
        let s = self.session(session_id)?;
        Ok(self.owner_of(&s))
    }

    pub(super) fn owner_of(&self, s: &SessionInfo) -> Owner {
        Owner {
            session_id: s.id.clone(),
            node: self.node.name.clone(),
            pid: s.pid,
            program: s.program.clone(),
            agent_incarnation: self.incarnation,
            session_seq: s.seq,
            uid: s.uid,
        }
    }

    /// Notes that a session attached to (or, with `attached` false, left)
    /// a persistent allocation.
    pub fn note_attached(&self, session_id: &str, alloc_id: u64, attached: bool) {
        if let Some(mut s) = self.sessions.get_mut(session_id) {
            if attached {
                s.attached.insert(alloc_id);
            } else {
                s.attached.remove(&alloc_id);
            }
        }
    }

    /// A session's stream closed: forget it and queue the news for the
    /// master (delivered by the membership loop until acknowledged).
    pub fn end_session(&self, id: &str) {
        self.sessions.remove(id);
        // Its credential stops here at once, and its connections close.
        self.ended_here.end(id);
        self.ended_lock().push(id.to_string());
        self.wake.notify_one();
    }

    /// This node's ended sessions, as its listeners check them.
    pub fn ended_here(&self) -> std::sync::Arc<crate::listen::ended::Ended> {
        std::sync::Arc::clone(&self.ended_here)
    }

    /// How long the session credentials this agent gives are good for.
    pub fn credential_lifetime(&self) -> std::time::Duration {
        self.credential_lifetime
    }

    /// Ended sessions not yet acknowledged by the master.
    pub fn ended_sessions(&self) -> Vec<String> {
        self.ended_lock().clone()
    }

    /// The master has processed these ended sessions.
    pub fn ack_ended(&self, done: &[String]) {
        self.ended_lock().retain(|s| !done.contains(s));
    }

    /// Resolves when something must be told to the master now.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    fn ended_lock(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        // A list of ids; a panic while it is held cannot leave it invalid.
        self.ended.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Looks up an open session.
    ///
    /// # Errors
    /// [`CoreError::NoSuchSession`].
    pub fn session(&self, id: &str) -> Result<SessionInfo, CoreError> {
        self.sessions
            .get(id)
            .map(|s| s.value().clone())
            .ok_or_else(|| CoreError::NoSuchSession(id.to_string()))
    }

    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }
}
