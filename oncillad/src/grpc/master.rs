//! The `Master` service: validates requests and calls the master core.

use std::sync::Arc;

use oncilla_proto::pb::{self, master_server};
use tonic::{Request, Response, Status};

use super::reply;
use crate::error::CoreError;
use crate::grpc::links::GrpcAgentLink;
use crate::master::Master;

pub struct MasterService {
    core: Arc<Master<GrpcAgentLink>>,
}

impl MasterService {
    pub fn new(core: Arc<Master<GrpcAgentLink>>) -> Self {
        Self { core }
    }
}

#[tonic::async_trait]
impl master_server::Master for MasterService {
    async fn register(
        &self,
        req: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterReply>, Status> {
        let node = req
            .into_inner()
            .node
            .ok_or_else(|| Status::invalid_argument("register without node info"))?;
        self.core.register(node)?;
        let ms = u64::try_from(self.core.heartbeat_interval().as_millis()).unwrap_or(u64::MAX);
        Ok(Response::new(pb::RegisterReply {
            heartbeat_interval_ms: ms,
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatReply>, Status> {
        let r = req.into_inner();
        let known = self.core.heartbeat(&r.name, r.pool.unwrap_or_default());
        Ok(Response::new(pb::HeartbeatReply { known }))
    }

    #[tracing::instrument(skip_all, fields(size = req.get_ref().spec.as_ref().map_or(0, |s| s.size)))]
    async fn allocate(
        &self,
        req: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        reply(self.core.allocate(req.into_inner()).await)
    }

    #[tracing::instrument(skip_all, fields(alloc = ?req.get_ref().alloc))]
    async fn free(&self, req: Request<pb::FreeRequest>) -> Result<Response<pb::FreeReply>, Status> {
        let r = req.into_inner();
        let target = r.alloc.unwrap_or_default();
        reply(
            self.core
                .free(&target, &r.session_id, r.force)
                .await
                .map(|()| pb::FreeReply {}),
        )
    }

    #[tracing::instrument(skip_all, fields(alloc = ?req.get_ref().alloc))]
    async fn attach(
        &self,
        req: Request<pb::MasterAttachRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        let r = req.into_inner();
        let who = r
            .requester
            .ok_or_else(|| CoreError::InvalidArgument("attach names no process".into()))?;
        reply(self.core.attach(&r.alloc.unwrap_or_default(), who))
    }

    #[tracing::instrument(skip_all, fields(id = req.get_ref().id))]
    async fn detach(
        &self,
        req: Request<pb::DetachRequest>,
    ) -> Result<Response<pb::DetachReply>, Status> {
        let r = req.into_inner();
        reply(
            self.core
                .detach(r.id, &r.session_id)
                .map(|()| pb::DetachReply {}),
        )
    }

    #[tracing::instrument(skip_all, fields(session = %req.get_ref().session_id))]
    async fn end_session(
        &self,
        req: Request<pb::EndSessionRequest>,
    ) -> Result<Response<pb::EndSessionReply>, Status> {
        let session = req.into_inner().session_id;
        if session.is_empty() {
            return Err(CoreError::InvalidArgument("empty session id".into()).into());
        }
        let freed = self.core.end_session(&session).await;
        Ok(Response::new(pb::EndSessionReply { freed }))
    }

    async fn list_nodes(
        &self,
        _req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::NodeList>, Status> {
        Ok(Response::new(pb::NodeList {
            nodes: self.core.nodes(),
        }))
    }

    async fn list_allocations(
        &self,
        _req: Request<pb::ListAllocationsRequest>,
    ) -> Result<Response<pb::AllocationList>, Status> {
        Ok(Response::new(pb::AllocationList {
            allocations: self.core.allocations(),
        }))
    }

    async fn get_allocation(
        &self,
        req: Request<pb::GetAllocationRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        reply(
            self.core
                .allocation(&req.into_inner().alloc.unwrap_or_default()),
        )
    }
}
