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
use crate::process::{free_port, private_dir};

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
        let dir = private_dir("oncilla-etcd")?;
        let ports = (0..members.max(1))
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
    /// [`ClusterError::EtcdNotUp`] with the members' logs' directory.
    pub fn wait_healthy(&self, limit: Duration) -> Result<(), ClusterError> {
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
            if Instant::now() > deadline {
                return Err(ClusterError::EtcdNotUp {
                    limit,
                    dir: self.dir.clone(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
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
