//! The `Session` service on the agent's Unix socket: how local applications
//! open sessions and allocate. Allocation and free are forwarded to the
//! master; the session stream's end is queued for the master (see
//! `agent::membership`), which frees everything the session owned.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use oncilla_model::cluster::FreeBatch;
use oncilla_net::credential::{self, Authenticate, Principal};
use oncilla_proto::pb::session_server::SessionServer;
use oncilla_proto::pb::{self, session_server};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::agent::Agent;
use crate::grpc::links::MasterLink;

/// The service as served: authenticated on every call.
pub type Served = InterceptedService<SessionServer<SessionService>, Authenticate>;

pub struct SessionService {
    agent: Arc<Agent>,
    master: MasterLink,
    /// Makes each session's credential.
    keys: std::sync::Arc<oncilla_net::credential::NodeKeys>,
    /// The cluster CA (PEM) sessions trust on TCP listeners; empty: plain TCP.
    tls_ca: Vec<u8>,
}

impl SessionService {
    pub fn new(
        agent: Arc<Agent>,
        master: MasterLink,
        keys: std::sync::Arc<oncilla_net::credential::NodeKeys>,
        tls: Option<&oncilla_net::tls::ClientTls>,
    ) -> Self {
        Self {
            agent,
            master,
            keys,
            tls_ca: tls.map(|t| t.ca_pem().to_vec()).unwrap_or_default(),
        }
    }

    /// The service as the server mounts it: every call authenticated
    /// (`check`: members, or sessions where a call allows them), messages up to [`oncilla_proto::client::MAX_MESSAGE`].
    pub fn server(self, check: Authenticate) -> Served {
        InterceptedService::new(
            SessionServer::new(self)
                .max_decoding_message_size(oncilla_proto::client::MAX_MESSAGE)
                .max_encoding_message_size(oncilla_proto::client::MAX_MESSAGE),
            check,
        )
    }

    /// The process behind an open session, as the master records it.
    fn requester(&self, session_id: &str) -> Result<pb::Owner, Status> {
        Ok(self.agent.owner(session_id)?.into())
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
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        tracing::info!(session = %self.id, "session stream closed");
        self.agent.end_session(&self.id);
    }
}

#[tonic::async_trait]
impl session_server::Session for SessionService {
    type OpenStream = SessionStream;

    async fn open(&self, req: Request<pb::OpenRequest>) -> Result<Response<SessionStream>, Status> {
        // Who the kernel says is on the other end of the socket: its pid
        // and user are trusted over what the request claims.
        let peer = req
            .extensions()
            .get::<oncilla_net::proven::Conn<tonic::transport::server::UdsConnectInfo>>()
            .and_then(|c| c.info.peer_cred);
        let r = req.into_inner();
        // Kept with every allocation the session owns and sent in each
        // registration of the node: bounded here, where it enters.
        oncilla_model::alloc::check_program(&r.program)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let pid = peer
            .and_then(|c| c.pid())
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(r.pid);
        let info = self
            .agent
            .open_session(pid, peer.map(|c| c.uid()), r.program)?;
        let (tx, rx) = mpsc::channel(1);
        let lifetime = self.agent.credential_lifetime();
        let mint = {
            let (keys, id) = (Arc::clone(&self.keys), info.id.clone());
            move || {
                let expires = credential::unix_now().saturating_add(lifetime.as_secs());
                keys.session(&id, expires).as_str().to_string()
            }
        };
        let first = pb::SessionEvent {
            session_id: info.id.clone(),
            node: self.agent.node().name.clone(),
            credential: mint(),
            tls_ca: self.tls_ca.clone(),
        };
        tx.try_send(Ok(first))
            .map_err(|_| Status::internal("cannot queue the session event"))?;
        // A fresh credential every third of its lifetime, for as long as
        // the session lives (the send fails once the stream is gone).
        let renew = tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(lifetime / 3).await;
                let event = pb::SessionEvent {
                    credential: mint(),
                    ..Default::default()
                };
                if renew.send(Ok(event)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(SessionStream {
            rx,
            _tx: tx,
            _guard: SessionGuard {
                id: info.id,
                agent: Arc::clone(&self.agent),
            },
        }))
    }

    #[tracing::instrument(skip_all, fields(session = %req.get_ref().session_id, size = req.get_ref().spec.as_ref().map_or(0, |s| s.size)))]
    async fn alloc(
        &self,
        req: Request<pb::AllocRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        acting_for(&req, &req.get_ref().session_id)?;
        let r = req.into_inner();
        let forwarded = pb::AllocateRequest {
            spec: r.spec,
            origin_node: self.agent.node().name.clone(),
            requester: Some(self.requester(&r.session_id)?),
        };
        let alloc = self.master.allocate(forwarded).await?;
        if alloc.owner.is_none() {
            // A persistent allocation: its creator is attached.
            self.agent.note_attached(&r.session_id, alloc.id, true);
        }
        Ok(Response::new(alloc))
    }

    #[tracing::instrument(skip_all, fields(session = %req.get_ref().session_id, count = req.get_ref().count))]
    async fn alloc_many(
        &self,
        req: Request<pb::AllocManyRequest>,
    ) -> Result<Response<pb::AllocationBatch>, Status> {
        acting_for(&req, &req.get_ref().session_id)?;
        let r = req.into_inner();
        let forwarded = pb::AllocateManyRequest {
            request: Some(pb::AllocateRequest {
                spec: r.spec,
                origin_node: self.agent.node().name.clone(),
                requester: Some(self.requester(&r.session_id)?),
            }),
            count: r.count,
        };
        // A batch is the session's own (the master refuses persistent
        // ones): nothing to note as attached.
        Ok(Response::new(self.master.allocate_many(forwarded).await?))
    }

    #[tracing::instrument(skip_all, fields(session = %req.get_ref().session_id, alloc = ?req.get_ref().alloc))]
    async fn free(&self, req: Request<pb::FreeRequest>) -> Result<Response<pb::FreeReply>, Status> {
        acting_for(&req, &req.get_ref().session_id)?;
        let mut r = req.into_inner();
        r.requester = Some(self.requester(&r.session_id)?);
        let (session, id) = (r.session_id.clone(), r.alloc.as_ref().map_or(0, |a| a.id));
        self.master.free(r).await?;
        self.agent.note_attached(&session, id, false);
        Ok(Response::new(pb::FreeReply {}))
    }

    #[tracing::instrument(skip_all, fields(session = %req.get_ref().session_id, count = req.get_ref().ids.len()))]
    async fn free_many(
        &self,
        req: Request<pb::FreeManyRequest>,
    ) -> Result<Response<pb::FreeReply>, Status> {
        acting_for(&req, &req.get_ref().session_id)?;
        let mut r = req.into_inner();
        let batch = FreeBatch::new(r.ids.clone())
            .map_err(|e| Status::invalid_argument(format!("invalid request: {e}")))?;
        r.requester = Some(self.requester(&r.session_id)?);
        let session = r.session_id.clone();
        self.master.free_many(r).await?;
        for &id in batch.ids() {
            self.agent.note_attached(&session, id, false);
        }
        Ok(Response::new(pb::FreeReply {}))
    }

    #[tracing::instrument(skip_all, fields(session = %req.get_ref().session_id, alloc = ?req.get_ref().alloc))]
    async fn attach(
        &self,
        req: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        acting_for(&req, &req.get_ref().session_id)?;
        let r = req.into_inner();
        let forwarded = pb::MasterAttachRequest {
            alloc: r.alloc,
            requester: Some(self.requester(&r.session_id)?),
        };
        let alloc = self.master.attach(forwarded).await?;
        self.agent.note_attached(&r.session_id, alloc.id, true);
        Ok(Response::new(alloc))
    }

    #[tracing::instrument(skip_all, fields(session = %req.get_ref().session_id, id = req.get_ref().id))]
    async fn lookup(
        &self,
        req: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        acting_for(&req, &req.get_ref().session_id)?;
        let r = req.into_inner();
        let forwarded = pb::MasterLookupRequest {
            id: r.id,
            requester: Some(self.requester(&r.session_id)?),
        };
        Ok(Response::new(self.master.lookup(forwarded).await?))
    }

    #[tracing::instrument(skip_all, fields(session = %req.get_ref().session_id, id = req.get_ref().id))]
    async fn detach(
        &self,
        req: Request<pb::DetachRequest>,
    ) -> Result<Response<pb::DetachReply>, Status> {
        acting_for(&req, &req.get_ref().session_id)?;
        let r = req.into_inner();
        self.agent.session(&r.session_id)?;
        let (session, id) = (r.session_id.clone(), r.id);
        self.master.detach(r).await?;
        self.agent.note_attached(&session, id, false);
        Ok(Response::new(pb::DetachReply {}))
    }
}

/// Refuses a call for `session_id` unless its caller is that session (it
/// presents the credential the agent gave it at open) or a cluster member.
fn acting_for<T>(req: &Request<T>, session_id: &str) -> Result<(), Status> {
    match credential::principal(req) {
        Some(Principal::Member) => Ok(()),
        Some(Principal::Session(id)) if id == session_id => Ok(()),
        Some(Principal::Session(_)) => Err(Status::permission_denied(
            "this session's credential cannot act for another session",
        )),
        Some(Principal::Node(_)) | None => Err(Status::permission_denied(
            "present the session credential this agent gave at open (or the cluster token)",
        )),
    }
}
