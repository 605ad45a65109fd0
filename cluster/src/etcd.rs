//! A real etcd for elected masters: one member or several, as `etcd`
//! processes on loopback ports, each with its data and log in a private
//! directory; members can be killed and started again. It owns those
//! processes and that directory and removes both when dropped; it never
//! touches an etcd it did not start.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::ClusterError;
use crate::process::{free_bytes, free_port, last_lines, private_dir_in};

/// How many of a member's last log lines a failed start prints.
const POST_MORTEM_LINES: usize = 15;

/// The etcd program (Debian's `etcd-server`).
const PROGRAM: &str = "etcd";

/// A running etcd cluster on loopback.
pub struct Etcd {
    dir: PathBuf,
    /// Each member's client and peer ports.
    ports: Vec<(u16, u16)>,
    members: Vec<Option<Child>>,
}

impl Etcd {
    /// Whether the etcd program can be run here.
    pub fn available() -> bool {
        Command::new(PROGRAM)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts `members` members (1 or more) and waits, within `limit`,
    /// until every one answers its health check.
    ///
    /// # Errors
    /// A port, the directory or a process cannot be had, or the members
    /// are not healthy in time.
    pub fn start(members: usize, limit: Duration) -> Result<Self, ClusterError> {
        let members = members.max(1);
        let dir = private_dir_in(&data_base(members), "oncilla-etcd")?;
        let ports = (0..members)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<Vec<_>, ClusterError>>()?;
        let mut etcd = Self {
            dir,
            members: ports.iter().map(|_| None).collect(),
            ports,
        };
        for i in 0..etcd.ports.len() {
            etcd.start_member(i)?;
        }
        etcd.wait_healthy(limit)?;
        Ok(etcd)
    }

    /// The members' client URLs (what `--etcd` takes).
    pub fn urls(&self) -> Vec<String> {
        (0..self.ports.len()).map(|i| self.url(i)).collect()
    }

    fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i].0)
    }

    fn name(i: usize) -> String {
        format!("e{i}")
    }

    /// Starts member `i` (again, on its data: it rejoins its cluster).
    ///
    /// # Errors
    /// It runs already, or cannot be started.
    pub fn start_member(&mut self, i: usize) -> Result<(), ClusterError> {
        if self.members.get(i).is_none_or(Option::is_some) {
            return Err(ClusterError::Running(Self::name(i)));
        }
        let peers: Vec<String> = self
            .ports
            .iter()
            .enumerate()
            .map(|(j, (_, peer))| format!("{}=http://127.0.0.1:{peer}", Self::name(j)))
            .collect();
        let peer = self.ports[i].1;
        let log_path = self.dir.join(format!("{}.log", Self::name(i)));
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| ClusterError::io(&log_path, source))?;
        let child = Command::new(PROGRAM)
            .args(["--name", &Self::name(i), "--data-dir"])
            .arg(self.dir.join(Self::name(i)))
            .args(["--listen-client-urls", &self.url(i)])
            .args(["--advertise-client-urls", &self.url(i)])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
            ])
            .args(["--initial-cluster", &peers.join(",")])
            .args(["--initial-cluster-token", "oncilla-test"])
            .args([
                "--listen-metrics-urls",
                &format!("http://127.0.0.1:{}", free_port()?),
            ])
            .env_remove("ETCD_NAME")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|source| ClusterError::io(std::path::Path::new(PROGRAM), source))?;
        self.members[i] = Some(child);
        Ok(())
    }

    /// SIGKILL to member `i`.
    pub fn kill_member(&mut self, i: usize) {
        if let Some(Some(mut c)) = self.members.get_mut(i).map(Option::take) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits, within `limit`, until every running member says it is
    /// healthy (`GET /health`: it has a leader and serves).
    ///
    /// # Errors
    /// [`ClusterError::EtcdNotUp`], at once when a member has exited,
    /// with each member's state and log.
    pub fn wait_healthy(&mut self, limit: Duration) -> Result<(), ClusterError> {
        let deadline = Instant::now() + limit;
        loop {
            let all = self
                .members
                .iter()
                .enumerate()
                .filter(|(_, m)| m.is_some())
                .all(|(i, _)| healthy(self.ports[i].0));
            if all {
                return Ok(());
            }
            let exited = self
                .members
                .iter_mut()
                .flatten()
                .any(|c| !matches!(c.try_wait(), Ok(None)));
            if exited || Instant::now() > deadline {
                return Err(ClusterError::EtcdNotUp {
                    limit,
                    members: self.post_mortem(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Etcd {
    /// Each member's state (running, exited and how, or stopped by the
    /// caller), its ports and its log's last lines: what a failed start
    /// prints, since the directory goes when `self` is dropped.
    fn post_mortem(&mut self) -> String {
        let mut out = String::new();
        for i in 0..self.members.len() {
            let state = match self.members[i].as_mut().map(Child::try_wait) {
                None => "stopped by the caller".to_string(),
                Some(Ok(None)) => "running".to_string(),
                Some(Ok(Some(status))) => format!("exited ({status})"),
                Some(Err(e)) => format!("state unknown: {e}"),
            };
            let (client, peer) = self.ports[i];
            let log = self.dir.join(format!("{}.log", Self::name(i)));
            out.push_str(&format!(
                "{} (client port {client}, peer port {peer}): {state}; the last lines of its log:\n{}\n",
                Self::name(i),
                fatal_and_tail(&log)
            ));
        }
        let free = free_bytes(&self.dir).map_or("unknown".into(), |b| format!("{} MiB", b >> 20));
        out.push_str(&format!(
            "free space where they keep data ({}): {free}",
            self.dir.display()
        ));
        out
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill_member(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A member's log's fatal lines (etcd logs why it stops with a ` C | `
/// line or a Go panic, above a long stack dump) and its last lines.
fn fatal_and_tail(log: &std::path::Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let fatal: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" C | ") || l.starts_with("panic:"))
        .take(3)
        .collect();
    let last = last_lines(&text, POST_MORTEM_LINES);
    if fatal.is_empty() {
        last
    } else {
        format!("{}\n[…]\n{last}", fatal.join("\n"))
    }
}

/// Where the members keep their data. Each member preallocates two 64 MB
/// write-ahead-log segments as it starts (123 MB on disk before its first
/// write); a test machine's disk may lack that for three members while
/// its memory has plenty, so they go in `/dev/shm` (memory) where it has
/// room, and in the temporary directory otherwise.
fn data_base(members: usize) -> PathBuf {
    const PER_MEMBER: u64 = 256 << 20;
    let shm = std::path::Path::new("/dev/shm");
    let need = PER_MEMBER.saturating_mul(members as u64);
    if free_bytes(shm).is_some_and(|free| free >= need) {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Whether the member on `port` answers `GET /health` with health true.
fn healthy(port: u16) -> bool {
    let ask = || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(1),
        )?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut answer = String::new();
        s.take(64 << 10).read_to_string(&mut answer)?;
        Ok(answer)
    };
    ask().is_ok_and(|a| a.contains("\"health\":\"true\""))
}
