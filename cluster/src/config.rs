//! What a local cluster looks like before it starts: the program that runs
//! the daemons, each agent's pool, heartbeats, waits, extra arguments and
//! how daemons are stopped. It owns no process; [`crate::launcher`] does.

use std::path::PathBuf;
use std::time::Duration;

/// The program that runs each daemon.
#[derive(Debug, Clone)]
pub enum Daemon {
    /// An `oncillad` binary (the integration tests use the one cargo built
    /// beside them).
    Binary(PathBuf),
    /// This very executable, with this hidden first argument (`ocmctl
    /// oncillad ...` runs `oncillad::main_with`): one binary is enough,
    /// and the daemons are always the same build as the program.
    ReExec(String),
}

/// How the cluster's daemons are stopped when it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL at once (tests: nothing to wait for).
    Kill,
    /// SIGTERM to all, SIGKILL to whichever has not exited after this long.
    Term(Duration),
}

/// Masters elected through etcd (see [`Config::elected`]).
#[derive(Debug, Clone)]
pub(crate) struct Election {
    pub standbys: usize,
    pub etcd: Vec<String>,
    pub lease_secs: u64,
}

/// A local cluster's shape; build with [`Config::new`] and the setters.
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) daemon: Daemon,
    /// Each agent's `--capacity`, as given (bytes or `64MiB`).
    pub(crate) capacities: Vec<String>,
    pub(crate) heartbeat_ms: u64,
    pub(crate) start_timeout: Duration,
    pub(crate) dir_prefix: String,
    /// Arguments after the usual ones, per agent.
    pub(crate) agent_args: Vec<Vec<String>>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) inherit_oncilla_env: bool,
    pub(crate) stop: Stop,
    pub(crate) keep: bool,
    pub(crate) tls: bool,
    pub(crate) metrics: bool,
    pub(crate) election: Option<Election>,
}

impl Config {
    /// A master and one agent per entry of `capacities` (named `node-0`..),
    /// run by `daemon`; heartbeats every 500 ms, 60 s to come up, stopped
    /// with SIGTERM (5 s before SIGKILL), `ONCILLA_*` variables of this
    /// process kept from the daemons.
    pub fn new<S: ToString>(daemon: Daemon, capacities: &[S]) -> Self {
        Self {
            daemon,
            capacities: capacities.iter().map(ToString::to_string).collect(),
            heartbeat_ms: 500,
            start_timeout: Duration::from_secs(60),
            dir_prefix: "oncilla-cluster".into(),
            agent_args: vec![Vec::new(); capacities.len()],
            env: Vec::new(),
            inherit_oncilla_env: false,
            stop: Stop::Term(Duration::from_secs(5)),
            keep: false,
            tls: false,
            metrics: false,
            election: None,
        }
    }

    /// `standbys` more masters beside the first, all elected through the
    /// etcd members at `etcd` with leases of `lease_secs` (the etcd is the
    /// caller's: see [`crate::etcd::Etcd`]); agents and operators are given
    /// every master's address.
    pub fn elected(mut self, standbys: usize, etcd: &[String], lease_secs: u64) -> Self {
        self.election = Some(Election {
            standbys,
            etcd: etcd.to_vec(),
            lease_secs,
        });
        self
    }

    /// Metrics on every daemon (`--metrics-listen` on a loopback port of
    /// its own, one token file for all: see [`crate::Handle::metrics_addr`]).
    pub fn metrics(mut self, on: bool) -> Self {
        self.metrics = on;
        self
    }

    /// TLS on every daemon's TCP listeners: a cluster CA and one
    /// certificate per daemon are made in the cluster's directory.
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    /// Every daemon's `--heartbeat-ms`.
    pub fn heartbeat_ms(mut self, ms: u64) -> Self {
        self.heartbeat_ms = ms;
        self
    }

    /// How long the cluster (and a restarted agent) may take to come up.
    pub fn start_timeout(mut self, limit: Duration) -> Self {
        self.start_timeout = limit;
        self
    }

    /// The temporary directory's name starts with this.
    pub fn dir_prefix(mut self, prefix: &str) -> Self {
        self.dir_prefix = prefix.to_string();
        self
    }

    /// Arguments agent `i` gets after the usual ones (at start and on
    /// [`crate::Handle::start_agent`]).
    pub fn agent_args(mut self, i: usize, args: Vec<String>) -> Self {
        if let Some(slot) = self.agent_args.get_mut(i) {
            *slot = args;
        }
        self
    }

    /// A variable set in every daemon's environment.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Whether the daemons see this process's `ONCILLA_*` variables
    /// (default: no, so a user's settings cannot reconfigure them).
    pub fn inherit_oncilla_env(mut self, inherit: bool) -> Self {
        self.inherit_oncilla_env = inherit;
        self
    }

    /// How daemons are stopped when the cluster goes.
    pub fn stop(mut self, stop: Stop) -> Self {
        self.stop = stop;
        self
    }

    /// Daemons that may outlive this process: their own process group (a
    /// later Ctrl-C in the shell leaves them running) and no parent-death
    /// signal. Otherwise each daemon gets SIGTERM if this process dies.
    pub fn keep(mut self, keep: bool) -> Self {
        self.keep = keep;
        self
    }

    /// Number of agents.
    pub fn agents(&self) -> usize {
        self.capacities.len()
    }
}
