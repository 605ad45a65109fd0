//! The `Master` service: checks each request into domain values, calls the
//! master core and converts its answers back to the wire.

use std::sync::Arc;

use oncilla_model::alloc::{check_node_name, AllocSpec, Owner};
use oncilla_model::cluster::{AllocateBatch, AllocateRequest, FreeBatch, Registration};
use oncilla_net::credential::Authenticate;
use oncilla_proto::client;
use oncilla_proto::convert::{alloc_ref, quota_setting, WireError};
use oncilla_proto::pb::master_server::MasterServer;
use oncilla_proto::pb::{self, master_server};
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use super::authority::Caller;
use super::{checked, reply};
use crate::error::CoreError;
use crate::grpc::links::GrpcAgentLink;
use crate::master::seat::{Acting, Seat};
use crate::master::tenure::Tenure;

/// The service as served: authenticated on every call.
pub type Served = InterceptedService<MasterServer<MasterService>, Authenticate>;

pub struct MasterService {
    seat: watch::Receiver<Seat<GrpcAgentLink>>,
}

impl MasterService {
    /// The service of whichever core `seat` holds: a standby refuses every
    /// call, naming the leader when it knows it.
    pub fn new(seat: watch::Receiver<Seat<GrpcAgentLink>>) -> Self {
        Self { seat }
    }

    /// The core that serves a call now, and its tenure (see [`still`]).
    fn core(&self) -> Result<Acting<GrpcAgentLink>, Status> {
        self.seat.borrow().core().map_err(Status::from)
    }
}

/// Refuses to confirm a call whose tenure ended while it ran.
fn still(tenure: Option<&Arc<Tenure>>) -> Result<(), Status> {
    Seat::<GrpcAgentLink>::still(tenure).map_err(Status::from)
}

impl MasterService {
    /// The service as the server mounts it: every call authenticated
    /// (`check`), messages up to [`oncilla_proto::client::MAX_MESSAGE`].
    pub fn server(self, check: Authenticate) -> Served {
        InterceptedService::new(
            MasterServer::new(self)
                .max_decoding_message_size(oncilla_proto::client::MAX_MESSAGE)
                .max_encoding_message_size(oncilla_proto::client::MAX_MESSAGE),
            check,
        )
    }
}

/// An edge check that failed, as INVALID_ARGUMENT.
fn invalid(e: impl Into<WireError>) -> Status {
    Status::invalid_argument(format!("invalid request: {}", e.into()))
}

/// An allocation request as the master core takes it.
fn allocate_request(r: pb::AllocateRequest) -> Result<AllocateRequest, Status> {
    let spec: AllocSpec = checked(r.spec.ok_or_else(|| invalid(WireError::Missing("spec")))?)?;
    AllocateRequest::new(spec, r.origin_node, r.requester.map(Into::into)).map_err(invalid)
}

#[tonic::async_trait]
impl master_server::Master for MasterService {
    #[tracing::instrument(skip_all, fields(node = req.get_ref().node.as_ref().map_or("", |n| n.name.as_str())))]
    async fn register(
        &self,
        req: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterReply>, Status> {
        let caller = Caller::of(&req)?;
        let r: Registration = checked(req.into_inner())?;
        caller.register(&r)?;
        let (core, tenure) = self.core()?;
        let out = core.register(r).await;
        still(tenure.as_ref())?;
        reply(out)
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatReply>, Status> {
        let caller = Caller::of(&req)?;
        let beat = req.into_inner().into();
        caller.heartbeat(&beat)?;
        let (core, tenure) = self.core()?;
        let out = core.heartbeat(beat).await;
        still(tenure.as_ref())?;
        Ok(Response::new(out.into()))
    }

    #[tracing::instrument(skip_all, fields(size = req.get_ref().spec.as_ref().map_or(0, |s| s.size)))]
    async fn allocate(
        &self,
        req: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        let caller = Caller::of(&req)?;
        let r = allocate_request(req.into_inner())?;
        caller.allocate(&r)?;
        let (core, tenure) = self.core()?;
        if let (Caller::Node(node), Some(who)) = (&caller, &r.requester) {
            // Its own session's request (checked above): the node is alive.
            core.heard_from(node, who.agent_incarnation);
        }
        let out = core.allocate(r).await;
        still(tenure.as_ref())?;
        reply(out)
    }

    #[tracing::instrument(skip_all, fields(count = req.get_ref().count))]
    async fn allocate_many(
        &self,
        req: Request<pb::AllocateManyRequest>,
    ) -> Result<Response<pb::AllocationBatch>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        let request = allocate_request(
            r.request
                .ok_or_else(|| invalid(WireError::Missing("request")))?,
        )?;
        let batch = AllocateBatch::new(request, r.count).map_err(invalid)?;
        caller.allocate(&batch.request)?;
        let (core, tenure) = self.core()?;
        if let (Caller::Node(node), Some(who)) = (&caller, &batch.request.requester) {
            core.heard_from(node, who.agent_incarnation);
        }
        let out = core.allocate_many(batch).await;
        still(tenure.as_ref())?;
        reply(out)
    }

    #[tracing::instrument(skip_all, fields(alloc = ?req.get_ref().alloc))]
    async fn free(&self, req: Request<pb::FreeRequest>) -> Result<Response<pb::FreeReply>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        let target = alloc_ref(r.alloc).map_err(invalid)?;
        let who: Option<Owner> = r.requester.map(Into::into);
        caller.for_requester(who.as_ref(), &r.session_id, "free")?;
        let uid = who.and_then(|o| o.uid);
        let (core, tenure) = self.core()?;
        let out = core.free(&target, &r.session_id, uid, r.force).await;
        still(tenure.as_ref())?;
        out?;
        Ok(Response::new(pb::FreeReply {}))
    }

    #[tracing::instrument(skip_all, fields(count = req.get_ref().ids.len()))]
    async fn free_many(
        &self,
        req: Request<pb::FreeManyRequest>,
    ) -> Result<Response<pb::FreeReply>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        let batch = FreeBatch::new(r.ids).map_err(invalid)?;
        let who: Option<Owner> = r.requester.map(Into::into);
        caller.for_requester(who.as_ref(), &r.session_id, "free")?;
        let uid = who.and_then(|o| o.uid);
        let (core, tenure) = self.core()?;
        let out = core.free_many(&batch, &r.session_id, uid).await;
        still(tenure.as_ref())?;
        out?;
        Ok(Response::new(pb::FreeReply {}))
    }

    #[tracing::instrument(skip_all, fields(alloc = ?req.get_ref().alloc))]
    async fn attach(
        &self,
        req: Request<pb::MasterAttachRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        let who: Owner = r
            .requester
            .ok_or_else(|| CoreError::InvalidArgument("attach names no process".into()))?
            .into();
        caller.for_requester(Some(&who), &who.session_id, "attach")?;
        let target = alloc_ref(r.alloc).map_err(invalid)?;
        let (core, tenure) = self.core()?;
        let out = core.attach(&target, who);
        still(tenure.as_ref())?;
        reply(out)
    }

    #[tracing::instrument(skip_all, fields(id = req.get_ref().id))]
    async fn lookup(
        &self,
        req: Request<pb::MasterLookupRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        let who: Owner = r
            .requester
            .ok_or_else(|| CoreError::InvalidArgument("lookup names no process".into()))?
            .into();
        caller.for_requester(Some(&who), &who.session_id, "look up")?;
        reply(self.core()?.0.lookup(r.id, &who))
    }

    #[tracing::instrument(skip_all, fields(id = req.get_ref().id))]
    async fn detach(
        &self,
        req: Request<pb::DetachRequest>,
    ) -> Result<Response<pb::DetachReply>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        caller.for_requester(None, &r.session_id, "detach")?;
        let (core, tenure) = self.core()?;
        let out = core.detach(r.id, &r.session_id);
        still(tenure.as_ref())?;
        out?;
        Ok(Response::new(pb::DetachReply {}))
    }

    async fn list_nodes(
        &self,
        _req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::NodeList>, Status> {
        let (core, _) = self.core()?;
        Ok(Response::new(pb::NodeList {
            nodes: core.nodes().into_iter().map(Into::into).collect(),
            // Rounded up: 0 only once the window is over.
            recovering_ms: u64::try_from(core.recovering().as_micros().div_ceil(1000))
                .unwrap_or(u64::MAX),
        }))
    }

    async fn list_allocations(
        &self,
        req: Request<pb::ListAllocationsRequest>,
    ) -> Result<Response<pb::AllocationList>, Status> {
        Caller::of(&req)?.operator("listing allocations")?;
        let after = req.into_inner().after;
        let (page, more) =
            self.core()?
                .0
                .allocations_page(after, client::PAGE_ALLOCATIONS, client::PAGE_EXTENTS);
        let next_after = if more {
            page.last().map_or(0, |a| a.id)
        } else {
            0
        };
        Ok(Response::new(pb::AllocationList {
            allocations: page.into_iter().map(Into::into).collect(),
            next_after,
        }))
    }

    async fn get_allocation(
        &self,
        req: Request<pb::GetAllocationRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        Caller::of(&req)?.operator("looking up an allocation")?;
        let target = alloc_ref(req.into_inner().alloc).map_err(invalid)?;
        reply(self.core()?.0.allocation(&target))
    }

    #[tracing::instrument(skip_all, fields(node = %req.get_ref().name))]
    async fn leave(
        &self,
        req: Request<pb::LeaveRequest>,
    ) -> Result<Response<pb::LeaveReply>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        check_node_name(&r.name).map_err(invalid)?;
        let incarnation = match caller {
            // A node leaves as itself, naming the start it is.
            Caller::Node(_) => {
                caller.leave(&r.name)?;
                Some(r.incarnation)
            }
            Caller::Operator => None,
        };
        let (core, tenure) = self.core()?;
        let out = core.leave(&r.name, incarnation).await;
        still(tenure.as_ref())?;
        let lost = out.map_err(Status::from)?;
        Ok(Response::new(pb::LeaveReply { lost: lost as u64 }))
    }

    #[tracing::instrument(skip_all, fields(node = %req.get_ref().name, drain = req.get_ref().drain))]
    async fn drain(
        &self,
        req: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::NodeStatus>, Status> {
        Caller::of(&req)?.operator("draining a node")?;
        let r = req.into_inner();
        check_node_name(&r.name).map_err(invalid)?;
        let (core, tenure) = self.core()?;
        let out = core.drain(&r.name, r.drain);
        still(tenure.as_ref())?;
        reply(out)
    }

    async fn list_quotas(
        &self,
        req: Request<pb::ListQuotasRequest>,
    ) -> Result<Response<pb::QuotaList>, Status> {
        Caller::of(&req)?.operator("listing quotas")?;
        Ok(Response::new(self.core()?.0.quota_report().into()))
    }

    #[tracing::instrument(skip_all, fields(uid = req.get_ref().uid, default = req.get_ref().is_default))]
    async fn set_quota(
        &self,
        req: Request<pb::SetQuotaRequest>,
    ) -> Result<Response<pb::QuotaList>, Status> {
        Caller::of(&req)?.operator("setting quotas")?;
        let (who, limits) = quota_setting(req.into_inner()).map_err(invalid)?;
        let (core, tenure) = self.core()?;
        let out = core.set_quota(who, limits);
        still(tenure.as_ref())?;
        reply(out)
    }
}
