//! The tests' view of a local cluster: [`oncilla_cluster`] (the one
//! launcher: `oncillad` processes on loopback in a private directory,
//! bounded waits, every process killed and the directory removed on drop)
//! with the tests' settings, plus what only tests need: the built
//! binaries, this run's RDMA devices and fabric, and helpers that drive
//! the cluster with liboncilla and `ocmctl` and read daemons' CPU time.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use liboncilla::{Fabric, Oncilla, Options};
use oncilla_cluster::{Config, Daemon, Stop};

/// How long a cluster may take to start: a bound, not a wait (a start
/// returns as soon as every agent is up). Generous because the Soft-RoCE
/// guest emulates its CPU (TCG) on a loaded 2-core host, where registering
/// an agent's pool with rxe alone has taken over 20 s.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The daemons' heartbeat in these tests: 200 ms (a node is suspect
/// after three missed, down after five), or `ONCILLA_TEST_HEARTBEAT_MS`
/// where the machine stalls for longer than that (the Soft-RoCE guest
/// runs under emulation and sets 1000). Failure detection is a setting
/// tuned to the platform's scheduling delays, not a speed a test assumes.
pub fn heartbeat_ms() -> u64 {
    std::env::var("ONCILLA_TEST_HEARTBEAT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// Raises this process's soft RLIMIT_NOFILE towards `want` (never past the
/// hard limit); daemons started afterwards inherit it. Returns the soft
/// limit now in force.
pub fn raise_nofile(want: u64) -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let target = want.min(hard).max(soft);
    if target > soft {
        setrlimit(Resource::RLIMIT_NOFILE, target, hard).expect("setrlimit");
    }
    target
}

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

/// A cluster started by [`oncilla_cluster`] with the tests' settings (the
/// built `oncillad`, [`heartbeat_ms`], 20 s to come up, SIGKILL on drop,
/// this run's RDMA devices): every launcher call is reachable through it
/// (`Deref`), the fallible ones panic here instead, and the helpers below
/// drive it with liboncilla and `ocmctl`.
pub struct Cluster(oncilla_cluster::Cluster);

impl std::ops::Deref for Cluster {
    type Target = oncilla_cluster::Cluster;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// Agent `i`'s arguments after the usual ones: this run's RDMA device for
/// it, unless `extra` names its own, then `extra`.
fn agent_args(i: usize, extra: &[&str]) -> Vec<String> {
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
    args
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
        Self::start_with(capacities, limit, false, heartbeat_ms(), &[])
    }

    /// [`Cluster::start`] with `standbys` more masters, all elected
    /// through the etcd members at `etcd` with leases of `lease_secs`.
    pub fn start_elected(
        agents: usize,
        capacity: &str,
        standbys: usize,
        etcd: &[String],
        lease_secs: u64,
    ) -> Self {
        let config = Config::new(Daemon::Binary(bin("oncillad")), &vec![capacity; agents])
            .heartbeat_ms(heartbeat_ms())
            .elected(standbys, etcd, lease_secs);
        Self::start_config(config, START_TIMEOUT)
    }

    /// [`Cluster::start`] with metrics on every daemon.
    pub fn start_metrics(agents: usize, capacity: &str) -> Self {
        let config = Config::new(Daemon::Binary(bin("oncillad")), &vec![capacity; agents])
            .metrics(true)
            .heartbeat_ms(heartbeat_ms());
        Self::start_config(config, START_TIMEOUT)
    }

    /// [`Cluster::start_metrics`] in a TLS cluster.
    pub fn start_tls_metrics(agents: usize, capacity: &str) -> Self {
        let config = Config::new(Daemon::Binary(bin("oncillad")), &vec![capacity; agents])
            .metrics(true)
            .tls(true)
            .heartbeat_ms(heartbeat_ms());
        Self::start_config(config, START_TIMEOUT)
    }

    /// [`Cluster::start`] with `env` set for every daemon.
    pub fn start_env(agents: usize, capacity: &str, env: &[(&str, &str)]) -> Self {
        Self::start_with(
            &vec![capacity; agents],
            START_TIMEOUT,
            false,
            heartbeat_ms(),
            env,
        )
    }

    /// [`Cluster::start`] with heartbeats every `ms` (a restarted master's
    /// recovery window is three of them).
    pub fn start_heartbeat(agents: usize, capacity: &str, ms: u64) -> Self {
        Self::start_with(&vec![capacity; agents], START_TIMEOUT, false, ms, &[])
    }

    /// [`Cluster::start`] with TLS on every daemon's TCP listeners (a
    /// cluster CA and certificates made in the cluster's directory).
    pub fn start_tls(agents: usize, capacity: &str) -> Self {
        Self::start_with(
            &vec![capacity; agents],
            START_TIMEOUT,
            true,
            heartbeat_ms(),
            &[],
        )
    }

    fn start_with(
        capacities: &[&str],
        limit: Duration,
        tls: bool,
        heartbeat_ms: u64,
        env: &[(&str, &str)],
    ) -> Self {
        let mut config = Config::new(Daemon::Binary(bin("oncillad")), capacities)
            .tls(tls)
            .heartbeat_ms(heartbeat_ms);
        for (k, v) in env {
            config = config.env(k, v);
        }
        Self::start_config(config, limit)
    }

    /// Starts `config` with the tests' settings (built `oncillad`, 20 s
    /// limit unless `limit` says otherwise, SIGKILL on drop, this run's
    /// RDMA devices).
    fn start_config(mut config: Config, limit: Duration) -> Self {
        let agents = config.agents();
        config = config
            .start_timeout(limit)
            .dir_prefix("oncilla-test")
            .env("RUST_LOG", "info")
            .inherit_oncilla_env(true)
            .stop(Stop::Kill);
        for i in 0..agents {
            config = config.agent_args(i, agent_args(i, &[]));
        }
        Self(oncilla_cluster::Cluster::start(config).unwrap_or_else(|e| panic!("{e}")))
    }

    /// Starts the master again on its address.
    pub fn start_master(&mut self) {
        self.0.start_master().unwrap_or_else(|e| panic!("{e}"));
    }

    pub fn token_file(&self) -> String {
        self.0.token_file().display().to_string()
    }

    /// Waits until the master lists `n` nodes up, their sockets exist and
    /// the master has left its recovery window (it takes allocations).
    pub fn wait_nodes_up(&self, n: usize) {
        self.0
            .wait_nodes_up_within(n, START_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"));
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
        !out.status.success() || String::from_utf8_lossy(&out.stderr).contains("master recovering")
    }

    /// A session through agent `i`.
    pub fn client(&self, i: usize) -> Oncilla {
        Oncilla::connect_with(Options::new(self.socket(i), self.token.clone()))
            .expect("connect to agent")
    }

    /// A data connection to `addr` that completed its hello with the
    /// cluster token (an operator's), as attacks on a data port use it.
    pub fn data_client(&self, addr: std::net::SocketAddr) -> std::net::TcpStream {
        use oncilla_net::wire::{self, Welcome};
        let mut s =
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        wire::write_hello(&mut s, self.token.as_bytes()).expect("hello");
        let (code, msg) = wire::read_welcome(&mut s).expect("welcome");
        assert_eq!(code, Welcome::Ok, "handshake refused: {msg}");
        s
    }

    /// Asserts the cluster still serves after an attack: a session through
    /// agent 0 allocates 1 MiB of local and of remote host memory, copies
    /// a pattern in and back out of each, and frees them.
    pub fn still_serves(&self) {
        let ocm = self.client(0);
        for kind in [liboncilla::Kind::LocalHost, liboncilla::Kind::RemoteHost] {
            let a = ocm
                .alloc(1 << 20, kind)
                .unwrap_or_else(|e| panic!("{kind:?} allocation after the attack: {e}"));
            let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
            a.copy_in(0, &data).expect("copy_in after the attack");
            let mut back = vec![0u8; 1 << 20];
            a.copy_out(0, &mut back).expect("copy_out after the attack");
            assert!(back == data, "{kind:?} bytes came back different");
            a.free().expect("free after the attack");
        }
    }

    /// Runs `call` on a raw master client with the cluster token, as any
    /// token holder can (attack tests); the status code and message of a
    /// refusal.
    pub fn master_raw<F, Fut, T>(&self, call: F) -> Result<T, (tonic::Code, String)>
    where
        F: FnOnce(oncilla_proto::client::MasterClient) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        use oncilla_proto::client;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the raw call");
        rt.block_on(async {
            let m = client::master(
                client::lazy(&self.master_addr, &self.token, self.tls.as_ref())
                    .expect("master address"),
            );
            call(m)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| (s.code(), s.message().to_string()))
        })
    }

    /// `ocmctl ARGS`' JSON output, from a run that must succeed.
    pub fn ocmctl_json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ocmctl_ok(args)).unwrap()
    }

    /// `ocmctl args` against this cluster, which must succeed: its output,
    /// trimmed.
    pub fn ocmctl_ok(&self, args: &[&str]) -> String {
        let out = self.ocmctl(args);
        assert!(
            out.status.success(),
            "ocmctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A persistent allocation of `size` bytes on `node`, made through the
    /// master with the token (as `ocmctl alloc` makes one): the record,
    /// access key included.
    pub fn persistent_on(&self, size: u64, node: &str) -> oncilla_model::alloc::Allocation {
        use oncilla_model::alloc::{AllocSpec, NodeShare, Placement};
        let placement = Placement {
            nodes: vec![NodeShare {
                node: node.to_string(),
                weight: 1,
            }],
            ..Default::default()
        };
        let spec = AllocSpec::new(
            size,
            oncilla_model::Kind::RemoteHost,
            placement,
            String::new(),
            true,
            oncilla_model::Fabric::Auto,
        )
        .expect("a valid spec");
        self.master()
            .expect("master")
            .allocate(spec)
            .expect("allocate through the master")
    }

    /// Runs ocmctl against this cluster.
    pub fn ocmctl(&self, args: &[&str]) -> Output {
        self.ocmctl_command(args).output().expect("run ocmctl")
    }

    /// ocmctl against this cluster, to be started by the caller (piped,
    /// spawned and signalled...).
    pub fn ocmctl_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("ocmctl"));
        cmd.args(args)
            .env("ONCILLA_MASTER", self.masters_arg())
            .env("ONCILLA_TOKEN_FILE", self.token_file())
            .env_remove("ONCILLA_TOKEN")
            .env_remove("ONCILLA_TLS_CA");
        if let Some(ca) = self.tls_ca() {
            cmd.env("ONCILLA_TLS_CA", ca);
        }
        cmd
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

    /// The bound on a wait for an event that comes (a scrub reported with a
    /// heartbeat, a thread or a connection that ends): long, so that only
    /// behaviour that is wrong runs into it, never a loaded machine. Waits
    /// whose deadline is the thing tested keep their own.
    pub const EVENT: Duration = Duration::from_secs(60);

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

    /// Asserts, waiting for it with a bound, that the master's accounts and
    /// every live agent's agree: per node, the bytes the master placed there,
    /// the bytes of the recorded extents of every copy there, and the agent's
    /// own count of pool bytes in use and of allocations it holds.
    pub fn accounts_agree(&self) {
        use oncilla_model::alloc::Allocation;
        use oncilla_model::node::NodeState;
        use oncilla_proto::{client, pb};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut last = String::new();
        let agree = Cluster::eventually(Self::EVENT, || {
            let m = self.master().unwrap();
            let allocs = m.allocations().unwrap();
            let mut differ = Vec::new();
            for n in m.nodes().unwrap() {
                if n.state != NodeState::Up {
                    continue;
                }
                let name = &n.info.name;
                let recorded: u64 = allocs
                    .iter()
                    .flat_map(Allocation::all_extents)
                    .filter(|e| &e.node == name)
                    .map(|e| e.len)
                    .sum();
                let holding = allocs.iter().filter(|a| a.held_on(name)).count();
                let agent = rt
                    .block_on(async {
                        let channel = client::lazy(&n.info.agent_addr, &self.token, None).unwrap();
                        client::agent(channel).status(pb::StatusRequest {}).await
                    })
                    .unwrap()
                    .into_inner();
                let pool_used = agent.pool.map_or(0, |p| p.used);
                let agent_holds = agent.allocations as usize;
                if (n.used, pool_used, agent_holds) != (recorded, recorded, holding) {
                    differ.push(format!(
                        "{name}: master placed {}, records {recorded} in {holding} allocations, agent uses {pool_used} in {agent_holds}",
                        n.used
                    ));
                }
            }
            last = differ.join("; ");
            differ.is_empty()
        });
        assert!(agree, "accounts differ: {last}");
    }

    /// SIGKILL to the master.
    pub fn kill_master(&mut self) {
        self.0.kill_master();
    }

    /// SIGKILL to agent `i`.
    pub fn kill_agent(&mut self, i: usize) {
        self.0.kill_agent(i);
    }

    /// SIGTERM to agent `i`, waiting (bounded) for it to exit.
    pub fn stop_agent(&mut self, i: usize) {
        self.0.stop_agent(i);
    }

    /// Starts agent `i` again with its name, ports and socket (an empty pool).
    pub fn start_agent(&mut self, i: usize) {
        self.start_agent_with(i, &[]);
    }

    /// [`Cluster::start_agent`] with extra arguments (an `--rdma-device`
    /// among them replaces the run's device for this agent).
    pub fn start_agent_with(&mut self, i: usize, extra: &[&str]) {
        self.0
            .start_agent_with(i, &agent_args(i, extra))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// CPU time agent `i` has used so far in user space and in the kernel
    /// (from /proc; the kernel's share includes whatever softirq work
    /// happened to interrupt it).
    pub fn agent_cpu(&self, i: usize) -> (Duration, Duration) {
        let pid = self.agent_pid(i).expect("agent running");
        let (_, user, kernel) =
            oncilla_cluster::procfs::stat(&format!("/proc/{pid}/stat")).expect("agent stat");
        (user, kernel)
    }

    /// Agent `i`'s threads by name with their user-space CPU time, busiest
    /// first (for messages that must say where CPU went).
    pub fn agent_threads(&self, i: usize) -> Vec<(String, Duration)> {
        let pid = self.agent_pid(i).expect("agent running");
        let mut out: Vec<(String, Duration)> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.flatten().collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|t| {
                let (name, user, _) =
                    oncilla_cluster::procfs::stat(t.path().join("stat").to_str()?)?;
                Some((name, user))
            })
            .collect();
        out.sort_by_key(|t| std::cmp::Reverse(t.1));
        out
    }

    /// Text of a daemon's log ("master", "node-1", ...).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.0.log(name)).unwrap_or_default()
    }
}

/// `n` bytes that change with `seed` and along the buffer (a copy that
/// lands at the wrong offset or from another buffer shows).
pub fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// `len` bytes of a pattern `seed` picks, with no short period (a page
/// copied to the wrong place shows).
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)).to_le_bytes()[2])
        .collect()
}

/// One HTTP/1.1 GET; the status code and the body (code 0: nothing
/// listens there yet).
pub fn get(addr: &str, path: &str, bearer: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    // A server that refuses the request may close before it is all
    // written or read (EPIPE, ECONNRESET: how soon depends on the
    // machine's load), and may answer bytes that are not text (a TLS
    // alert): what came back is parsed as it is, code 0 if no answer.
    let sent = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    );
    let mut reply = Vec::new();
    if sent.is_ok() {
        let _ = s.read_to_end(&mut reply);
    }
    parse_http(&String::from_utf8_lossy(&reply))
}

/// An HTTP/1.1 reply's status code and body (code 0: no status line); a
/// chunked body (Prometheus' larger answers) is joined.
pub fn parse_http(reply: &str) -> (u16, String) {
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((reply, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    if !chunked {
        return (code, body.to_string());
    }
    let (mut out, mut rest) = (String::new(), body);
    // Each chunk: its length in hex, CRLF, the bytes, CRLF; 0 ends it.
    while let Some((len, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].strip_prefix("\r\n").unwrap_or(&tail[n..]);
    }
    (code, out)
}

/// Whether the other end has closed `s` (end-of-file or reset), looking
/// without blocking and skipping whatever bytes it had sent.
pub fn closed_by_peer(s: &mut impl std::io::Read, set_nonblocking: impl Fn(bool)) -> bool {
    set_nonblocking(true);
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    set_nonblocking(false);
    closed
}

/// [`closed_by_peer`] for a TCP connection.
pub fn tcp_closed(s: &std::net::TcpStream) -> bool {
    closed_by_peer(&mut &*s, |b| s.set_nonblocking(b).expect("nonblocking"))
}

/// [`closed_by_peer`] for a Unix socket.
pub fn unix_closed(s: &std::os::unix::net::UnixStream) -> bool {
    closed_by_peer(&mut &*s, |b| s.set_nonblocking(b).expect("nonblocking"))
}

/// The value of the sample `series` (name and labels as printed) in
/// `text`, if present.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// Sends one raw data request (its header, then `after`: a write's
/// payload, a pull's source record) on `s` and reads the reply: its
/// status and body (a read's data, or the message of a refusal).
pub fn data_exchange(
    s: &mut std::net::TcpStream,
    req: &oncilla_net::wire::Request,
    after: &[u8],
) -> (oncilla_net::wire::Status, Vec<u8>) {
    use oncilla_net::wire::{Reply, REPLY_LEN};
    use std::io::{Read, Write};
    s.write_all(&req.encode()).unwrap();
    s.write_all(after).unwrap();
    let mut head = [0u8; REPLY_LEN];
    s.read_exact(&mut head).unwrap();
    let reply = Reply::decode(&head).unwrap();
    let mut body = vec![0u8; usize::try_from(reply.len).unwrap()];
    s.read_exact(&mut body).unwrap();
    (reply.status, body)
}
