//! Outgoing gRPC: the master's link to agents ([`GrpcAgentLink`], the
//! master core's `AgentLink`) and an agent's link to the master
//! ([`MasterLink`], the agent core's `MasterPort`, and what the session
//! service forwards). Domain values are converted here, at the edge;
//! channels are made once per peer and reused.

use dashmap::DashMap;
use oncilla_model::cluster::{
    Heartbeat, HeartbeatReply, Registered, Registration, Reservation, Reserved,
};
use oncilla_model::node::PoolUsage;
use oncilla_proto::auth::Token;
use oncilla_proto::client::{self, AgentClient, MasterClient};
use oncilla_proto::pb;
use tonic::Status;

use super::status::link_error;
use crate::agent::MasterPort;
use crate::error::LinkError;
use crate::master::AgentLink;

/// Deadline of a release (shorter than other calls: see `release`).
const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// A failed call to the peer `what` at `addr`, as the core sees it.
fn failed(what: &str, addr: &str, s: Status) -> LinkError {
    let message = client::unreachable(what, addr, s.clone())
        .message()
        .to_string();
    link_error(&s, message)
}

/// The master's connections to agents, one channel per agent address.
pub struct GrpcAgentLink {
    token: Token,
    clients: DashMap<String, AgentClient>,
}

impl GrpcAgentLink {
    pub fn new(token: Token) -> Self {
        Self {
            token,
            clients: DashMap::new(),
        }
    }

    fn client(&self, addr: &str) -> Result<AgentClient, LinkError> {
        if let Some(c) = self.clients.get(addr) {
            return Ok(c.clone());
        }
        let channel =
            client::lazy(addr, &self.token).map_err(|e| LinkError::Unreachable(e.to_string()))?;
        let c = AgentClient::new(channel);
        self.clients.insert(addr.to_string(), c.clone());
        Ok(c)
    }
}

impl AgentLink for GrpcAgentLink {
    async fn reserve(&self, addr: &str, req: Reservation) -> Result<Reserved, LinkError> {
        let mut c = self.client(addr)?;
        c.reserve(pb::ReserveRequest::from(req))
            .await
            .map(|r| r.into_inner().into())
            .map_err(|s| failed("agent", addr, s))
    }

    async fn release(&self, addr: &str, alloc_id: u64) -> Result<Option<PoolUsage>, LinkError> {
        let mut c = self.client(addr)?;
        let mut req = tonic::Request::new(pb::ReleaseRequest { alloc_id });
        // Best effort: a holder that misses it releases on its next
        // heartbeat, so a free never waits long for a sick node.
        req.set_timeout(RELEASE_TIMEOUT);
        c.release(req)
            .await
            .map(|r| r.into_inner().pool.map(Into::into))
            .map_err(|s| failed("agent", addr, s))
    }
}

/// An agent's connection to the master.
#[derive(Clone)]
pub struct MasterLink {
    addr: String,
    client: MasterClient,
}

impl MasterLink {
    /// A lazily connected link to the master at `addr`.
    ///
    /// # Errors
    /// A message for an address that cannot be dialled.
    pub fn new(addr: &str, token: &Token) -> Result<Self, client::AddrError> {
        Ok(Self {
            addr: addr.to_string(),
            client: MasterClient::new(client::lazy(addr, token)?),
        })
    }

    fn wrap(&self, s: Status) -> Status {
        client::unreachable("master", &self.addr, s)
    }

    // What the session service forwards: the master's status goes back to
    // the application as it is (code, message and reason).

    pub async fn allocate(&self, req: pb::AllocateRequest) -> Result<pb::Allocation, Status> {
        let r = self.client.clone().allocate(req).await;
        r.map(tonic::Response::into_inner).map_err(|s| self.wrap(s))
    }

    pub async fn free(&self, req: pb::FreeRequest) -> Result<(), Status> {
        let r = self.client.clone().free(req).await;
        r.map(|_| ()).map_err(|s| self.wrap(s))
    }

    pub async fn attach(&self, req: pb::MasterAttachRequest) -> Result<pb::Allocation, Status> {
        let r = self.client.clone().attach(req).await;
        r.map(tonic::Response::into_inner).map_err(|s| self.wrap(s))
    }

    pub async fn detach(&self, req: pb::DetachRequest) -> Result<(), Status> {
        let r = self.client.clone().detach(req).await;
        r.map(|_| ()).map_err(|s| self.wrap(s))
    }
}

impl MasterPort for MasterLink {
    async fn register(&self, req: Registration) -> Result<Registered, LinkError> {
        let r = self
            .client
            .clone()
            .register(pb::RegisterRequest::from(req))
            .await;
        r.map(|r| r.into_inner().into())
            .map_err(|s| failed("master", &self.addr, s))
    }

    async fn heartbeat(&self, req: Heartbeat) -> Result<HeartbeatReply, LinkError> {
        let r = self
            .client
            .clone()
            .heartbeat(pb::HeartbeatRequest::from(req))
            .await;
        r.map(|r| r.into_inner().into())
            .map_err(|s| failed("master", &self.addr, s))
    }
}
