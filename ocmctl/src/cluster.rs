//! A local cluster for `ocmctl demo` and `ocmctl bench`: a master and N
//! agents as real daemon processes on loopback, in a private temporary
//! directory, torn down on return, on Ctrl-C and on SIGTERM (and, through
//! PR_SET_PDEATHSIG, if ocmctl itself dies).
//!
//! It owns the lifecycle of the processes it starts (work running against
//! the cluster may restart an agent through its [`Handle`]); it never
//! touches a cluster it did not start.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use oncilla_model::size::HumanBytes;
use oncilla_proto::auth::Token;
use oncilla_proto::pb::NodeState;

use crate::master::Master;
use crate::{CliError, DAEMON_ARG};

/// How long the cluster may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a daemon may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Name of agent `i`.
pub fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// A daemon process and how to start it again.
struct Daemon {
    name: String,
    args: Vec<String>,
    child: Child,
}

/// The cluster's daemons, shared by its owner and the work's [`Handle`].
#[derive(Clone, Default)]
struct Daemons(Arc<Mutex<Vec<Daemon>>>);

impl Daemons {
    fn lock(&self) -> MutexGuard<'_, Vec<Daemon>> {
        // Plain process handles; a panic elsewhere cannot leave them invalid.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What work running against the cluster needs to reach it.
#[derive(Clone)]
pub struct Handle {
    pub master_addr: String,
    pub token: Token,
    pub agents: usize,
    pub dir: PathBuf,
    daemons: Daemons,
    keep: bool,
}

impl Handle {
    /// Kills agent `i` (SIGKILL: no goodbye to anyone), starts it again with
    /// the same name and addresses, and waits until it has registered. The
    /// new agent starts with an empty pool.
    ///
    /// # Errors
    /// An agent that cannot be started or does not come back in time.
    pub fn restart_agent(&self, i: usize) -> Result<(), CliError> {
        let name = node_name(i);
        let master = Master::connect(&self.master_addr, &self.token)?;
        let before = master
            .nodes()?
            .into_iter()
            .find(|n| n.info.as_ref().is_some_and(|x| x.name == name))
            .map(|n| n.incarnation);
        {
            let mut daemons = self.daemons.lock();
            let d = daemons
                .iter_mut()
                .find(|d| d.name == name)
                .ok_or_else(|| CliError::Other(format!("no agent {name} in this cluster")))?;
            let _ = d.child.kill();
            let _ = d.child.wait();
            d.child = spawn(&self.dir, &d.name, &d.args, self.keep)?;
        }
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            let back = master.nodes().ok().and_then(|nodes| {
                nodes
                    .into_iter()
                    .find(|n| n.info.as_ref().is_some_and(|x| x.name == name))
            });
            if back
                .is_some_and(|n| Some(n.incarnation) != before && n.state == NodeState::Up as i32)
                && self.socket(i).exists()
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(CliError::Other(format!(
            "{name} did not come back within {}s; log in {}",
            START_TIMEOUT.as_secs(),
            self.log(i).display()
        )))
    }

    /// Session socket of agent `i`.
    pub fn socket(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.sock", node_name(i)))
    }

    /// Log file of agent `i`.
    pub fn log(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.log", node_name(i)))
    }
}

/// Starts a master and one agent per entry of `capacities`, runs `work` on
/// its own thread (liboncilla blocks), and stops everything when it returns
/// or a signal arrives. With `keep`, a successful run leaves the cluster up
/// and prints how to use and stop it.
///
/// # Errors
/// Daemons that fail to start (with their log's last lines), signals, and
/// whatever `work` returns.
pub fn run<T: Send + 'static>(
    capacities: &[u64],
    keep: bool,
    work: impl FnOnce(&Handle) -> Result<T, CliError> + Send + 'static,
) -> Result<T, CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Other(format!("cannot start runtime: {e}")))?;
    // Signal handlers go in before any child exists, so no signal can leave one behind.
    let (mut int, mut term) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _guard = rt.enter();
        let int = signal(SignalKind::interrupt());
        let term = signal(SignalKind::terminate());
        match (int, term) {
            (Ok(i), Ok(t)) => (i, t),
            _ => return Err(CliError::Other("cannot install signal handlers".into())),
        }
    };

    let mut cluster = Cluster::start(capacities, keep)?;
    let handle = cluster.handle();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("cluster-work".into())
        .spawn(move || {
            let _ = tx.send(work(&handle));
        })
        .map_err(|e| CliError::Other(format!("cannot start work thread: {e}")))?;
    let outcome = rt.block_on(async {
        tokio::select! {
            r = rx => r.unwrap_or_else(|_| Err(CliError::Other("work thread died".into()))),
            _ = int.recv() => Err(CliError::Other("interrupted; cluster stopped".into())),
            _ = term.recv() => Err(CliError::Other("terminated; cluster stopped".into())),
        }
    });
    match outcome {
        Ok(v) if keep => {
            cluster.detach();
            Ok(v)
        }
        other => {
            cluster.shutdown();
            other
        }
    }
}

/// The daemons and the directory made for them; stopping is idempotent.
struct Cluster {
    dir: PathBuf,
    token: Token,
    master_addr: String,
    daemons: Daemons,
    keep: bool,
}

impl Cluster {
    fn start(capacities: &[u64], keep: bool) -> Result<Self, CliError> {
        let agents = capacities.len();
        let dir = std::env::temp_dir().join(format!(
            "oncilla-demo-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|source| io_err(&dir, source))?;
        let token = Token::random();
        let token_path = dir.join("token");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token_path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, token.as_str().as_bytes()))
            .map_err(|source| io_err(&token_path, source))?;
        let port = free_port()?;
        let master_addr = format!("127.0.0.1:{port}");
        let mut cluster = Self {
            dir,
            token,
            master_addr,
            daemons: Daemons::default(),
            keep,
        };
        // On any error below, dropping `cluster` stops what was started.
        let tp = token_path.display().to_string();
        let listen = cluster.master_addr.clone();
        cluster.spawn(
            "master",
            &[
                "--master",
                "--listen",
                &listen,
                "--token-file",
                &tp,
                "--heartbeat-ms",
                "500",
            ],
        )?;
        for (i, capacity) in capacities.iter().enumerate() {
            let cap = capacity.to_string();
            let sock = cluster.socket(i).display().to_string();
            let name = node_name(i);
            // Fixed ports, so an agent restarted in place keeps its addresses.
            let grpc = format!("127.0.0.1:{}", free_port()?);
            let data = format!("127.0.0.1:{}", free_port()?);
            cluster.spawn(
                &name,
                &[
                    "--join",
                    &listen,
                    "--name",
                    &name,
                    "--listen",
                    &grpc,
                    "--data-listen",
                    &data,
                    "--socket",
                    &sock,
                    "--capacity",
                    &cap,
                    "--token-file",
                    &tp,
                    "--heartbeat-ms",
                    "500",
                ],
            )?;
        }
        cluster.wait_ready(agents)?;
        let caps: Vec<String> = capacities
            .iter()
            .map(|c| HumanBytes(*c).to_string())
            .collect();
        eprintln!(
            "started a master and {agents} agents ({}) in {}\n",
            caps.join(", "),
            cluster.dir.display()
        );
        Ok(cluster)
    }

    fn socket(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.sock", node_name(i)))
    }

    fn handle(&self) -> Handle {
        Handle {
            master_addr: self.master_addr.clone(),
            token: self.token.clone(),
            agents: self.daemons.lock().len().saturating_sub(1),
            dir: self.dir.clone(),
            daemons: self.daemons.clone(),
            keep: self.keep,
        }
    }

    fn spawn(&mut self, name: &str, args: &[&str]) -> Result<(), CliError> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let child = spawn(&self.dir, name, &args, self.keep)?;
        self.daemons.lock().push(Daemon {
            name: name.to_string(),
            args,
            child,
        });
        Ok(())
    }

    fn wait_ready(&mut self, agents: usize) -> Result<(), CliError> {
        let master = Master::connect(&self.master_addr, &self.token)?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            for d in self.daemons.lock().iter_mut() {
                if let Ok(Some(status)) = d.child.try_wait() {
                    let log = self.dir.join(format!("{}.log", d.name));
                    return Err(CliError::Other(format!(
                        "{} exited ({status}) during start-up:\n{}",
                        d.name,
                        tail(&log, 8)
                    )));
                }
            }
            let (up, recovering) = master
                .node_list()
                .map(|l| {
                    let up = l.nodes.iter().filter(|s| s.state == NodeState::Up as i32);
                    (up.count(), l.recovering_ms)
                })
                .unwrap_or((0, 1));
            let sockets = (0..agents).all(|i| self.socket(i).exists());
            // Ready once the master takes allocations too.
            if up == agents && sockets && recovering == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(CliError::Other(format!(
                    "cluster not up after {}s ({up} of {agents} agents registered); logs in {}",
                    START_TIMEOUT.as_secs(),
                    self.dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Leaves the daemons running and says how to use and stop them.
    fn detach(&mut self) {
        let pids: Vec<String> = self
            .daemons
            .lock()
            .iter()
            .map(|d| d.child.id().to_string())
            .collect();
        println!("\nthe cluster keeps running; to use it:");
        println!("  export ONCILLA_MASTER={}", self.master_addr);
        println!("  export ONCILLA_SOCKET={}", self.socket(0).display());
        println!(
            "  export ONCILLA_TOKEN_FILE={}",
            self.dir.join("token").display()
        );
        println!("to stop it:");
        println!("  kill {} && rm -rf {}", pids.join(" "), self.dir.display());
        self.daemons.lock().clear();
        self.dir = PathBuf::new();
    }

    /// SIGTERM to every daemon, SIGKILL after [`STOP_TIMEOUT`], then the
    /// directory goes.
    fn shutdown(&mut self) {
        let mut daemons = std::mem::take(&mut *self.daemons.lock());
        for Daemon { child, .. } in &daemons {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        for Daemon {
            name, mut child, ..
        } in daemons.drain(..)
        {
            let deadline = Instant::now() + STOP_TIMEOUT;
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        eprintln!("ocmctl: {name} did not stop in time; killing it");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        if !self.dir.as_os_str().is_empty() {
            if let Err(e) = std::fs::remove_dir_all(&self.dir) {
                eprintln!("ocmctl: cannot remove {}: {e}", self.dir.display());
            }
            self.dir = PathBuf::new();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts `ocmctl oncillad ARGS` logging to `DIR/NAME.log`.
fn spawn(dir: &Path, name: &str, args: &[String], keep: bool) -> Result<Child, CliError> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Other(format!("cannot find own executable: {e}")))?;
    let log_path = dir.join(format!("{name}.log"));
    // Appended: a restarted daemon's log follows its predecessor's.
    let log = File::options()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|source| io_err(&log_path, source))?;
    let mut cmd = Command::new(exe);
    cmd.arg(DAEMON_ARG)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ONCILLA_") {
            cmd.env_remove(k);
        }
    }
    if keep {
        // Its own process group: a later Ctrl-C in this shell leaves it running.
        cmd.process_group(0);
    } else {
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
        // no memory of the parent; it makes the daemon get SIGTERM if
        // ocmctl dies without cleaning up, so no process is left behind.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.spawn()
        .map_err(|e| CliError::Other(format!("cannot start {name}: {e}")))
}

/// A loopback port free right now, below the kernel's ephemeral range
/// (32768 and up by default), so that no outgoing connection takes it as
/// its source port before the daemon binds it.
fn free_port() -> Result<u16, CliError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = u64::from(std::process::id()) * 7919 + NEXT.fetch_add(1, Ordering::Relaxed) * 131;
    (0..2000u64)
        .map(|i| 20000 + u16::try_from((seed + i * 17) % 12000).unwrap_or(0))
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .ok_or_else(|| CliError::Other("no free loopback port in 20000..32000".into()))
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn io_err(path: &Path, source: std::io::Error) -> CliError {
    CliError::Io {
        path: path.display().to_string(),
        source,
    }
}
