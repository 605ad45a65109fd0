//! What a benchmark reports on failure, by kind. It owns the messages; it
//! never decides whether a measurement is good.

use oncilla_cluster::ClusterError;
use oncilla_net::auth::TokenError;
use oncilla_ops::MasterError;
use oncilla_proto::client::AddrError;

/// A benchmark's failure.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(transparent)]
    Addr(#[from] AddrError),
    #[error(transparent)]
    Master(#[from] MasterError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// An agent's status call failed; shown as its message.
    #[error("{}", .0.message())]
    Rpc(tonic::Status),
    #[error(transparent)]
    Data(#[from] liboncilla::Error),
    #[error(transparent)]
    Fabric(#[from] oncilla_model::fabric::UnknownFabric),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A bad option value; the message names the flag.
    #[error("{0}")]
    Usage(String),
    /// A copy that did not read back, corrupted bytes or leaks.
    #[error("{0}")]
    Verify(String),
    /// The benchmark could not go on (a thread, worker, server or cluster
    /// state it needs).
    #[error("{0}")]
    Failed(String),
}
