//! What ocmctl reports on failure: every subcommand's error, shown as one
//! line on stderr before a non-zero exit.

use oncilla_cluster::ClusterError;
use oncilla_net::auth::TokenError;
use oncilla_ops::{certs, MasterError};

use oncilla_bench::BenchError;

/// What ocmctl reports on failure: one line, then exit status 1 (a
/// program run by `ocmctl run` passes its own status; a closed standard
/// output ends quietly).
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
    /// The program `ocmctl run` ran did not succeed: ocmctl exits with
    /// `code` (its exit status, or 128 + the signal that killed it), and
    /// says `why` when the program could not (a signal).
    #[error("{}", why.as_deref().unwrap_or("the program failed"))]
    Child { code: u8, why: Option<String> },
    /// Standard output was closed by its reader (`ocmctl show 4 | head`):
    /// ocmctl stops printing and ends quietly, as a filter should.
    #[error("standard output was closed")]
    Closed,
}
