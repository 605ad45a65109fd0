//! The one mapping from core errors to gRPC statuses, with a typed reason
//! in the details where a caller acts on it (no GPU, a node down, an
//! agent that failed), so clients never read message text.

use oncilla_model::echo::clip;
use oncilla_proto::status::{with_reason, Reason};
use tonic::{Code, Status};

use crate::error::{CoreError, LinkError};
use crate::pool::PoolError;

/// When a standby that knows no leader asks callers to try again.
const STANDBY_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

impl From<CoreError> for Status {
    fn from(e: CoreError) -> Self {
        let msg = e.to_string();
        match e {
            CoreError::NoSuchAllocation(_)
            | CoreError::NoSuchName(_)
            | CoreError::NoSuchSession(_) => Status::not_found(msg),
            CoreError::NameTaken(..) => Status::already_exists(msg),
            CoreError::InUse { .. } | CoreError::Superseded(_) => Status::aborted(msg),
            CoreError::UnknownNode { name, .. } => {
                with_reason(Code::InvalidArgument, msg, Reason::NodeDown, clip(&name))
            }
            CoreError::InvalidArgument(_) | CoreError::Invalid(_) => Status::invalid_argument(msg),
            // A node that could not do its part (unreachable, or refused).
            CoreError::NodeDown(node) => {
                with_reason(Code::FailedPrecondition, msg, Reason::NodeDown, &node)
            }
            CoreError::NoGpu(_) => with_reason(Code::FailedPrecondition, msg, Reason::NoGpu, ""),
            CoreError::Agent { node, source } => {
                let reason = match source {
                    LinkError::NoGpu(_) => Reason::NoGpu,
                    _ => Reason::AgentFailed,
                };
                with_reason(Code::FailedPrecondition, msg, reason, &node)
            }
            CoreError::CapacityExhausted { .. }
            | CoreError::TooManySessions { .. }
            | CoreError::Pool(
                PoolError::Exhausted { .. }
                | PoolError::Fragmented { .. }
                | PoolError::Descriptors { .. }
                | PoolError::DescriptorShare { .. },
            ) => Status::resource_exhausted(msg),
            CoreError::PermissionDenied(_) => Status::permission_denied(msg),
            CoreError::Quota(_) => with_reason(Code::ResourceExhausted, msg, Reason::Quota, ""),
            CoreError::NodeUp(..) | CoreError::NodeDraining(_) => Status::failed_precondition(msg),
            CoreError::CannotMove(_) => {
                with_reason(Code::FailedPrecondition, msg, Reason::CannotMove, "")
            }
            CoreError::QuotaStore(_) => Status::failed_precondition(msg),
            // The one UNAVAILABLE a server gives itself; the message starts
            // with "master" so callers do not reword it as unreachable.
            CoreError::Recovering(left) => oncilla_proto::status::recovering(msg, left),
            CoreError::Standby { leader } => {
                oncilla_proto::status::standby(msg, leader.as_deref(), STANDBY_RETRY)
            }
            CoreError::Deposed { .. } => Status::failed_precondition(msg),
            // "Outcome unknown", as a deadline that passed mid-call.
            CoreError::Lapsed { .. } => Status::deadline_exceeded(msg),
            CoreError::Internal(_) | CoreError::Pool(_) => Status::internal(msg),
        }
    }
}

/// How a failed call to a peer reads to the core: typed by its reason or
/// code, with the message `wrap` made of it (which names the peer).
pub fn link_error(s: &Status, message: String) -> LinkError {
    match (oncilla_proto::status::reason(s), s.code()) {
        (Some((Reason::NoGpu, _)), _) => LinkError::NoGpu(message),
        (Some((Reason::CannotMove, _)), _) => LinkError::CannotMove(message),
        (_, Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown) => {
            LinkError::Unreachable(message)
        }
        (_, Code::PermissionDenied | Code::Unauthenticated) => LinkError::Denied(message),
        _ => LinkError::Refused(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_gpu_travels_as_a_reason_through_an_agent_failure() {
        let agent_said = Status::from(CoreError::NoGpu("no GPU on node b".into()));
        let link = link_error(&agent_said, agent_said.message().to_string());
        assert!(matches!(link, LinkError::NoGpu(_)));
        let master_says = Status::from(CoreError::Agent {
            node: "b".into(),
            source: link,
        });
        assert_eq!(
            oncilla_proto::status::reason(&master_says),
            Some((Reason::NoGpu, "b".to_string()))
        );
        let down = Status::from(CoreError::NodeDown("c".into()));
        assert_eq!(
            oncilla_proto::status::reason(&down),
            Some((Reason::NodeDown, "c".to_string()))
        );
    }
}
