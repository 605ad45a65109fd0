//! What a failed verbs copy means for the caller: the classification of
//! RDMA failures into [`Error`] (a refused remote key is
//! [`Error::NotFound`]: the allocation was freed, or the agent restarted;
//! retries exhausted, a response timeout or our own deadline is
//! [`Error::NodeUnreachable`]; anything else [`Error::Fabric`]), each
//! naming the node and the allocation, and the rule that a failed queue
//! pair is stopped before the memory its requests name is let go. It
//! never posts, registers or connects.

use oncilla_rdma::verbs::Qp;
use oncilla_rdma::wc;

use super::plan::{RunError, Unaddressable};
use crate::error::Error;

/// What a copy is about, for its errors.
pub(super) struct Place<'a> {
    pub node: &'a str,
    pub addr: &'a str,
    pub alloc_id: u64,
}

impl Place<'_> {
    pub(super) fn fabric(&self, e: impl std::fmt::Display) -> Error {
        Error::Fabric {
            node: self.node.to_string(),
            addr: self.addr.to_string(),
            reason: format!("verbs, allocation {}: {e}", self.alloc_id),
        }
    }

    pub(super) fn unreachable(&self, e: impl std::fmt::Display) -> Error {
        Error::NodeUnreachable {
            node: self.node.to_string(),
            addr: self.addr.to_string(),
            reason: format!("verbs, allocation {}: {e}", self.alloc_id),
        }
    }

    pub(super) fn not_found(&self, why: &str) -> Error {
        Error::NotFound(format!(
            "no such allocation on {}: {} ({why})",
            self.node, self.alloc_id
        ))
    }

    pub(super) fn unaddressable(&self, e: Unaddressable) -> Failed {
        match e {
            Unaddressable::Restarted { .. } => self.not_found(&e.to_string()),
            Unaddressable::NoRegion { .. } => self.fabric(&e),
        }
        .into()
    }

    /// What a failed run means for the caller.
    pub(super) fn failed(&self, e: &RunError) -> Error {
        match e {
            RunError::Completion { failure, .. } if failure.status == wc::REM_ACCESS_ERR => {
                self.not_found(&format!(
                    "the agent refused its RDMA key: the allocation was freed, or the agent restarted with an empty pool; {e}"
                ))
            }
            RunError::Completion { failure, .. }
                if matches!(failure.status, wc::RETRY_EXC_ERR | wc::RESP_TIMEOUT_ERR) =>
            {
                self.unreachable(e)
            }
            RunError::Timeout { .. } => self.unreachable(e),
            _ => self.fabric(e),
        }
    }
}

/// A failed copy: `Unfenced` when the pair could not be stopped, so the
/// memory its requests name must stay registered and alive; `Stalled`
/// when the pair was stopped after it stopped making progress (no
/// completion before our deadline, the HCA's retries ran out, or a flush
/// before any other error: it was broken already), which a fresh pair may
/// not repeat.
#[derive(Debug)]
pub(super) enum Failed {
    Fenced(Error),
    Stalled(Error),
    Unfenced(Error),
}

impl Failed {
    pub(super) fn into_error(self) -> Error {
        match self {
            Failed::Fenced(e) | Failed::Stalled(e) | Failed::Unfenced(e) => e,
        }
    }

    pub(super) fn error(&self) -> &Error {
        match self {
            Failed::Fenced(e) | Failed::Stalled(e) | Failed::Unfenced(e) => e,
        }
    }
}

impl From<Error> for Failed {
    fn from(e: Error) -> Self {
        Failed::Fenced(e)
    }
}

/// The outcome of a run on `qp`: on failure the pair is stopped first,
/// so no request can touch memory after the caller lets it go.
pub(super) fn settle(
    qp: &mut Qp,
    at: &Place<'_>,
    outcome: std::result::Result<(), RunError>,
) -> std::result::Result<(), Failed> {
    let Err(e) = outcome else {
        return Ok(());
    };
    let stalled = match &e {
        RunError::Timeout { .. } => true,
        // A flush as the first error seen: the pair was already broken
        // before this copy posted anything that failed.
        RunError::Completion { failure, .. } => matches!(
            failure.status,
            wc::RETRY_EXC_ERR | wc::RESP_TIMEOUT_ERR | wc::WR_FLUSH_ERR
        ),
        _ => false,
    };
    let error = if matches!(e, RunError::Timeout { .. }) {
        // What the HCA says of the pair tells a lost peer (RTS, retrying)
        // from a pair the HCA stopped by itself (ERROR).
        let state = qp.hw_state().unwrap_or("unknown");
        at.unreachable(format!("{e}; the queue pair is in state {state}"))
    } else {
        at.failed(&e)
    };
    match qp.stop() {
        Ok(()) if stalled => Err(Failed::Stalled(error)),
        Ok(()) => Err(Failed::Fenced(error)),
        Err(why) => {
            tracing::error!(
                node = at.node,
                "cannot stop a failed verbs queue pair ({why}); keeping its buffers registered"
            );
            Err(Failed::Unfenced(error))
        }
    }
}
