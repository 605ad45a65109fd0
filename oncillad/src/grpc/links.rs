//! Outgoing gRPC: the master's link to agents and an agent's link to the
//! master. Channels are made once per peer and reused.

use dashmap::DashMap;
use oncilla_proto::auth::Token;
use oncilla_proto::client::{self, AgentClient, MasterClient};
use oncilla_proto::pb;
use tonic::Status;

use crate::master::AgentLink;

/// Deadline of a release (shorter than other calls: see `release`).
const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

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

    fn client(&self, addr: &str) -> Result<AgentClient, String> {
        if let Some(c) = self.clients.get(addr) {
            return Ok(c.clone());
        }
        let channel = client::lazy(addr, &self.token).map_err(|e| e.to_string())?;
        let c = AgentClient::new(channel);
        self.clients.insert(addr.to_string(), c.clone());
        Ok(c)
    }
}

impl AgentLink for GrpcAgentLink {
    async fn reserve(
        &self,
        addr: &str,
        req: pb::ReserveRequest,
    ) -> Result<pb::ReserveReply, String> {
        let mut c = self.client(addr)?;
        c.reserve(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| client::unreachable("agent", addr, s).message().to_string())
    }

    async fn release(&self, addr: &str, alloc_id: u64) -> Result<pb::ReleaseReply, String> {
        let mut c = self.client(addr)?;
        let mut req = tonic::Request::new(pb::ReleaseRequest { alloc_id });
        // Best effort: a holder that misses it releases on its next
        // heartbeat, so a free never waits long for a sick node.
        req.set_timeout(RELEASE_TIMEOUT);
        c.release(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| client::unreachable("agent", addr, s).message().to_string())
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

    pub async fn register(&self, req: pb::RegisterRequest) -> Result<pb::RegisterReply, Status> {
        let r = self.client.clone().register(req).await;
        r.map(tonic::Response::into_inner).map_err(|s| self.wrap(s))
    }

    pub async fn heartbeat(&self, req: pb::HeartbeatRequest) -> Result<pb::HeartbeatReply, Status> {
        let r = self.client.clone().heartbeat(req).await;
        r.map(tonic::Response::into_inner).map_err(|s| self.wrap(s))
    }

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
