//! Errors of the daemon's core (agent and master), and their one mapping to
//! gRPC status codes. The core returns these; only `grpc/` turns them into
//! `tonic::Status`.

use oncilla_model::size::HumanBytes;

use crate::pool::PoolError;

/// A request the core could not serve.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("no such allocation: {0}")]
    NoSuchAllocation(u64),
    #[error("no allocation is named {0:?}")]
    NoSuchName(String),
    #[error("the name {0:?} is taken by allocation {1}")]
    NameTaken(String, u64),
    #[error("allocation {id} is attached by {by}; detach them first or free with force")]
    InUse { id: u64, by: String },
    #[error("internal error: {0}")]
    Internal(String),
    #[error("no such session: {0} (open a session first)")]
    NoSuchSession(String),
    #[error("unknown node {name:?}; known nodes: {known}")]
    UnknownNode { name: String, known: String },
    #[error("node {0} is down")]
    NodeDown(String),
    #[error("not enough capacity for {}: {detail}", HumanBytes(*.requested))]
    CapacityExhausted { requested: u64, detail: String },
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// GPU memory asked where there is none; the message starts with "no
    /// GPU", which is how clients recognise it (see liboncilla's error).
    #[error("{0}")]
    NoGpu(String),
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("agent {node} failed: {reason}")]
    Agent { node: String, reason: String },
    #[error("master recovering after a start: agents are re-registering; retry in {} ms", .0.as_millis())]
    Recovering(std::time::Duration),
    #[error(transparent)]
    Pool(#[from] PoolError),
}

impl From<CoreError> for tonic::Status {
    fn from(e: CoreError) -> Self {
        use tonic::Status;
        let msg = e.to_string();
        match e {
            CoreError::NoSuchAllocation(_)
            | CoreError::NoSuchName(_)
            | CoreError::NoSuchSession(_) => Status::not_found(msg),
            CoreError::NameTaken(..) => Status::already_exists(msg),
            CoreError::InUse { .. } => Status::aborted(msg),
            CoreError::UnknownNode { .. } | CoreError::InvalidArgument(_) => {
                Status::invalid_argument(msg)
            }
            // A node that could not do its part (unreachable, or refused).
            CoreError::NodeDown(_) | CoreError::Agent { .. } | CoreError::NoGpu(_) => {
                Status::failed_precondition(msg)
            }
            CoreError::CapacityExhausted { .. } | CoreError::Pool(PoolError::Exhausted { .. }) => {
                Status::resource_exhausted(msg)
            }
            CoreError::PermissionDenied(_) => Status::permission_denied(msg),
            // The one UNAVAILABLE a server gives itself; the message starts
            // with "master" so callers do not reword it as unreachable.
            CoreError::Recovering(_) => Status::unavailable(msg),
            CoreError::Internal(_) | CoreError::Pool(_) => Status::internal(msg),
        }
    }
}
