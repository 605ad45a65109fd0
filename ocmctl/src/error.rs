//! What ocmctl reports on failure: every subcommand's error, shown as one
//! line on stderr before a non-zero exit.

use oncilla_cluster::ClusterError;
use oncilla_net::auth::TokenError;
use oncilla_ops::{certs, MasterError};

use oncilla_bench::BenchError;

/// What ocmctl reports on failure: one line, then exit status 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(transparent)]
    Master(#[from] MasterError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Bench(#[from] BenchError),
    #[error(transparent)]
    Data(#[from] liboncilla::Error),
    #[error(transparent)]
    Fabric(#[from] oncilla_model::fabric::UnknownFabric),
    #[error(transparent)]
    Certs(#[from] certs::CertError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}
