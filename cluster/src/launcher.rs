//! The local cluster itself: a master and agents as real `oncillad`
//! processes on loopback, in a private temporary directory (mode 0700)
//! holding the token (mode 0600), each agent's session socket and every
//! daemon's log (`master.log`, `node-<i>.log`, appended across restarts).
//!
//! Ports are fixed when the cluster starts (below the kernel's ephemeral
//! range), so an agent started again keeps its name, addresses and socket.
//! Every wait is bounded by the configured start timeout. Dropping the
//! [`Cluster`] stops every daemon it started ([`crate::Stop`]) and removes
//! the directory; [`Cluster::detach`] leaves them running instead.
//!
//! It owns the processes it starts and nothing else: it never signals a
//! process it did not start, and never reads what the daemons store.

use std::path::PathBuf;
use std::process::Child;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use oncilla_model::node::NodeState;
use oncilla_net::auth::Token;
use oncilla_net::credential::NodeKeys;
use oncilla_net::tls::ClientTls;

use crate::config::{Config, Stop};
use crate::error::ClusterError;
pub use crate::process::free_port;
use crate::process::{private_dir, program, spawn, tail, terminate};
use oncilla_ops::certs;
use oncilla_ops::master::{Master, MasterError};

/// How long [`Handle::stop_agent`] waits after SIGTERM before SIGKILL.
const STOP_AGENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of each daemon's log a failed test prints.
const POST_MORTEM_LINES: usize = 40;

/// Name of agent `i`.
pub fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// Name of master `i`: `master`, then `master-1`, ... for standbys.
pub fn master_name(i: usize) -> String {
    match i {
        0 => "master".to_string(),
        i => format!("master-{i}"),
    }
}

/// The running daemons, and the extra arguments each agent last started with.
struct Procs {
    /// The first master, then the standbys (see [`master_name`]).
    masters: Vec<Option<Child>>,
    agents: Vec<Option<Child>>,
    args: Vec<Vec<String>>,
}

/// What every [`Handle`] of one cluster shares.
struct Shared {
    config: Config,
    /// Each agent's gRPC and data ports, kept across restarts.
    ports: Vec<(u16, u16)>,
    /// Metrics ports: the master's, then each agent's (empty: no metrics).
    metrics_ports: Vec<u16>,
    procs: Mutex<Procs>,
}

impl Shared {
    fn procs(&self) -> MutexGuard<'_, Procs> {
        // Plain process handles; a panic elsewhere cannot leave them invalid.
        self.procs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What work running against a cluster needs to reach and drive it;
/// cheap to clone and to send to another thread.
#[derive(Clone)]
pub struct Handle {
    /// The (first) master's gRPC address.
    pub master_addr: String,
    /// Every master's gRPC address: the first, then the standbys'.
    pub master_addrs: Vec<String>,
    /// The cluster token (also in [`Handle::token_file`]).
    pub token: Token,
    /// Number of agents.
    pub agents: usize,
    /// The cluster's private directory.
    pub dir: PathBuf,
    /// The cluster CA, when the daemons' TCP listeners speak TLS.
    pub tls: Option<ClientTls>,
    shared: Arc<Shared>,
}

impl Handle {
    /// The token file (mode 0600) the master and operators read.
    pub fn token_file(&self) -> PathBuf {
        self.dir.join("token")
    }

    /// Agent `i`'s node keys (mode 0600): agents hold no token, as a
    /// least-privilege deployment runs them.
    pub fn node_keys_file(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.keys", node_name(i)))
    }

    /// Session socket of agent `i`.
    pub fn socket(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.sock", node_name(i)))
    }

    /// Log file of a daemon (`master`, `node-1`, ...).
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// A connection to the master (the leader, with standbys).
    ///
    /// # Errors
    /// A runtime that cannot start.
    pub fn master(&self) -> Result<Master, MasterError> {
        Master::connect(&self.masters_arg(), &self.token, self.tls.as_ref())
    }

    /// Every master's address, comma-separated: what agents join and
    /// operators pass as `--master`.
    pub fn masters_arg(&self) -> String {
        self.master_addrs.join(",")
    }

    /// Which master leads and serves now (its master role SERVING on the
    /// health service: standbys and a recovering leader are not), if any;
    /// asked one by one, without waiting.
    pub fn leader(&self) -> Option<usize> {
        self.master_addrs.iter().position(|addr| {
            oncilla_ops::health::check(addr, oncilla_ops::health::MASTER, self.tls.as_ref())
                .is_ok_and(|s| s == "SERVING")
        })
    }

    /// The cluster CA certificate, when the cluster speaks TLS.
    pub fn tls_ca(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(|_| self.dir.join(certs::CA_CERT))
    }

    /// The file holding the token metrics scrapers present.
    pub fn metrics_token_file(&self) -> PathBuf {
        self.dir.join("metrics-token")
    }

    /// Where daemon `name` (`master`, `node-1`, ...) serves metrics, when
    /// the cluster was started with them.
    pub fn metrics_addr(&self, name: &str) -> Option<String> {
        let i = match name {
            "master" => 0,
            _ => (0..self.agents).find(|&i| node_name(i) == name)? + 1,
        };
        let port = self.shared.metrics_ports.get(i)?;
        Some(format!("127.0.0.1:{port}"))
    }

    /// The metrics flags of daemon `name` (none without metrics).
    fn metrics_args(&self, name: &str) -> Vec<String> {
        match self.metrics_addr(name) {
            Some(addr) => vec![
                "--metrics-listen".into(),
                addr,
                "--metrics-token-file".into(),
                self.metrics_token_file().display().to_string(),
            ],
            None => Vec::new(),
        }
    }

    /// The TLS flags of daemon `name` (none without TLS).
    fn tls_args(&self, name: &str) -> Vec<String> {
        match self.tls_ca() {
            Some(ca) => vec![
                "--tls-cert".into(),
                self.dir.join(format!("{name}.pem")).display().to_string(),
                "--tls-key".into(),
                self.dir
                    .join(format!("{name}-key.pem"))
                    .display()
                    .to_string(),
                "--tls-ca".into(),
                ca.display().to_string(),
            ],
            None => Vec::new(),
        }
    }

    /// Process id of agent `i`, while it runs.
    pub fn agent_pid(&self, i: usize) -> Option<u32> {
        let procs = self.shared.procs();
        procs.agents.get(i)?.as_ref().map(Child::id)
    }

    /// Starts the master (again) on its address.
    ///
    /// # Errors
    /// It is running already, or cannot be started.
    pub fn start_master(&self) -> Result<(), ClusterError> {
        self.start_master_at(0)
    }

    /// Starts master `i` (0: the first, then the standbys) again on its
    /// address.
    ///
    /// # Errors
    /// No such master, it is running already, or it cannot be started.
    pub fn start_master_at(&self, i: usize) -> Result<(), ClusterError> {
        let name = master_name(i);
        let addr = self
            .master_addrs
            .get(i)
            .ok_or_else(|| ClusterError::NoAgent(name.clone()))?;
        let mut procs = self.shared.procs();
        if procs.masters[i].is_some() {
            return Err(ClusterError::Running(name));
        }
        let tf = self.token_file().display().to_string();
        let hb = self.shared.config.heartbeat_ms.to_string();
        // Kept in the cluster's directory: quotas set survive a restart
        // (and are every master's).
        let quotas = self.dir.join("quotas.toml").display().to_string();
        let mut args: Vec<String> = [
            "--master",
            "--listen",
            addr,
            "--token-file",
            &tf,
            "--heartbeat-ms",
            &hb,
            "--quota-file",
            &quotas,
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        if let Some(e) = &self.shared.config.election {
            args.extend([
                "--etcd".to_string(),
                e.etcd.join(","),
                "--etcd-lease-secs".to_string(),
                e.lease_secs.to_string(),
            ]);
        }
        args.extend(self.tls_args(&name));
        args.extend(self.metrics_args(&name));
        procs.masters[i] = Some(spawn(&self.shared.config, &self.dir, &name, &args)?);
        Ok(())
    }

    /// SIGKILL to the master.
    pub fn kill_master(&self) {
        self.kill_master_at(0);
    }

    /// SIGKILL to master `i` (no goodbye to anyone).
    pub fn kill_master_at(&self, i: usize) {
        let child = self
            .shared
            .procs()
            .masters
            .get_mut(i)
            .and_then(Option::take);
        if let Some(mut c) = child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `signal` to master `i`, which stays this cluster's (SIGSTOP freezes
    /// it as a machine cut off would be, SIGCONT brings it back).
    pub fn signal_master(&self, i: usize, signal: nix::sys::signal::Signal) {
        let procs = self.shared.procs();
        if let Some(Some(c)) = procs.masters.get(i) {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
            }
        }
    }

    /// Process id of master `i`, while it runs.
    pub fn master_pid(&self, i: usize) -> Option<u32> {
        let procs = self.shared.procs();
        procs.masters.get(i)?.as_ref().map(Child::id)
    }

    /// Starts agent `i` (again) with its name, ports, socket and configured
    /// extra arguments (an empty pool).
    ///
    /// # Errors
    /// No such agent, it is running, or it cannot be started.
    pub fn start_agent(&self, i: usize) -> Result<(), ClusterError> {
        let extra = self
            .shared
            .config
            .agent_args
            .get(i)
            .cloned()
            .unwrap_or_default();
        self.start_agent_with(i, &extra)
    }

    /// [`Handle::start_agent`] with `extra` after the usual arguments
    /// instead of the configured ones.
    ///
    /// # Errors
    /// No such agent, it is running, or it cannot be started.
    pub fn start_agent_with<S: AsRef<str>>(
        &self,
        i: usize,
        extra: &[S],
    ) -> Result<(), ClusterError> {
        let extra: Vec<String> = extra.iter().map(|a| a.as_ref().to_string()).collect();
        let mut procs = self.shared.procs();
        let name = node_name(i);
        match procs.agents.get(i) {
            None => return Err(ClusterError::NoAgent(name)),
            Some(Some(_)) => return Err(ClusterError::Running(name)),
            Some(None) => {}
        }
        let child = self.spawn_agent(i, &extra)?;
        procs.agents[i] = Some(child);
        procs.args[i] = extra;
        Ok(())
    }

    fn spawn_agent(&self, i: usize, extra: &[String]) -> Result<Child, ClusterError> {
        let name = node_name(i);
        let config = &self.shared.config;
        let (grpc, data) = self
            .shared
            .ports
            .get(i)
            .copied()
            .ok_or_else(|| ClusterError::NoAgent(name.clone()))?;
        let mut args: Vec<String> = [
            "--join",
            &self.masters_arg(),
            "--name",
            &name,
            "--listen",
            &format!("127.0.0.1:{grpc}"),
            "--data-listen",
            &format!("127.0.0.1:{data}"),
            "--socket",
            &self.socket(i).display().to_string(),
            "--capacity",
            &config.capacities[i],
            "--node-keys-file",
            &self.node_keys_file(i).display().to_string(),
            "--heartbeat-ms",
            &config.heartbeat_ms.to_string(),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.extend(self.tls_args(&name));
        args.extend(self.metrics_args(&name));
        args.extend(extra.iter().cloned());
        spawn(config, &self.dir, &name, &args)
    }

    /// SIGKILL to agent `i` (no goodbye to anyone).
    pub fn kill_agent(&self, i: usize) {
        let child = self.shared.procs().agents.get_mut(i).and_then(Option::take);
        if let Some(mut c) = child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM to agent `i`, waiting (bounded) for it to exit, SIGKILL after.
    pub fn stop_agent(&self, i: usize) {
        let child = self.shared.procs().agents.get_mut(i).and_then(Option::take);
        if let Some(mut c) = child {
            terminate(&c);
            let deadline = Instant::now() + STOP_AGENT_TIMEOUT;
            while !matches!(c.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if !matches!(c.try_wait(), Ok(Some(_))) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }

    /// Kills agent `i` (SIGKILL), starts it again with the same name,
    /// addresses and arguments, and waits until it has registered anew. The
    /// new agent starts with an empty pool.
    ///
    /// # Errors
    /// No such agent, an agent that cannot be started or does not come back
    /// in time, a master that cannot be asked.
    pub fn restart_agent(&self, i: usize) -> Result<(), ClusterError> {
        let name = node_name(i);
        let master = self.master()?;
        let before = master
            .nodes()?
            .into_iter()
            .find(|n| n.info.name == name)
            .map(|n| n.incarnation);
        {
            let mut procs = self.shared.procs();
            let extra = procs
                .args
                .get(i)
                .cloned()
                .ok_or_else(|| ClusterError::NoAgent(name.clone()))?;
            if let Some(mut c) = procs.agents[i].take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            procs.agents[i] = Some(self.spawn_agent(i, &extra)?);
        }
        let limit = self.shared.config.start_timeout;
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let back = master
                .nodes()
                .ok()
                .and_then(|nodes| nodes.into_iter().find(|n| n.info.name == name));
            if back.is_some_and(|n| Some(n.incarnation) != before && n.state == NodeState::Up)
                && self.socket(i).exists()
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(ClusterError::NotBack {
            log: self.log(&name),
            name,
            limit,
        })
    }

    /// Waits (within the start timeout) until the master lists `n` nodes
    /// up, agents `0..n` have their sockets and the master has left its
    /// recovery window (it takes allocations).
    ///
    /// # Errors
    /// A daemon of this cluster exited meanwhile (with its log's last
    /// lines), or time ran out.
    pub fn wait_nodes_up(&self, n: usize) -> Result<(), ClusterError> {
        self.wait_nodes_up_within(n, self.shared.config.start_timeout)
    }

    /// [`Handle::wait_nodes_up`] allowing `limit` (a large pool takes a
    /// while to populate and lock).
    ///
    /// # Errors
    /// As [`Handle::wait_nodes_up`].
    pub fn wait_nodes_up_within(&self, n: usize, limit: Duration) -> Result<(), ClusterError> {
        let master = self.master()?;
        let deadline = Instant::now() + limit;
        loop {
            self.check_running()?;
            let (up, recovering) = master
                .node_list()
                .map(|l| {
                    let up = l.nodes.iter().filter(|s| s.state == NodeState::Up);
                    (up.count(), l.recovering_ms)
                })
                .unwrap_or((0, 1));
            let sockets = (0..n).all(|i| self.socket(i).exists());
            if up == n && sockets && recovering == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ClusterError::NotUp {
                    limit,
                    up,
                    agents: n,
                    dir: self.dir.clone(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Fails when a daemon this cluster runs has exited.
    fn check_running(&self) -> Result<(), ClusterError> {
        let mut procs = self.shared.procs();
        let Procs {
            masters, agents, ..
        } = &mut *procs;
        let running = masters
            .iter_mut()
            .enumerate()
            .filter_map(|(i, c)| Some((master_name(i), c.as_mut()?)))
            .chain(
                agents
                    .iter_mut()
                    .enumerate()
                    .filter_map(|(i, c)| Some((node_name(i), c.as_mut()?))),
            );
        for (name, child) in running {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(ClusterError::Exited {
                    log_tail: tail(&self.log(&name), 8),
                    name,
                    status,
                });
            }
        }
        Ok(())
    }
}

/// A started cluster: dropping it stops every daemon and removes its
/// directory. It dereferences to its [`Handle`].
pub struct Cluster {
    handle: Handle,
    /// Whether the daemons and directory are gone (or left running).
    done: bool,
}

impl std::ops::Deref for Cluster {
    type Target = Handle;

    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl Cluster {
    /// Makes the directory and token, starts the master and every agent,
    /// and waits until they are up (within the start timeout).
    ///
    /// # Errors
    /// The directory, token or a port cannot be had, a daemon cannot be
    /// started or exits during start-up (with its log's last lines), or
    /// the cluster is not up in time. What was started is stopped again.
    pub fn start(config: Config) -> Result<Self, ClusterError> {
        let agents = config.agents();
        let masters = 1 + config.election.as_ref().map_or(0, |e| e.standbys);
        let master_addrs = (0..masters)
            .map(|_| Ok(format!("127.0.0.1:{}", free_port()?)))
            .collect::<Result<Vec<_>, ClusterError>>()?;
        let master_addr = master_addrs[0].clone();
        let ports = (0..agents)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<Vec<_>, ClusterError>>()?;
        let dir = private_dir(&config.dir_prefix)?;
        let tls = config.tls;
        let metrics_ports = if config.metrics {
            (0..=agents)
                .map(|_| free_port())
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        let mut cluster = Self {
            handle: Handle {
                master_addr,
                master_addrs,
                token: Token::random(),
                agents,
                dir,
                tls: None,
                shared: Arc::new(Shared {
                    config,
                    ports,
                    metrics_ports,
                    procs: Mutex::new(Procs {
                        masters: (0..masters).map(|_| None).collect(),
                        agents: (0..agents).map(|_| None).collect(),
                        args: vec![Vec::new(); agents],
                    }),
                }),
            },
            done: false,
        };
        // From here on, dropping `cluster` stops what was started and
        // removes the directory.
        let token_path = cluster.token_file();
        certs::write_private(&token_path, cluster.handle.token.as_str().as_bytes())
            .map_err(|source| ClusterError::io(&token_path, source))?;
        for i in 0..agents {
            let path = cluster.node_keys_file(i);
            let keys = NodeKeys::derive(&cluster.handle.token, &node_name(i)).to_text();
            certs::write_private(&path, keys.as_bytes())
                .map_err(|source| ClusterError::io(&path, source))?;
        }
        if !cluster.handle.shared.metrics_ports.is_empty() {
            let path = cluster.metrics_token_file();
            certs::write_private(&path, Token::random().as_str().as_bytes())
                .map_err(|source| ClusterError::io(&path, source))?;
        }
        if tls {
            let dir = cluster.handle.dir.clone();
            let ca = certs::make_ca(&dir)?;
            let loopback = ["127.0.0.1".to_string()];
            for name in (0..masters)
                .map(master_name)
                .chain((0..agents).map(node_name))
            {
                certs::make_cert(&dir, &name, &loopback, &dir)?;
            }
            cluster.handle.tls = Some(ClientTls::load(&ca)?);
        }
        for i in 0..masters {
            cluster.start_master_at(i)?;
        }
        for i in 0..agents {
            cluster.start_agent(i)?;
        }
        cluster.wait_nodes_up(agents)?;
        Ok(cluster)
    }

    /// A handle for work on another thread.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Leaves the daemons running and the directory in place; returns the
    /// daemons' process ids (master first).
    pub fn detach(mut self) -> Vec<u32> {
        self.done = true;
        let mut procs = self.handle.shared.procs();
        let Procs {
            masters, agents, ..
        } = &mut *procs;
        let pids = masters
            .iter_mut()
            .filter_map(Option::take)
            .chain(agents.iter_mut().filter_map(Option::take))
            .map(|c| c.id())
            .collect();
        pids
    }

    /// Stops every daemon as configured, then removes the directory;
    /// idempotent.
    pub fn shutdown(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let mut children: Vec<(String, Child)> = {
            let mut procs = self.handle.shared.procs();
            let Procs {
                masters, agents, ..
            } = &mut *procs;
            let masters = masters
                .iter_mut()
                .enumerate()
                .filter_map(|(i, c)| Some((master_name(i), c.take()?)));
            let agents = agents
                .iter_mut()
                .enumerate()
                .filter_map(|(i, c)| Some((node_name(i), c.take()?)));
            masters.chain(agents).collect()
        };
        if std::thread::panicking() {
            self.post_mortem(&mut children);
        }
        match self.handle.shared.config.stop {
            Stop::Kill => {
                for (_, c) in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            Stop::Term(limit) => {
                for (_, c) in &children {
                    terminate(c);
                }
                for (name, mut child) in children {
                    let deadline = Instant::now() + limit;
                    loop {
                        match child.try_wait() {
                            Ok(Some(_)) => break,
                            Ok(None) if Instant::now() < deadline => {
                                std::thread::sleep(Duration::from_millis(20))
                            }
                            _ => {
                                eprintln!("{}: {name} did not stop in time; killing it", program());
                                let _ = child.kill();
                                let _ = child.wait();
                                break;
                            }
                        }
                    }
                }
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.handle.dir) {
            eprintln!(
                "{}: cannot remove {}: {e}",
                program(),
                self.handle.dir.display()
            );
        }
    }
}

impl Cluster {
    /// What a failed test needs to say why: each daemon's state (running,
    /// or how it exited) and its log's last lines, on stderr, which the
    /// test harness shows beside the failure.
    fn post_mortem(&self, children: &mut [(String, Child)]) {
        for (name, child) in children.iter_mut() {
            let state = match child.try_wait() {
                Ok(None) => "running".to_string(),
                Ok(Some(status)) => format!("exited ({status})"),
                Err(e) => format!("unknown ({e})"),
            };
            eprintln!(
                "{}: {name} {state}; the last lines of {}:\n{}",
                program(),
                self.log(name).display(),
                tail(&self.log(name), POST_MORTEM_LINES)
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}
