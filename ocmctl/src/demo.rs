//! `ocmctl demo`: a whole cluster on this machine — a master and N agents as
//! real daemon processes on loopback, in a private temporary directory —
//! driven through liboncilla: allocate striped over every agent, write a
//! pattern, read it back, verify, print the tables and the bandwidth, free,
//! and tear everything down (also on Ctrl-C or SIGTERM).
//!
//! It owns the lifecycle of the processes it starts; it never touches a
//! cluster it did not start.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Kind, Oncilla, Options};
use oncilla_proto::auth::Token;
use oncilla_proto::pb::NodeState;
use oncilla_proto::size::{parse_size, HumanBytes};

use crate::master::{self, Master};
use crate::table::Table;
use crate::{CliError, DAEMON_ARG};

/// How long the cluster may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a daemon may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Options of `ocmctl demo`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    /// Number of agents to start (1 to 16).
    #[arg(long, default_value_t = 3)]
    agents: usize,
    /// Memory each agent exports.
    #[arg(long, default_value = "128MiB")]
    capacity: String,
    /// Size of the allocation striped over all agents.
    #[arg(long, default_value = "96MiB")]
    size: String,
    /// Leave the cluster running and print how to use and stop it.
    #[arg(long)]
    keep: bool,
}

/// Runs the demo.
///
/// # Errors
/// Bad options, daemons that fail to start (with their log's last lines),
/// data that does not verify, and every cluster error on the way.
pub fn run(args: &Args) -> Result<(), CliError> {
    if !(1..=16).contains(&args.agents) {
        return Err(CliError::Other("--agents must be between 1 and 16".into()));
    }
    let capacity =
        parse_size(&args.capacity).map_err(|e| CliError::Other(format!("--capacity: {e}")))?;
    let size = parse_size(&args.size).map_err(|e| CliError::Other(format!("--size: {e}")))?;
    if size == 0 || size > capacity * args.agents as u64 {
        return Err(CliError::Other(format!(
            "--size must be between 1 byte and the agents' total capacity ({})",
            HumanBytes(capacity * args.agents as u64)
        )));
    }

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

    let mut cluster = Cluster::start(args.agents, capacity, args.keep)?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let plan = Plan {
        master: cluster.master_addr.clone(),
        socket: cluster.socket(0),
        token: cluster.token.clone(),
        nodes: (0..args.agents).map(node_name).collect(),
        size,
        keep: args.keep,
    };
    std::thread::Builder::new()
        .name("demo".into())
        .spawn(move || {
            let _ = tx.send(plan.run());
        })
        .map_err(|e| CliError::Other(format!("cannot start demo thread: {e}")))?;
    let outcome = rt.block_on(async {
        tokio::select! {
            r = rx => r.unwrap_or_else(|_| Err(CliError::Other("demo thread died".into()))),
            _ = int.recv() => Err(CliError::Other("interrupted; cluster stopped".into())),
            _ = term.recv() => Err(CliError::Other("terminated; cluster stopped".into())),
        }
    });
    match outcome {
        Ok(()) if args.keep => {
            cluster.detach();
            Ok(())
        }
        other => {
            cluster.shutdown();
            other
        }
    }
}

fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// What the demo does once the cluster is up (runs on its own thread, since
/// liboncilla blocks).
struct Plan {
    master: String,
    socket: PathBuf,
    token: Token,
    nodes: Vec<String>,
    size: u64,
    keep: bool,
}

impl Plan {
    fn run(self) -> Result<(), CliError> {
        let master = Master::connect(&self.master, &self.token)?;
        let ocm = Oncilla::connect_with(Options {
            socket: self.socket.clone(),
            token: self.token.clone(),
        })?;
        let mut spec = AllocSpec::new(self.size, Kind::RemoteHost).on_nodes(self.nodes.clone());
        if self.keep {
            spec = spec.persistent();
        }
        let len =
            usize::try_from(self.size).map_err(|_| CliError::Other("--size too large".into()))?;
        let alloc = ocm.alloc_with(&spec)?;
        println!(
            "allocated {} as allocation {} striped over {} agents\n",
            HumanBytes(self.size),
            alloc.id(),
            alloc.descriptor().extents.len()
        );

        let src = pattern(len, alloc.id());
        let started = Instant::now();
        alloc.copy_in(0, &src)?;
        let write = started.elapsed();
        // Filled (so pre-faulted, and the timing is the copy, not page
        // faults) with a byte the pattern cannot match everywhere.
        let mut dst = vec![0xA5u8; len];
        let started = Instant::now();
        alloc.copy_out(0, &mut dst)?;
        let read = started.elapsed();
        if let Some(at) = src.iter().zip(&dst).position(|(a, b)| a != b) {
            return Err(CliError::Other(format!(
                "verification failed: byte {at} differs"
            )));
        }
        // Unaligned ranges that cross extent boundaries.
        let mut checked = 1;
        for ext in alloc.descriptor().extents.iter().skip(1) {
            let start = ext.alloc_offset.saturating_sub(4099);
            let n = usize::try_from((alloc.size() - start).min(12_345)).unwrap_or(0);
            let mut part = vec![0u8; n];
            alloc.copy_out(start, &mut part)?;
            let at = usize::try_from(start).unwrap_or(0);
            if part != src[at..at + n] {
                return Err(CliError::Other(format!(
                    "verification failed at offset {start}"
                )));
            }
            checked += 1;
        }
        println!(
            "verified: {} read back intact ({checked} ranges, every byte compared)\n",
            HumanBytes(self.size)
        );

        println!("nodes:");
        print!("{}", master::nodes_table(&master.nodes()?));
        println!("\nallocations:");
        print!("{}", master::allocs_table(&master.allocations()?));

        let mut t = Table::new(&["COPY", "BYTES", "SECONDS", "GiB/s"]);
        for (what, took) in [("write (copy_in)", write), ("read (copy_out)", read)] {
            let secs = took.as_secs_f64();
            t.row(vec![
                what.into(),
                HumanBytes(self.size).to_string(),
                format!("{secs:.3}"),
                format!(
                    "{:.2}",
                    self.size as f64 / secs.max(1e-9) / f64::from(1u32 << 30)
                ),
            ]);
        }
        println!("\nbandwidth over TCP on loopback:");
        print!("{}", t.render());

        if self.keep {
            return Ok(());
        }
        let id = alloc.id();
        alloc.free()?;
        if master.allocations()?.iter().any(|a| a.id == id) {
            return Err(CliError::Other(format!(
                "allocation {id} still listed after free"
            )));
        }
        println!("\nfreed allocation {id}; stopping the cluster");
        Ok(())
    }
}

/// Deterministic, position-dependent bytes, so a misplaced chunk shows.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut i = 0u64;
    while v.len() < len {
        let x = (i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        v.extend_from_slice(&x.to_le_bytes());
        i += 1;
    }
    v.truncate(len);
    v
}

/// The daemons and the directory the demo made; stopping is idempotent.
struct Cluster {
    dir: PathBuf,
    token: Token,
    master_addr: String,
    children: Vec<(String, Child)>,
    keep: bool,
}

impl Cluster {
    fn start(agents: usize, capacity: u64, keep: bool) -> Result<Self, CliError> {
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
            children: Vec::new(),
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
        let cap = capacity.to_string();
        for i in 0..agents {
            let sock = cluster.socket(i).display().to_string();
            let name = node_name(i);
            cluster.spawn(
                &name,
                &[
                    "--join",
                    &listen,
                    "--name",
                    &name,
                    "--listen",
                    "127.0.0.1:0",
                    "--data-listen",
                    "127.0.0.1:0",
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
        println!(
            "started a master and {agents} agents ({} each) in {}\n",
            HumanBytes(capacity),
            cluster.dir.display()
        );
        Ok(cluster)
    }

    fn socket(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.sock", node_name(i)))
    }

    fn spawn(&mut self, name: &str, args: &[&str]) -> Result<(), CliError> {
        let exe = std::env::current_exe()
            .map_err(|e| CliError::Other(format!("cannot find own executable: {e}")))?;
        let log_path = self.dir.join(format!("{name}.log"));
        let log = File::create(&log_path).map_err(|source| io_err(&log_path, source))?;
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
        if self.keep {
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
        let child = cmd
            .spawn()
            .map_err(|e| CliError::Other(format!("cannot start {name}: {e}")))?;
        self.children.push((name.to_string(), child));
        Ok(())
    }

    fn wait_ready(&mut self, agents: usize) -> Result<(), CliError> {
        let master = Master::connect(&self.master_addr, &self.token)?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            for (name, child) in &mut self.children {
                if let Ok(Some(status)) = child.try_wait() {
                    let log = self.dir.join(format!("{name}.log"));
                    return Err(CliError::Other(format!(
                        "{name} exited ({status}) during start-up:\n{}",
                        tail(&log, 8)
                    )));
                }
            }
            let up = master
                .nodes()
                .map(|n| n.iter().filter(|s| s.state == NodeState::Up as i32).count())
                .unwrap_or(0);
            let sockets = (0..agents).all(|i| self.socket(i).exists());
            if up == agents && sockets {
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
            .children
            .iter()
            .map(|(_, c)| c.id().to_string())
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
        self.children.clear();
        self.dir = PathBuf::new();
    }

    /// SIGTERM to every daemon, SIGKILL after [`STOP_TIMEOUT`], then the
    /// directory goes.
    fn shutdown(&mut self) {
        for (_, child) in &self.children {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        for (name, mut child) in self.children.drain(..) {
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

fn free_port() -> Result<u16, CliError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| CliError::Other(format!("cannot find a free port: {e}")))
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
