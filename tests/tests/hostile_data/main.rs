//! Denial-of-service attacks on every listener of a real cluster (issue
//! 21): strangers that connect and say nothing, or drip a byte a second, to
//! the data port, the map socket and the gRPC port; an agent out of file
//! descriptors; a reader that asks for a large read and never reads. Each
//! test performs the attack from this process over loopback, asserts the
//! harmless outcome, and then that the cluster still serves a normal
//! alloc / copy_in / copy_out / free. Every loop is bounded in count and
//! time. The attacks are in `strangers`, `exhaustion` and `pulls`; this
//! file holds what they share.

#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod exhaustion;
mod pulls;
mod strangers;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Fabric, Kind, Oncilla};
use oncilla_net::wire::{self, Op, Reply, Request, Status, Welcome, KEY_LEN, REPLY_LEN};
use support::{tcp_closed, unix_closed, Cluster};

/// The agent's whole-handshake deadline (`fabric::tcp::HANDSHAKE_DEADLINE`).
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// The agent's no-progress deadline on a data request (`STALL_DEADLINE`):
/// a send that made some progress before it ran out is given one more, so
/// a stalled reader is cut within twice this.
const STALL_DEADLINE: Duration = Duration::from_secs(10);

/// The map socket's deadline for a hello and first request.
const MAP_DEADLINE: Duration = Duration::from_secs(10);

/// The gRPC port's deadline for the HTTP/2 preface.
const PREFACE_DEADLINE: Duration = Duration::from_secs(5);

/// Time allowed on top of a deadline for the agent to act and us to see it.
const SLACK: Duration = Duration::from_secs(4);

/// Pending-handshake budgets (data port and map socket).
const MAX_PENDING: usize = 64;

/// How many hostile connections this process can hold next to a cluster.
fn hostile_budget(want: usize) -> usize {
    let limit = usize::try_from(support::raise_nofile(16_384)).unwrap_or(1024);
    want.min(limit.saturating_sub(300))
}

/// The data address of node `name`, from the master.
fn data_addr(c: &Cluster, name: &str) -> SocketAddr {
    let nodes = c.master().expect("master").nodes().expect("nodes");
    let info = nodes
        .into_iter()
        .map(|n| n.info)
        .find(|i| i.name == name)
        .expect("node listed");
    info.data_addr.parse().expect("data address")
}

/// Opens up to `n` TCP connections to `addr` that send nothing, within
/// `limit` (connections the kernel does not complete quickly are skipped).
fn idle_tcp(addr: SocketAddr, n: usize, limit: Duration) -> Vec<TcpStream> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::with_capacity(n);
    while out.len() < n && Instant::now() < deadline {
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
            out.push(s);
        }
    }
    out
}

/// Calls `poll` about once a second (it may also act, as drippers do)
/// until `deadline + SLACK` after `started`, and returns how many
/// connections it last counted open. Each deadline runs from the agent's
/// accept, and a slow machine (the emulated Soft-RoCE guest) accepts the
/// last of a burst late, so stragglers get up to one more deadline;
/// without a deadline none would ever close.
fn open_past_deadline(
    started: Instant,
    deadline: Duration,
    mut poll: impl FnMut() -> usize,
) -> usize {
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let open = poll();
        let past = started.elapsed();
        if (past >= deadline + SLACK && open == 0) || past >= 2 * deadline + SLACK {
            return open;
        }
    }
}

/// Agent `i`'s thread count, from /proc.
fn threads(c: &Cluster, i: usize) -> usize {
    let pid = c.agent_pid(i).expect("agent running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("Threads: line")
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// A fresh session (so a fresh data connection) copies `n` bytes in and
/// out of a TCP allocation on `node` and frees it.
fn normal_copy(c: &Cluster, node: &str, n: usize, seed: u8) {
    let ocm = c.client(0);
    normal_copy_with(&ocm, node, n, seed);
}

fn normal_copy_with(ocm: &Oncilla, node: &str, n: usize, seed: u8) {
    let a = ocm
        .alloc_with(
            &AllocSpec::new(n as u64, Kind::RemoteHost)
                .on_nodes([node])
                .fabric(Fabric::Tcp),
        )
        .unwrap_or_else(|e| panic!("alloc on {node}: {e}"));
    let data = pattern(n, seed);
    a.copy_in(0, &data)
        .unwrap_or_else(|e| panic!("copy_in of {n} bytes to {node}: {e}"));
    let mut back = vec![0u8; n];
    a.copy_out(0, &mut back)
        .unwrap_or_else(|e| panic!("copy_out of {n} bytes from {node}: {e}"));
    assert!(back == data, "{n} bytes from {node} came back different");
    a.free().expect("free");
}

/// A persistent allocation made through the master, with what a raw data
/// client needs: id, access key, and the data address of its one extent.
fn raw_allocation(c: &Cluster, size: u64, node: &str) -> (u64, [u8; KEY_LEN], SocketAddr) {
    let a = c.persistent_on(size, node);
    let key: [u8; KEY_LEN] = a.access_key.as_slice().try_into().expect("key length");
    assert_eq!(a.extents.len(), 1, "one extent on {node}");
    let addr = a.extents[0].data_addr.parse().expect("data address");
    (a.id, key, addr)
}

/// An extra agent started by this test (not by the harness) with its own
/// RLIMIT_NOFILE; killed on drop.
struct LimitedAgent(std::process::Child);

impl Drop for LimitedAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts agent `name` joining `c`'s master, with at most `nofile` open
/// descriptors, logging to `log`.
fn start_limited_agent(
    c: &Cluster,
    name: &str,
    nofile: u64,
    log: &std::path::Path,
) -> LimitedAgent {
    use std::os::unix::process::CommandExt;
    let socket = c.dir.join(format!("{name}.sock"));
    let mut cmd = std::process::Command::new(support::bin("oncillad"));
    cmd.args(["--join", &c.master_addr, "--name", name])
        .args(["--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0"])
        .arg("--socket")
        .arg(&socket)
        .args(["--capacity", "16MiB", "--heartbeat-ms", "200"])
        .arg("--token-file")
        .arg(c.token_file())
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"));
    // SAFETY: the closure only makes one system call (setrlimit), which is
    // async-signal-safe, and touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::resource::setrlimit(
                nix::sys::resource::Resource::RLIMIT_NOFILE,
                nofile,
                nofile,
            )
            .map_err(std::io::Error::from)
        });
    }
    LimitedAgent(cmd.spawn().expect("start the limited agent"))
}
