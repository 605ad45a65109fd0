//! A real cluster for tests: `oncillad` processes on loopback in a private
//! directory, plus helpers to drive them with liboncilla and `ocmctl`.
//! Every wait is bounded; dropping the cluster kills every process it
//! started and removes its directory.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use liboncilla::{Fabric, Oncilla, Options};
use oncilla_proto::auth::Token;

/// How long a cluster may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Path of a workspace binary built next to this test executable.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} not built; run the workspace tests with `cargo test --workspace`",
        path.display()
    );
    path
}

/// The RDMA devices this run puts agents on (`ONCILLA_TEST_RDMA_DEV`,
/// comma-separated: agent `i` gets device `i` modulo their number), empty
/// when it has none. Set by `deploy/softroce/verbs-tests.sh` inside the
/// Soft-RoCE guest, or by hand on a host with an HCA.
pub fn rdma_devices() -> Vec<String> {
    std::env::var("ONCILLA_TEST_RDMA_DEV")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .collect()
}

/// Whether copies to other nodes go over verbs in this run: RDMA devices
/// are given and these tests (and so the daemons) were built with the
/// `verbs` feature.
pub fn rdma() -> bool {
    cfg!(feature = "verbs") && !rdma_devices().is_empty()
}

/// The fabric `auto` uses for host memory on another node in this run.
pub fn remote_fabric() -> Fabric {
    if rdma() {
        Fabric::Verbs
    } else {
        Fabric::Tcp
    }
}

pub struct Cluster {
    pub dir: PathBuf,
    pub token: Token,
    pub master_addr: String,
    /// Each agent's pool capacity.
    capacities: Vec<String>,
    master: Option<Child>,
    agents: Vec<Option<Child>>,
    /// Each agent's gRPC and data ports, kept across restarts.
    ports: Vec<(u16, u16)>,
}

/// A loopback port free right now, below the kernel's ephemeral range
/// (32768 and up by default): a port from that range can be taken as the
/// source port of some other test's outgoing connection before the daemon
/// binds it.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = u64::from(std::process::id()) * 7919 + NEXT.fetch_add(1, Ordering::Relaxed) * 131;
    (0..2000u64)
        .map(|i| 20000 + ((seed + i * 17) % 12000) as u16)
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .expect("a free port below 32000")
}

impl Cluster {
    /// A master and `agents` agents named node-0.., each exporting `capacity`.
    pub fn start(agents: usize, capacity: &str) -> Self {
        Self::start_sized(&vec![capacity; agents], START_TIMEOUT)
    }

    /// A master and one agent per entry of `capacities` (node-0..), each
    /// exporting its own capacity, allowing `limit` for them to come up (a
    /// large pool takes a while to populate and lock).
    pub fn start_sized(capacities: &[&str], limit: Duration) -> Self {
        let agents = capacities.len();
        let dir = std::env::temp_dir().join(format!(
            "oncilla-test-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let token = Token::random();
        std::fs::write(dir.join("token"), token.as_str()).unwrap();
        let mut c = Self {
            dir,
            token,
            master_addr: format!("127.0.0.1:{}", free_port()),
            capacities: capacities.iter().map(|c| c.to_string()).collect(),
            master: None,
            agents: Vec::new(),
            ports: (0..agents).map(|_| (free_port(), free_port())).collect(),
        };
        c.start_master();
        for i in 0..agents {
            let child = c.spawn_agent(i);
            c.agents.push(Some(child));
        }
        c.wait_nodes_up_within(agents, limit);
        c
    }

    fn spawn(&self, log: &str, args: &[&str]) -> Child {
        // Appended: a restarted daemon's log follows its predecessor's.
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join(log))
            .unwrap();
        Command::new(bin("oncillad"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start oncillad")
    }

    pub fn start_master(&mut self) {
        let tf = self.token_file();
        let child = self.spawn(
            "master.log",
            &[
                "--master",
                "--listen",
                &self.master_addr.clone(),
                "--token-file",
                &tf,
                "--heartbeat-ms",
                "200",
            ],
        );
        self.master = Some(child);
    }

    fn spawn_agent(&self, i: usize) -> Child {
        self.spawn_agent_with(i, &[])
    }

    /// Agent `i` with `extra` arguments after the usual ones.
    fn spawn_agent_with(&self, i: usize, extra: &[&str]) -> Child {
        let sock = self.socket(i).display().to_string();
        let name = format!("node-{i}");
        let (grpc, data) = self.ports[i];
        let devices = rdma_devices();
        let mut args: Vec<String> = Vec::new();
        let own_device = extra.contains(&"--rdma-device");
        if let Some(dev) = devices
            .get(i % devices.len().max(1))
            .filter(|_| !own_device)
        {
            args.extend(["--rdma-device".to_string(), dev.clone()]);
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.spawn(
            &format!("{name}.log"),
            &[
                "--join",
                &self.master_addr,
                "--name",
                &name,
                "--listen",
                &format!("127.0.0.1:{grpc}"),
                "--data-listen",
                &format!("127.0.0.1:{data}"),
                "--socket",
                &sock,
                "--capacity",
                &self.capacities[i],
                "--token-file",
                &self.token_file(),
                "--heartbeat-ms",
                "200",
            ]
            .into_iter()
            .chain(args)
            .collect::<Vec<_>>(),
        )
    }

    pub fn token_file(&self) -> String {
        self.dir.join("token").display().to_string()
    }

    pub fn socket(&self, i: usize) -> PathBuf {
        self.dir.join(format!("node-{i}.sock"))
    }

    /// Waits until the master lists `n` nodes up, their sockets exist and
    /// the master has left its recovery window (it takes allocations).
    pub fn wait_nodes_up(&self, n: usize) {
        self.wait_nodes_up_within(n, START_TIMEOUT);
    }

    fn wait_nodes_up_within(&self, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if self.nodes_up() == n
                && (0..n).all(|i| self.socket(i).exists())
                && !self.master_recovering()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster not up in time; logs in {}",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Number of nodes the master lists as up (0 when it cannot be reached).
    pub fn nodes_up(&self) -> usize {
        self.nodes().iter().filter(|n| n["state"] == "up").count()
    }

    /// `ocmctl nodes --json`, empty when the master cannot be reached.
    pub fn nodes(&self) -> Vec<serde_json::Value> {
        let out = self.ocmctl(&["nodes", "--json"]);
        if !out.status.success() {
            return Vec::new();
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array().cloned().unwrap_or_default()
    }

    /// One node's entry in `ocmctl nodes --json`.
    pub fn node(&self, name: &str) -> Option<serde_json::Value> {
        self.nodes().into_iter().find(|n| n["name"] == name)
    }

    /// Whether the master still waits for agents to re-register (or
    /// cannot be reached).
    pub fn master_recovering(&self) -> bool {
        let out = self.ocmctl(&["nodes"]);
        !out.status.success() || String::from_utf8_lossy(&out.stdout).contains("master recovering")
    }

    /// A session through agent `i`.
    pub fn client(&self, i: usize) -> Oncilla {
        Oncilla::connect_with(Options::new(self.socket(i), self.token.clone()))
            .expect("connect to agent")
    }

    /// Runs ocmctl against this cluster.
    pub fn ocmctl(&self, args: &[&str]) -> Output {
        Command::new(bin("ocmctl"))
            .args(args)
            .env("ONCILLA_MASTER", &self.master_addr)
            .env("ONCILLA_TOKEN_FILE", self.token_file())
            .env_remove("ONCILLA_TOKEN")
            .output()
            .expect("run ocmctl")
    }

    /// Number of allocations the master lists.
    pub fn allocation_count(&self) -> usize {
        let out = self.ocmctl(&["allocs", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array().unwrap().len()
    }

    /// Polls `cond` every 50 ms for up to `limit`.
    pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        cond()
    }

    /// SIGKILL to the master.
    pub fn kill_master(&mut self) {
        if let Some(mut c) = self.master.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL to agent `i`.
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(mut c) = self.agents[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM to agent `i`, waiting (bounded) for it to exit.
    pub fn stop_agent(&mut self, i: usize) {
        if let Some(mut c) = self.agents[i].take() {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let exited = Self::eventually(Duration::from_secs(10), || {
                matches!(c.try_wait(), Ok(Some(_)))
            });
            if !exited {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }

    /// Starts agent `i` again with its name, ports and socket (an empty pool).
    pub fn start_agent(&mut self, i: usize) {
        self.start_agent_with(i, &[]);
    }

    /// [`Cluster::start_agent`] with extra arguments (an `--rdma-device`
    /// among them replaces the run's device for this agent).
    pub fn start_agent_with(&mut self, i: usize, extra: &[&str]) {
        assert!(self.agents[i].is_none(), "agent {i} is running");
        let child = self.spawn_agent_with(i, extra);
        self.agents[i] = Some(child);
    }

    /// CPU time agent `i` has used so far in user space and in the kernel
    /// (from /proc; the kernel's share includes whatever softirq work
    /// happened to interrupt it).
    pub fn agent_cpu(&self, i: usize) -> (Duration, Duration) {
        let pid = self.agents[i].as_ref().expect("agent running").id();
        let (_, user, kernel) = proc_stat(&format!("/proc/{pid}/stat")).expect("agent stat");
        (user, kernel)
    }

    /// Agent `i`'s threads by name with their user-space CPU time, busiest
    /// first (for messages that must say where CPU went).
    pub fn agent_threads(&self, i: usize) -> Vec<(String, Duration)> {
        let pid = self.agents[i].as_ref().expect("agent running").id();
        let mut out: Vec<(String, Duration)> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.flatten().collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|t| {
                let (name, user, _) = proc_stat(t.path().join("stat").to_str()?)?;
                Some((name, user))
            })
            .collect();
        out.sort_by_key(|t| std::cmp::Reverse(t.1));
        out
    }

    /// Text of a daemon's log ("master", "node-1", ...).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let children = self
            .master
            .iter_mut()
            .chain(self.agents.iter_mut().flatten());
        for c in children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A process's or thread's name and its user-space and kernel CPU time,
/// from its /proc `stat` file; `None` when it is gone or unreadable.
fn proc_stat(path: &str) -> Option<(String, Duration, Duration)> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The name is in parentheses and may hold spaces; fields follow it.
    let name = stat[stat.find('(')? + 1..stat.rfind(')')?].to_string();
    let mut fields = stat[stat.rfind(')')? + 2..].split_whitespace().skip(11);
    let hz = clk_tck();
    let mut time = || -> Option<Duration> {
        let ticks: u64 = fields.next()?.parse().ok()?;
        Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
    };
    let user = time()?;
    let kernel = time()?;
    Some((name, user, kernel))
}

/// `sysconf(_SC_CLK_TCK)`: the unit of /proc's CPU times.
fn clk_tck() -> u64 {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100);
    u64::try_from(ticks).unwrap_or(100)
}
