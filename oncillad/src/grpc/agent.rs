//! The `Agent` service: the master's handle on this node's pool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use oncilla_net::credential::{self, Authenticate, Principal};
use oncilla_proto::pb::agent_server::AgentServer;
use oncilla_proto::pb::{self, agent_server};
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use oncilla_model::cluster::{FreeBatch, Release, Reservation, Reserved, SetCopies};

use super::{checked, reply};
use crate::agent::Agent;
use crate::fabric::replicate::{fill, Replicas};

/// The service as served: authenticated on every call.
pub type Served = InterceptedService<AgentServer<AgentService>, Authenticate>;

pub struct AgentService {
    agent: Arc<Agent>,
    /// How this agent sends copies (a re-created replica's fill).
    replicas: Replicas,
}

/// The longest a re-created replica's fill may take (its caller, the
/// master, waits a little longer: `grpc::links::FILL_TIMEOUT`).
const FILL_LIMIT: Duration = Duration::from_secs(50);

impl AgentService {
    pub fn new(agent: Arc<Agent>, replicas: Replicas) -> Self {
        Self { agent, replicas }
    }

    /// Admits a change only a master may ask for: from a member, under a
    /// term no older than the one this agent follows (fencing).
    fn admit_master<T>(&self, req: &Request<T>, what: &str) -> Result<(), Status> {
        members_only(req, what)?;
        self.agent
            .admit_term(oncilla_proto::client::term_of(req)?)
            .map_err(Status::from)
    }

    /// The service as the server mounts it: every call authenticated
    /// (`check`: members, or sessions where a call allows them), messages up to [`oncilla_proto::client::MAX_MESSAGE`].
    pub fn server(self, check: Authenticate) -> Served {
        InterceptedService::new(
            AgentServer::new(self)
                .max_decoding_message_size(oncilla_proto::client::MAX_MESSAGE)
                .max_encoding_message_size(oncilla_proto::client::MAX_MESSAGE),
            check,
        )
    }
}

/// One reply, then pending for as long as the client keeps the stream:
/// the queue pair lives in the stream's state.
type ConnectVerbsStream = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<pb::ConnectVerbsReply, Status>> + Send>,
>;

#[tonic::async_trait]
impl agent_server::Agent for AgentService {
    #[tracing::instrument(skip_all, fields(count = req.get_ref().reservations.len(), first = req.get_ref().reservations.first().map_or(0, |r| r.alloc_id)))]
    async fn reserve(
        &self,
        req: Request<pb::ReserveBatch>,
    ) -> Result<Response<pb::ReserveBatchReply>, Status> {
        self.admit_master(&req, "reserving pool memory")?;
        let batch: Vec<Reservation> = checked(req.into_inner())?;
        let agent = Arc::clone(&self.agent);
        // Reserving may wait for the refiller: keep it off the executor.
        let reserved = tokio::task::spawn_blocking(move || agent.reserve_many(batch))
            .await
            .map_err(|e| Status::internal(format!("reserve task failed: {e}")))?;
        reply(reserved.map(|all| {
            let pool = Some(self.agent.usage());
            pb::ReserveBatchReply::from(
                all.into_iter()
                    .map(|pieces| Reserved { pieces, pool })
                    .collect::<Vec<_>>(),
            )
        }))
    }

    #[tracing::instrument(skip_all, fields(alloc_id = req.get_ref().alloc_id))]
    async fn set_copies(
        &self,
        req: Request<pb::SetCopiesRequest>,
    ) -> Result<Response<pb::SetCopiesReply>, Status> {
        self.admit_master(&req, "changing an allocation's copies")?;
        let c: SetCopies = checked(req.into_inner())?;
        let (id, new_replicas) = (c.alloc_id, c.fill.clone());
        // It waits for the allocation's order lock (a write may hold it
        // while it copies): off the executor.
        let agent = Arc::clone(&self.agent);
        tokio::task::spawn_blocking(move || agent.set_copies(c))
            .await
            .map_err(|e| Status::internal(format!("copy change failed: {e}")))?
            .map_err(Status::from)?;
        // New replicas are sent the whole share before the answer, off the
        // executor (it waits on the order lock and the network).
        for addr in new_replicas {
            let (replicas, table) = (self.replicas.clone(), self.agent.held());
            let started = Instant::now();
            let deadline = started + FILL_LIMIT;
            let to = addr.clone();
            let filled =
                tokio::task::spawn_blocking(move || fill(&replicas, &table, id, &to, deadline))
                    .await
                    .map_err(|e| Status::internal(format!("fill task failed: {e}")))?;
            match filled {
                Ok(bytes) => {
                    let secs = started.elapsed().as_secs_f64();
                    tracing::info!(alloc_id = id, replica = %addr, bytes, secs, mib_per_s = bytes as f64 / (1 << 20) as f64 / secs.max(1e-9), "replica filled");
                }
                Err(why) => {
                    tracing::warn!(alloc_id = id, replica = %addr, %why, "could not fill a new replica");
                    return Err(Status::unavailable(format!(
                        "filling a new replica of allocation {id}: {why}"
                    )));
                }
            }
        }
        Ok(Response::new(pb::SetCopiesReply {}))
    }

    #[tracing::instrument(skip_all, fields(alloc_id = req.get_ref().alloc_id))]
    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseReply>, Status> {
        self.admit_master(&req, "releasing pool memory")?;
        let r: Release = checked(req.into_inner())?;
        let id = r.alloc_id;
        let released = if r.ranges.is_empty() {
            self.agent.release(id)
        } else {
            let ranges: Vec<(u64, u64)> =
                r.ranges.iter().map(|g| (g.alloc_offset, g.len)).collect();
            self.agent
                .release_part(id, &ranges)
                .map_err(|e| Status::invalid_argument(e.to_string()))?
        };
        // The extents go to the refiller once the last in-flight copy using
        // them is done; nothing here waits for that. Device memory is freed
        // when the entry drops, and cuMemFree waits for the device: off the
        // executor.
        if let Some(held) = released {
            tracing::debug!(alloc_id = id, part = !r.ranges.is_empty(), "released");
            drop(tokio::task::spawn_blocking(move || drop(held)));
        }
        Ok(Response::new(pb::ReleaseReply {
            pool: Some(self.agent.usage().into()),
        }))
    }

    #[tracing::instrument(skip_all, fields(count = req.get_ref().alloc_ids.len()))]
    async fn release_many(
        &self,
        req: Request<pb::ReleaseManyRequest>,
    ) -> Result<Response<pb::ReleaseReply>, Status> {
        self.admit_master(&req, "releasing pool memory")?;
        let batch = FreeBatch::new(req.into_inner().alloc_ids)
            .map_err(|e| Status::invalid_argument(format!("invalid request: {e}")))?;
        // As one release each; what goes is dropped off the executor.
        let released: Vec<_> = batch
            .ids()
            .iter()
            .filter_map(|&id| self.agent.release(id))
            .collect();
        if !released.is_empty() {
            tracing::debug!(count = released.len(), "released a batch");
            drop(tokio::task::spawn_blocking(move || drop(released)));
        }
        Ok(Response::new(pb::ReleaseReply {
            pool: Some(self.agent.usage().into()),
        }))
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::AgentStatus>, Status> {
        members_only(&req, "an agent's status")?;
        Ok(Response::new(
            oncilla_model::node::AgentStatus {
                node: self.agent.info(),
                pool: self.agent.usage(),
                allocations: u32::try_from(self.agent.allocations()).unwrap_or(u32::MAX),
                sessions: u32::try_from(self.agent.sessions()).unwrap_or(u32::MAX),
                mappings: u32::try_from(self.agent.leases().len()).unwrap_or(u32::MAX),
                incarnation: self.agent.incarnation(),
                cpu_ns: crate::agent::cpu::process_cpu_ns(),
            }
            .into(),
        ))
    }

    type ConnectVerbsStream = ConnectVerbsStream;

    #[tracing::instrument(skip_all, fields(port_index = req.get_ref().port_index))]
    async fn connect_verbs(
        &self,
        req: Request<pb::ConnectVerbsRequest>,
    ) -> Result<Response<ConnectVerbsStream>, Status> {
        if let Some(oncilla_net::credential::Principal::Session(id)) =
            oncilla_net::credential::principal(&req)
        {
            if self.agent.ended_here().has_ended(id) {
                return Err(Status::permission_denied(
                    "permission denied: the session of this credential has ended",
                ));
            }
        }
        let rdma = Arc::clone(self.agent.rdma());
        let r = req.into_inner();
        let client = r
            .client
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("no client endpoint"))?;
        let client = oncilla_rdma::qp::Endpoint::try_from(client)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let port_index = r.port_index;
        // Creating and connecting a queue pair are blocking verbs calls.
        let (paired, held) = tokio::task::spawn_blocking(move || {
            crate::fabric::verbs::connect(&rdma, &client, port_index)
        })
        .await
        .map_err(|e| Status::internal(format!("connect task failed: {e}")))?
        .map_err(verbs_status)?;
        let reply = pb::ConnectVerbsReply {
            agent: Some(pb::QpEndpoint::from(&paired.endpoint)),
            device: paired.device,
            port: paired.port,
            incarnation: self.agent.incarnation(),
        };
        tracing::info!(device = %reply.device, port = reply.port, "verbs queue pair connected");
        let rdma = Arc::clone(self.agent.rdma());
        let stream = futures_util::stream::unfold(
            (Some(reply), held, rdma),
            |(reply, held, rdma)| async move {
                match reply {
                    Some(r) => Some((Ok(r), (None, held, rdma))),
                    None => {
                        // `held` stays in this future until the client goes
                        // or the port does: then the stream ends, which the
                        // client sees, and the pair is destroyed.
                        rdma.removed(held.port).await;
                        tracing::info!(
                            port = held.port,
                            "verbs queue pair closed: its RDMA port went away"
                        );
                        None
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }
}

/// The status of a refused `ConnectVerbs`: no verbs here is
/// `FAILED_PRECONDITION`, endpoints that cannot pair `INVALID_ARGUMENT`,
/// an HCA that cannot make the pair `INTERNAL`.
fn verbs_status(e: crate::hca::VerbsError) -> Status {
    use crate::hca::VerbsError as E;
    let msg = e.to_string();
    match e {
        E::Unavailable(_) | E::GpuUnavailable(_) => Status::failed_precondition(msg),
        E::Pair(_) => Status::invalid_argument(msg),
        E::Hca(_) | E::Register(_) | E::RegisterGpu { .. } => Status::internal(msg),
    }
}

/// Refuses `req` unless a cluster member (the master, an operator) made
/// it: an application session may only connect RDMA queue pairs here.
fn members_only<T>(req: &Request<T>, what: &str) -> Result<(), Status> {
    match credential::principal(req) {
        Some(Principal::Member) => Ok(()),
        _ => Err(Status::permission_denied(format!(
            "{what} needs the cluster token (nodes and operators); a session credential does not reach it"
        ))),
    }
}
