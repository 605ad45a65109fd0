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
    #[tracing::instrument(skip_all, fields(node = req.get_ref().node.as_ref().map_or("", |n| n.name.as_str())))]
    async fn register(
        &self,
        req: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterReply>, Status> {
        reply(self.core.register(req.into_inner()).await)
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatReply>, Status> {
        Ok(Response::new(self.core.heartbeat(req.into_inner()).await))
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

    async fn list_nodes(
        &self,
        _req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::NodeList>, Status> {
        Ok(Response::new(pb::NodeList {
            nodes: self.core.nodes(),
            recovering_ms: u64::try_from(self.core.recovering().as_millis()).unwrap_or(u64::MAX),
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
