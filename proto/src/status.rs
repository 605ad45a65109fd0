//! Typed failure reasons carried across gRPC: a server attaches a
//! [`Reason`] to a `tonic::Status` as encoded [`pb::ErrorDetail`] bytes, and
//! a client reads it back. The message stays for people; programs read the
//! reason.

use prost::Message;
use tonic::{Code, Status};

use crate::pb;

/// Why a call failed, beyond its status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Device memory was asked for where there is none.
    NoGpu,
    /// A node the request needs is down or unknown.
    NodeDown,
    /// An agent could not do its part.
    AgentFailed,
    /// The master is in its recovery window (see [`retry_after`]).
    Recovering,
    /// The request would take its user past a quota.
    Quota,
}

impl Reason {
    fn wire(self) -> pb::ErrorReason {
        match self {
            Reason::NoGpu => pb::ErrorReason::ErrorNoGpu,
            Reason::NodeDown => pb::ErrorReason::ErrorNodeDown,
            Reason::AgentFailed => pb::ErrorReason::ErrorAgentFailed,
            Reason::Recovering => pb::ErrorReason::ErrorRecovering,
            Reason::Quota => pb::ErrorReason::ErrorQuota,
        }
    }
}

/// A status with `reason` (about `node`, empty when none) attached.
pub fn with_reason(code: Code, message: impl Into<String>, reason: Reason, node: &str) -> Status {
    let detail = pb::ErrorDetail {
        reason: reason.wire() as i32,
        node: node.to_string(),
        retry_after_ms: 0,
    };
    Status::with_details(code, message, detail.encode_to_vec().into())
}

/// The master's refusal while it recovers: `UNAVAILABLE`, [`Reason::Recovering`]
/// and how long it still waits.
pub fn recovering(message: impl Into<String>, left: std::time::Duration) -> Status {
    let detail = pb::ErrorDetail {
        reason: pb::ErrorReason::ErrorRecovering as i32,
        node: String::new(),
        retry_after_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
    };
    Status::with_details(Code::Unavailable, message, detail.encode_to_vec().into())
}

/// How long the master asks a caller to wait, when `status` is its
/// refusal while it recovers.
pub fn retry_after(status: &Status) -> Option<std::time::Duration> {
    let detail = pb::ErrorDetail::decode(status.details()).ok()?;
    (detail.reason == pb::ErrorReason::ErrorRecovering as i32)
        .then(|| std::time::Duration::from_millis(detail.retry_after_ms))
}

/// The reason attached to `status` and the node it names, if any.
pub fn reason(status: &Status) -> Option<(Reason, String)> {
    let detail = pb::ErrorDetail::decode(status.details()).ok()?;
    let reason = match pb::ErrorReason::try_from(detail.reason).ok()? {
        pb::ErrorReason::Unspecified => return None,
        pb::ErrorReason::ErrorNoGpu => Reason::NoGpu,
        pb::ErrorReason::ErrorNodeDown => Reason::NodeDown,
        pb::ErrorReason::ErrorAgentFailed => Reason::AgentFailed,
        pb::ErrorReason::ErrorRecovering => Reason::Recovering,
        pb::ErrorReason::ErrorQuota => Reason::Quota,
    };
    Some((reason, detail.node))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_survives_the_status_and_plain_statuses_have_none() {
        let s = with_reason(
            Code::FailedPrecondition,
            "whatever text",
            Reason::NoGpu,
            "n1",
        );
        assert_eq!(reason(&s), Some((Reason::NoGpu, "n1".to_string())));
        assert_eq!(s.message(), "whatever text");
        assert_eq!(reason(&Status::failed_precondition("no GPU here")), None);
    }
}
