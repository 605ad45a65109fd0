//! The gRPC services in the model's vocabulary, for the programs that call
//! them (liboncilla, `ocmctl` and the cluster launcher, the benchmarks):
//! each method builds its request from domain values and reads the answer
//! through [`crate::convert`], so no caller outside this crate and the
//! daemon's `grpc/` edge handles a protobuf message.
//!
//! It owns no connection policy ([`crate::client`] dials) and never
//! retries (callers wrap a call in [`crate::client::through_recovery`]).

mod agent;
mod master;
mod session;

pub use agent::{Agent, VerbsPair};
pub use master::{AllocationPage, Master};
pub use session::{Session, SessionEvent, SessionEvents};

use crate::convert::WireError;

/// Why a typed call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The peer refused, or could not be reached (shown as its message).
    #[error("{}", .0.message())]
    Rpc(#[from] tonic::Status),
    /// The peer answered something this side cannot read.
    #[error(transparent)]
    Malformed(#[from] Malformed),
}

impl CallError {
    /// The peer's or the transport's status, when the call got one.
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            CallError::Rpc(s) => Some(s),
            CallError::Malformed(_) => None,
        }
    }
}

/// An answer that does not convert into its domain value.
#[derive(Debug, thiserror::Error)]
#[error("the {peer} answered a malformed {what}: {error}")]
pub struct Malformed {
    /// "master" or "agent".
    pub peer: &'static str,
    /// What was answered ("allocation", "node list", …).
    pub what: &'static str,
    #[source]
    pub error: WireError,
}

/// `reply` read as a domain value, or [`Malformed`] naming the peer and
/// what it answered.
fn read<W, D>(peer: &'static str, what: &'static str, reply: W) -> Result<D, CallError>
where
    D: TryFrom<W, Error = WireError>,
{
    D::try_from(reply).map_err(|error| Malformed { peer, what, error }.into())
}
