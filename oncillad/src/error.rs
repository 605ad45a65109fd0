//! Errors of the daemon's core (agent and master) and of the ports it
//! reaches peers through. The core returns these; only `grpc/` turns them
//! into gRPC statuses (`grpc::status`), so nothing here knows a transport.

use oncilla_model::alloc::Invalid;
use oncilla_model::echo::Echo;
use oncilla_model::size::HumanBytes;

use crate::pool::PoolError;

/// A request the core could not serve.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("no such allocation: {0}")]
    NoSuchAllocation(u64),
    #[error("no allocation is named {}", Echo(.0))]
    NoSuchName(String),
    #[error("the name {} is taken by allocation {}", Echo(.0), .1)]
    NameTaken(String, u64),
    #[error("allocation {id} is attached by {by}; detach them first or free with force")]
    InUse { id: u64, by: String },
    #[error("internal error: {0}")]
    Internal(String),
    #[error("no such session: {} (open a session first)", Echo(.0))]
    NoSuchSession(String),
    #[error("unknown node {}; known nodes: {known}", Echo(name))]
    UnknownNode { name: String, known: String },
    #[error("node {0} is down")]
    NodeDown(String),
    #[error(
        "node {0} is being drained: nothing new is placed on it (`ocmctl undrain {0}` ends it)"
    )]
    NodeDraining(String),
    /// An operator removing a node that is not down.
    #[error("node {0} is {1}, not down: stop its agent (it leaves by itself), or remove it once it is down")]
    NodeUp(String, &'static str),
    #[error("not enough capacity for {}: {detail}", HumanBytes(*.requested))]
    CapacityExhausted { requested: u64, detail: String },
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// An allocation that cannot leave its node now (draining it waits).
    #[error("cannot move it now: {0}")]
    CannotMove(String),
    /// A copy change that a later one, applied first, overrides.
    #[error("superseded: {0}")]
    Superseded(String),
    /// A request the model refuses (sizes, names, kinds).
    #[error("invalid request: {0}")]
    Invalid(#[from] Invalid),
    /// GPU memory asked where there is none.
    #[error("{0}")]
    NoGpu(String),
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error(
        "user {uid} has {open} sessions open on this node, the most one user may; end some first"
    )]
    TooManySessions { uid: u32, open: usize },
    /// A user's request past one of their quotas.
    #[error(transparent)]
    Quota(#[from] oncilla_model::quota::Exceeded),
    /// Quotas cannot be changed (no file to keep them in).
    #[error("{0}")]
    QuotaStore(String),
    #[error("agent {node} failed: {source}")]
    Agent {
        node: String,
        #[source]
        source: LinkError,
    },
    #[error("master recovering after a start: agents are re-registering; retry in {} ms", .0.as_millis())]
    Recovering(std::time::Duration),
    /// A master of an older term than this node follows (fencing).
    #[error("{}", deposed(*term, *follows))]
    Deposed { term: u64, follows: u64 },
    /// This master's leadership ended while it served a call: what the
    /// call did may be undone by the next leader, so it is not confirmed.
    #[error("this master's leadership (term {term}) ended during the call; its outcome is unknown (the new leader keeps or releases what it did): check, then retry")]
    Lapsed { term: u64 },
    /// This master does not lead (a standby, or it lost its lease).
    #[error("master is a standby{}", .leader.as_ref().map_or_else(|| "; no leader is elected yet".to_string(), |l| format!("; the leader is at {l}")))]
    Standby { leader: Option<String> },
    #[error(transparent)]
    Pool(#[from] PoolError),
}

/// Why a master of `term` may not change a node that follows `follows`.
fn deposed(term: u64, follows: u64) -> String {
    match term {
        0 => format!("a master that was not elected may not change this node: it follows the elected master of term {follows}"),
        _ => format!("a master of term {term} was deposed: this node follows the master of term {follows}"),
    }
}

/// A peer reached through a port (the master's `AgentLink`, the agent's
/// `MasterPort`) that did not do what was asked. The message is complete
/// and says which peer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LinkError {
    /// It could not be reached, or did not answer in time.
    #[error("{0}")]
    Unreachable(String),
    /// It has no GPU for device memory.
    #[error("{0}")]
    NoGpu(String),
    /// It refused to let an allocation move now, and changed nothing.
    #[error("{0}")]
    CannotMove(String),
    /// It refused for another reason.
    #[error("{0}")]
    Refused(String),
    /// It refused who is asking (a credential it does not accept, a name
    /// another live agent holds): asking again will not change that.
    #[error("{0}")]
    Denied(String),
    /// It answered something that cannot be right.
    #[error("{0}")]
    BadReply(String),
}
