//! The `Session` service on the agent's Unix socket: how local applications
//! open sessions and allocate. Allocation and free are forwarded to the
//! master; the session stream's end frees everything the session owned.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use oncilla_proto::pb::{self, session_server};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::agent::Agent;
use crate::grpc::links::MasterLink;

/// Attempts to tell the master a session ended before giving up (the
/// master's own session sweep is the backstop).
const END_SESSION_TRIES: u32 = 5;

pub struct SessionService {
    agent: Arc<Agent>,
    master: MasterLink,
}

impl SessionService {
    pub fn new(agent: Arc<Agent>, master: MasterLink) -> Self {
        Self { agent, master }
    }

    /// The process behind an open session, as the master records it.
    fn requester(&self, session_id: &str) -> Result<pb::Owner, Status> {
        let session = self.agent.session(session_id)?;
        Ok(pb::Owner {
            session_id: session.id,
            node: self.agent.node().name.clone(),
            pid: session.pid,
            program: session.program,
        })
    }
}

/// The stream an application holds open for its whole life. It yields one
/// event and then stays pending; when the client goes away, tonic drops it
/// and [`SessionGuard`] ends the session.
pub struct SessionStream {
    rx: mpsc::Receiver<Result<pb::SessionEvent, Status>>,
    // Held so the stream never ends on its own.
    _tx: mpsc::Sender<Result<pb::SessionEvent, Status>>,
    _guard: SessionGuard,
}

impl Stream for SessionStream {
    type Item = Result<pb::SessionEvent, Status>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

struct SessionGuard {
    id: String,
    agent: Arc<Agent>,
    master: MasterLink,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let id = std::mem::take(&mut self.id);
        self.agent.close_session(&id);
        let master = self.master.clone();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::error!(session = %id, "session ended outside the runtime; its allocations stay until the master sweeps them");
            return;
        };
        rt.spawn(async move {
            for attempt in 1..=END_SESSION_TRIES {
                match master.end_session(&id).await {
                    Ok(freed) => {
                        tracing::info!(session = %id, freed, "session closed");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(session = %id, attempt, error = %e.message(), "cannot end session at master");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
    }
}

#[tonic::async_trait]
impl session_server::Session for SessionService {
    type OpenStream = SessionStream;

    async fn open(&self, req: Request<pb::OpenRequest>) -> Result<Response<SessionStream>, Status> {
        let r = req.into_inner();
        let info = self.agent.open_session(r.pid, r.program);
        let (tx, rx) = mpsc::channel(1);
        let first = pb::SessionEvent {
            session_id: info.id.clone(),
            node: self.agent.node().name.clone(),
        };
        tx.try_send(Ok(first))
            .map_err(|_| Status::internal("cannot queue the session event"))?;
        Ok(Response::new(SessionStream {
            rx,
            _tx: tx,
            _guard: SessionGuard {
                id: info.id,
                agent: Arc::clone(&self.agent),
                master: self.master.clone(),
            },
        }))
    }

    #[tracing::instrument(skip_all, fields(session = %req.get_ref().session_id, size = req.get_ref().spec.as_ref().map_or(0, |s| s.size)))]
    async fn alloc(
        &self,
        req: Request<pb::AllocRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        let r = req.into_inner();
        let forwarded = pb::AllocateRequest {
            spec: r.spec,
            origin_node: self.agent.node().name.clone(),
            requester: Some(self.requester(&r.session_id)?),
        };
        self.master.allocate(forwarded).await.map(Response::new)
    }

    #[tracing::instrument(skip_all, fields(session = %req.get_ref().session_id, alloc = ?req.get_ref().alloc))]
    async fn free(&self, req: Request<pb::FreeRequest>) -> Result<Response<pb::FreeReply>, Status> {
        let r = req.into_inner();
        self.agent.session(&r.session_id)?;
        self.master
            .free(r)
            .await
            .map(|()| Response::new(pb::FreeReply {}))
    }

    #[tracing::instrument(skip_all, fields(session = %req.get_ref().session_id, alloc = ?req.get_ref().alloc))]
    async fn attach(
        &self,
        req: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        let r = req.into_inner();
        let forwarded = pb::MasterAttachRequest {
            alloc: r.alloc,
            requester: Some(self.requester(&r.session_id)?),
        };
        self.master.attach(forwarded).await.map(Response::new)
    }

    #[tracing::instrument(skip_all, fields(session = %req.get_ref().session_id, id = req.get_ref().id))]
    async fn detach(
        &self,
        req: Request<pb::DetachRequest>,
    ) -> Result<Response<pb::DetachReply>, Status> {
        let r = req.into_inner();
        self.agent.session(&r.session_id)?;
        self.master
            .detach(r)
            .await
            .map(|()| Response::new(pb::DetachReply {}))
    }
}
