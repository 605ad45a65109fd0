//! The library's one error type. Messages from the cluster are complete
//! sentences ("not enough capacity for 1.0 GiB: ..."), shown verbatim.

use oncilla_net::auth::TokenError;

/// Everything that can go wrong in liboncilla.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The local agent's Unix socket cannot be reached.
    #[error("cannot reach the local oncillad at {path}: {reason} (is the agent running? set ONCILLA_SOCKET to its --socket)")]
    AgentUnreachable { path: String, reason: String },
    /// The master (or another daemon) could not be reached.
    #[error("{0}")]
    Unavailable(String),
    /// Unknown or already freed allocation (or session).
    #[error("{0}")]
    NotFound(String),
    /// The cluster has not enough free memory; the message says where what is free.
    #[error("{0}")]
    CapacityExhausted(String),
    /// The request would take this process's user past one of their
    /// quotas; the message names the limit, what is in use, and how to
    /// get room.
    #[error("{0}")]
    QuotaExceeded(String),
    /// Wrong token or access key, or another session's allocation.
    #[error("{0}")]
    PermissionDenied(String),
    /// A request the cluster rejected as malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// A named node is down.
    #[error("{0}")]
    NodeDown(String),
    /// The name is taken by another allocation.
    #[error("{0}")]
    AlreadyExists(String),
    /// Other processes are attached; free with force to free anyway.
    #[error("{0}")]
    InUse(String),
    /// A copy outside the allocation.
    #[error(
        "out of bounds: {len} bytes at offset {offset} do not fit in an allocation of {size} bytes"
    )]
    OutOfBounds { offset: u64, len: u64, size: u64 },
    /// A node holding bytes of the allocation cannot be reached (down,
    /// restarting, or the network between is broken). Copies that touch
    /// only other nodes still work.
    #[error("node {node} unreachable at {addr}: {reason}")]
    NodeUnreachable {
        node: String,
        addr: String,
        reason: String,
    },
    /// The data path to a node failed.
    #[error("data transfer with {node} at {addr} failed: {reason}")]
    Fabric {
        node: String,
        addr: String,
        reason: String,
    },
    /// GPU memory was asked for where there is none (no CUDA driver, no
    /// such device); the message says which node and why.
    #[error("{0}")]
    NoGpu(String),
    /// The CUDA driver failed a copy or an allocation on a GPU.
    #[error("{0}")]
    Gpu(String),
    /// Remote memory cannot be mapped into this process (userfaultfd is
    /// not allowed, the kernel is too old, the memory is a GPU's), or its
    /// demand paging failed; the message says what to change.
    #[error("{0}")]
    Map(String),
    /// No usable cluster token.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// A bug or an unexpected answer.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<oncilla_cuda::CudaError> for Error {
    fn from(e: oncilla_cuda::CudaError) -> Self {
        use oncilla_cuda::CudaError as E;
        match e {
            E::NoDriver | E::Init(_) | E::NoSuchDevice { .. } => Self::NoGpu(e.to_string()),
            E::OutOfMemory { .. } => Self::CapacityExhausted(e.to_string()),
            E::OutOfBounds { offset, len, size } => Self::OutOfBounds { offset, len, size },
            E::Overlap { .. } => Self::InvalidArgument(e.to_string()),
            E::Driver { .. } | E::Pipeline(_) => Self::Gpu(e.to_string()),
        }
    }
}

/// Result alias for liboncilla.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<tonic::Status> for Error {
    /// The typed reason a daemon attached ([`oncilla_proto::status`]) wins;
    /// otherwise the status code decides. The message is never read.
    fn from(s: tonic::Status) -> Self {
        use oncilla_proto::status::{reason, Reason};
        use tonic::Code;
        let msg = s.message().to_string();
        // A node that is down is FAILED_PRECONDITION whatever the reason
        // says; an unknown named node (NodeDown on INVALID_ARGUMENT) stays
        // an invalid argument, as it always was.
        match reason(&s) {
            Some((Reason::NoGpu, _)) => return Self::NoGpu(msg),
            Some((Reason::Quota, _)) => return Self::QuotaExceeded(msg),
            _ => {}
        }
        match s.code() {
            Code::NotFound => Self::NotFound(msg),
            Code::ResourceExhausted => Self::CapacityExhausted(msg),
            Code::Unauthenticated | Code::PermissionDenied => Self::PermissionDenied(msg),
            Code::InvalidArgument | Code::OutOfRange => Self::InvalidArgument(msg),
            Code::FailedPrecondition => Self::NodeDown(msg),
            Code::AlreadyExists => Self::AlreadyExists(msg),
            Code::Aborted => Self::InUse(msg),
            Code::Unavailable | Code::DeadlineExceeded => Self::Unavailable(msg),
            _ => Self::Internal(format!("{:?}: {msg}", s.code())),
        }
    }
}

impl From<oncilla_proto::calls::CallError> for Error {
    fn from(e: oncilla_proto::calls::CallError) -> Self {
        match e {
            oncilla_proto::calls::CallError::Rpc(s) => s.into(),
            oncilla_proto::calls::CallError::Malformed(m) => Self::Internal(m.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use oncilla_proto::status::{with_reason, Reason};
    use tonic::{Code, Status};

    use super::*;

    #[test]
    fn reasons_decide_over_codes_and_text_is_never_read() {
        let no_gpu = with_reason(Code::FailedPrecondition, "whatever", Reason::NoGpu, "n1");
        assert!(matches!(Error::from(no_gpu), Error::NoGpu(m) if m == "whatever"));
        // No GPU travels whatever code the edge picked.
        let no_gpu = with_reason(Code::Internal, "forwarded", Reason::NoGpu, "n1");
        assert!(matches!(Error::from(no_gpu), Error::NoGpu(_)));
        let down = with_reason(Code::FailedPrecondition, "gone", Reason::NodeDown, "n2");
        assert!(matches!(Error::from(down), Error::NodeDown(_)));
        let unknown = with_reason(Code::InvalidArgument, "no node x", Reason::NodeDown, "x");
        assert!(matches!(Error::from(unknown), Error::InvalidArgument(_)));
        // Text that looks like a reason is only text.
        let text = Status::failed_precondition("no GPU on n1");
        assert!(matches!(Error::from(text), Error::NodeDown(_)));
        let quota = with_reason(Code::ResourceExhausted, "over", Reason::Quota, "");
        assert!(matches!(Error::from(quota), Error::QuotaExceeded(m) if m == "over"));
        assert!(matches!(
            Error::from(Status::resource_exhausted("full")),
            Error::CapacityExhausted(_)
        ));
        let agent = with_reason(Code::Internal, "agent said no", Reason::AgentFailed, "n3");
        assert!(matches!(Error::from(agent), Error::Internal(_)));
        assert!(matches!(
            Error::from(Status::not_found("x")),
            Error::NotFound(_)
        ));
        assert!(matches!(Error::from(Status::aborted("x")), Error::InUse(_)));
        assert!(matches!(
            Error::from(Status::unauthenticated("x")),
            Error::PermissionDenied(_)
        ));
    }
}
