//! Why a local cluster could not be started, driven or waited for. It owns
//! the messages the launcher reports; it never decides what to do about them.

use std::path::PathBuf;
use std::time::Duration;

use oncilla_ops::master::MasterError;

/// A local cluster's failure.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A file or directory of the cluster could not be made.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The cluster's TLS certificates could not be made or read.
    #[error(transparent)]
    Certs(#[from] oncilla_ops::certs::CertError),
    #[error(transparent)]
    Tls(#[from] oncilla_net::tls::TlsError),
    /// This program's own path is unknown (to re-execute it as a daemon).
    #[error("cannot find own executable: {0}")]
    OwnExe(#[source] std::io::Error),
    /// A daemon process could not be started.
    #[error("cannot start {name}: {source}")]
    Spawn {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// No loopback port was free.
    #[error("no free loopback port in 20000..32000")]
    NoPort,
    /// A daemon exited while the cluster was coming up.
    #[error("{name} exited ({status}) during start-up:\n{log_tail}")]
    Exited {
        name: String,
        status: std::process::ExitStatus,
        log_tail: String,
    },
    /// The cluster did not come up in time.
    #[error("cluster not up after {}s ({up} of {agents} agents registered); logs in {}", limit.as_secs(), dir.display())]
    NotUp {
        limit: Duration,
        up: usize,
        agents: usize,
        dir: PathBuf,
    },
    /// A restarted agent did not register again in time.
    #[error("etcd not up and healthy (waited at most {}s, less if a member exited); its members:\n{members}", limit.as_secs())]
    EtcdNotUp {
        limit: Duration,
        /// Each member's state and its log's last lines.
        members: String,
    },
    #[error("{name} did not come back within {}s; log in {}", limit.as_secs(), log.display())]
    NotBack {
        name: String,
        limit: Duration,
        log: PathBuf,
    },
    /// The cluster has no such agent.
    #[error("no agent {0} in this cluster")]
    NoAgent(String),
    /// Agent `{0}` is running already.
    #[error("agent {0} is running")]
    Running(String),
    /// The master could not be asked.
    #[error(transparent)]
    Master(#[from] MasterError),
    /// Ctrl-C and SIGTERM handlers could not be installed.
    #[error("cannot install signal handlers")]
    Signals,
    /// The runtime or work thread could not be set up.
    #[error("cannot start {what}: {source}")]
    Setup {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The work thread ended without an answer.
    #[error("work thread died")]
    WorkDied,
    /// Ctrl-C arrived; the cluster was stopped.
    #[error("interrupted; cluster stopped")]
    Interrupted,
    /// SIGTERM arrived; the cluster was stopped.
    #[error("terminated; cluster stopped")]
    Terminated,
}

impl ClusterError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
