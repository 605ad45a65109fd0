//! The `Agent` service: the master's handle on this node's pool.

use std::sync::Arc;

use oncilla_proto::pb::{self, agent_server};
use tonic::{Request, Response, Status};

use super::reply;
use crate::agent::Agent;

pub struct AgentService {
    agent: Arc<Agent>,
}

impl AgentService {
    pub fn new(agent: Arc<Agent>) -> Self {
        Self { agent }
    }
}

#[tonic::async_trait]
impl agent_server::Agent for AgentService {
    #[tracing::instrument(skip_all, fields(alloc_id = req.get_ref().alloc_id, len = req.get_ref().len))]
    async fn reserve(
        &self,
        req: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::ReserveReply>, Status> {
        let r = req.into_inner();
        let reserved = self
            .agent
            .reserve(r.alloc_id, &r.access_key, r.alloc_offset, r.len);
        reply(reserved.map(|pool_offset| pb::ReserveReply { pool_offset }))
    }

    #[tracing::instrument(skip_all, fields(alloc_id = req.get_ref().alloc_id))]
    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseReply>, Status> {
        let id = req.into_inner().alloc_id;
        if let Some(held) = self.agent.release(id) {
            // Scrubbing happens when the last user drops the memory; keep it
            // off the executor.
            tokio::task::spawn_blocking(move || drop(held));
            tracing::debug!(alloc_id = id, "released");
        }
        Ok(Response::new(pb::ReleaseReply {}))
    }

    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::AgentStatus>, Status> {
        Ok(Response::new(pb::AgentStatus {
            node: Some(self.agent.node().clone()),
            used: self.agent.pool().used(),
            allocations: u32::try_from(self.agent.allocations()).unwrap_or(u32::MAX),
            sessions: u32::try_from(self.agent.sessions()).unwrap_or(u32::MAX),
        }))
    }
}
