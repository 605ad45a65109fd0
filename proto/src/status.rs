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
    /// The master asked is a standby (see [`standby`]).
    Standby,
    /// An allocation cannot leave its node now; nothing was changed.
    CannotMove,
}

impl Reason {
    fn wire(self) -> pb::ErrorReason {
        match self {
            Reason::NoGpu => pb::ErrorReason::ErrorNoGpu,
            Reason::NodeDown => pb::ErrorReason::ErrorNodeDown,
            Reason::AgentFailed => pb::ErrorReason::ErrorAgentFailed,
            Reason::Recovering => pb::ErrorReason::ErrorRecovering,
            Reason::Quota => pb::ErrorReason::ErrorQuota,
            Reason::Standby => pb::ErrorReason::ErrorStandby,
            Reason::CannotMove => pb::ErrorReason::ErrorCannotMove,
        }
    }
}

/// A status with `reason` (about `node`, empty when none) attached.
pub fn with_reason(code: Code, message: impl Into<String>, reason: Reason, node: &str) -> Status {
    let detail = pb::ErrorDetail {
        reason: reason.wire() as i32,
        node: node.to_string(),
        retry_after_ms: 0,
        leader: String::new(),
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
        leader: String::new(),
    };
    Status::with_details(Code::Unavailable, message, detail.encode_to_vec().into())
}

/// A standby master's refusal: `UNAVAILABLE`, [`Reason::Standby`], the
/// leader's address when one is known, and when to ask again.
pub fn standby(
    message: impl Into<String>,
    leader: Option<&str>,
    again: std::time::Duration,
) -> Status {
    let detail = pb::ErrorDetail {
        reason: pb::ErrorReason::ErrorStandby as i32,
        node: String::new(),
        retry_after_ms: u64::try_from(again.as_millis()).unwrap_or(u64::MAX),
        leader: leader.unwrap_or_default().to_string(),
    };
    Status::with_details(Code::Unavailable, message, detail.encode_to_vec().into())
}

/// Where a standby master said the leader is (`Some(None)`: it knows of
/// none yet), when `status` is a standby's refusal.
pub fn standby_leader(status: &Status) -> Option<Option<String>> {
    let detail = pb::ErrorDetail::decode(status.details()).ok()?;
    (detail.reason == pb::ErrorReason::ErrorStandby as i32)
        .then(|| Some(detail.leader).filter(|l| !l.is_empty()))
}

/// How long the master asks a caller to wait, when `status` is its
/// refusal while it recovers or a standby's (one that reached the caller
/// knew no leader, or named one that could not be reached: a leader whose
/// lease has yet to run out).
pub fn retry_after(status: &Status) -> Option<std::time::Duration> {
    let detail = pb::ErrorDetail::decode(status.details()).ok()?;
    let waits = detail.reason == pb::ErrorReason::ErrorRecovering as i32
        || detail.reason == pb::ErrorReason::ErrorStandby as i32;
    waits.then(|| std::time::Duration::from_millis(detail.retry_after_ms))
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
        pb::ErrorReason::ErrorStandby => Reason::Standby,
        pb::ErrorReason::ErrorCannotMove => Reason::CannotMove,
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

    #[test]
    fn a_standby_names_the_leader_or_asks_to_wait_while_none_leads() {
        let at = standby(
            "standby",
            Some("10.0.0.2:7070"),
            std::time::Duration::from_millis(200),
        );
        assert_eq!(at.code(), Code::Unavailable);
        assert_eq!(standby_leader(&at), Some(Some("10.0.0.2:7070".to_string())));
        assert_eq!(
            retry_after(&at),
            Some(std::time::Duration::from_millis(200))
        );
        assert_eq!(reason(&at).map(|r| r.0), Some(Reason::Standby));
        let none = standby("standby", None, std::time::Duration::from_millis(200));
        assert_eq!(standby_leader(&none), Some(None));
        assert_eq!(
            retry_after(&none),
            Some(std::time::Duration::from_millis(200))
        );
        let rec = recovering("recovering", std::time::Duration::from_millis(5));
        assert_eq!(standby_leader(&rec), None);
    }
}
