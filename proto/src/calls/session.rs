//! The `Session` service an application calls on its node's agent, over
//! the agent's Unix socket: opening the session and its allocations.

use oncilla_model::alloc::{AllocRef, AllocSpec, Allocation};

use super::{read, CallError, Malformed};
use crate::client::{self, AuthChannel, SessionClient};
use crate::convert::WireError;
use crate::pb;

/// A session service, called in domain values. Cheap to clone.
#[derive(Clone)]
pub struct Session(SessionClient);

const PEER: &str = "agent";

/// One event of an open session: the first names it and hands over its
/// credential (and the cluster CA where the cluster speaks TLS); later ones
/// bring fresh credentials.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionEvent {
    pub session_id: String,
    pub node: String,
    /// The session's credential; empty when this event brings none.
    pub credential: String,
    /// The cluster CA (PEM); empty: the cluster speaks plain TCP.
    pub tls_ca: Vec<u8>,
}

/// An open session's events. The session lasts while this is held: its
/// end is how the agent learns that the application is gone.
pub struct SessionEvents(tonic::Streaming<pb::SessionEvent>);

impl SessionEvents {
    /// The next event; `None` once the agent closed the stream.
    ///
    /// # Errors
    /// The stream broke.
    pub async fn next(&mut self) -> Option<Result<SessionEvent, tonic::Status>> {
        self.0.message().await.transpose().map(|e| {
            e.map(|e| SessionEvent {
                session_id: e.session_id,
                node: e.node,
                credential: e.credential,
                tls_ca: e.tls_ca,
            })
        })
    }
}

impl Session {
    /// The agent's session service at the other end of `channel`.
    pub fn new(channel: AuthChannel) -> Self {
        Self(client::session(channel))
    }

    /// Opens a session for process `pid` running `program`.
    ///
    /// # Errors
    /// [`CallError`] (a wrong token included).
    pub async fn open(&self, pid: u32, program: String) -> Result<SessionEvents, CallError> {
        let open = pb::OpenRequest { pid, program };
        Ok(SessionEvents(self.0.clone().open(open).await?.into_inner()))
    }

    /// An allocation for session `session_id` as `spec` says.
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn alloc(&self, session_id: &str, spec: &AllocSpec) -> Result<Allocation, CallError> {
        let req = pb::AllocRequest {
            session_id: session_id.to_string(),
            spec: Some(spec.clone().into()),
        };
        let a = self.0.clone().alloc(req).await?;
        read(PEER, "allocation", a.into_inner())
    }

    /// `count` allocations for session `session_id`, each as `spec` says
    /// (no name, not persistent), made together: all or none. In the
    /// order they were made.
    ///
    /// # Errors
    /// [`CallError`]; a reply with another number of allocations than
    /// asked is malformed.
    pub async fn alloc_many(
        &self,
        session_id: &str,
        spec: &AllocSpec,
        count: u32,
    ) -> Result<Vec<Allocation>, CallError> {
        let req = pb::AllocManyRequest {
            session_id: session_id.to_string(),
            spec: Some(spec.clone().into()),
            count: u64::from(count),
        };
        let batch = self.0.clone().alloc_many(req).await?.into_inner();
        if batch.allocations.len() != count as usize {
            return Err(Malformed {
                peer: PEER,
                what: "allocation batch",
                error: WireError::Count {
                    what: "allocations",
                    asked: count as usize,
                    got: batch.allocations.len(),
                },
            }
            .into());
        }
        batch
            .allocations
            .into_iter()
            .map(|a| read(PEER, "allocation", a))
            .collect()
    }

    /// Attaches a persistent allocation (by id or name) to the session.
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn attach(
        &self,
        session_id: &str,
        alloc: &AllocRef,
    ) -> Result<Allocation, CallError> {
        let req = pb::AttachRequest {
            session_id: session_id.to_string(),
            alloc: Some(alloc.clone().into()),
        };
        let a = self.0.clone().attach(req).await?;
        read(PEER, "allocation", a.into_inner())
    }

    /// Frees allocation `alloc` of the session (`force`: even while other
    /// processes are attached).
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn free(
        &self,
        session_id: &str,
        alloc: &AllocRef,
        force: bool,
    ) -> Result<(), CallError> {
        let req = pb::FreeRequest {
            alloc: Some(alloc.clone().into()),
            session_id: session_id.to_string(),
            force,
            requester: None,
        };
        self.0.clone().free(req).await?;
        Ok(())
    }

    /// Frees `ids` (1 to 256, distinct) together, all or none: the
    /// session's own, or persistent ones it may free that no other
    /// process is attached to.
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn free_many(&self, session_id: &str, ids: &[u64]) -> Result<(), CallError> {
        let req = pb::FreeManyRequest {
            session_id: session_id.to_string(),
            ids: ids.to_vec(),
            requester: None,
        };
        self.0.clone().free_many(req).await?;
        Ok(())
    }

    /// Allocation `id` as the master describes it now (the session owns
    /// it or is attached to it).
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn lookup(&self, session_id: &str, id: u64) -> Result<Allocation, CallError> {
        let req = pb::LookupRequest {
            session_id: session_id.to_string(),
            id,
        };
        let a = self.0.clone().lookup(req).await?;
        read(PEER, "allocation", a.into_inner())
    }

    /// Detaches allocation `id` from the session.
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn detach(&self, session_id: &str, id: u64) -> Result<(), CallError> {
        let req = pb::DetachRequest {
            session_id: session_id.to_string(),
            id,
        };
        self.0.clone().detach(req).await?;
        Ok(())
    }
}
