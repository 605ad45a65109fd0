//! What operators and their tools see of a cluster (issue 23): health on
//! every daemon (the gRPC health protocol, as probes ask it, and
//! `ocmctl health`), readiness that follows the roles (the master after
//! its recovery window, an agent while the master knows it), and systemd's
//! `READY=1` once a daemon is ready.
#![allow(clippy::unwrap_used)]

mod support;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use oncilla_ops::health;
use support::Cluster;

const BOUND: Duration = Duration::from_secs(15);

/// Agents' gRPC addresses, from the master.
fn agent_addrs(c: &Cluster) -> Vec<String> {
    c.master()
        .unwrap()
        .nodes()
        .unwrap()
        .into_iter()
        .map(|n| n.info.agent_addr)
        .collect()
}

fn status(addr: &str, service: &str) -> String {
    health::check(addr, service, None).unwrap_or_else(|e| e.to_string())
}

#[test]
fn health_follows_each_role_and_ocmctl_reports_it() {
    // 1 s heartbeats: a 3 s recovery window to see.
    let mut c = Cluster::start_heartbeat(2, "16MiB", 1000);
    let agents = agent_addrs(&c);
    assert_eq!(agents.len(), 2);
    // Readiness is published by a task of its own, just after the
    // window ends and the registration is answered.
    assert!(Cluster::eventually(BOUND, || status(&c.master_addr, "") == "SERVING"));
    assert_eq!(status(&c.master_addr, health::MASTER), "SERVING");
    for a in &agents {
        assert!(Cluster::eventually(BOUND, || status(a, "") == "SERVING"));
        assert_eq!(status(a, health::AGENT), "SERVING");
        assert_eq!(status(a, health::MASTER), "SERVICE_UNKNOWN");
    }
    let out = c.ocmctl(&["health"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).ends_with(": SERVING\n"));

    // Without the master, agents are not ready (the master does not know
    // them), and say so to probes; ocmctl health exits non-zero.
    c.kill_master();
    for a in &agents {
        assert!(
            Cluster::eventually(BOUND, || status(a, "") == "NOT_SERVING"),
            "{a} still says {}",
            status(a, "")
        );
        let out = c.ocmctl(&["health", a, "--role", "agent"]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("NOT_SERVING"));
    }

    // A new master is not ready during its recovery window, then is; the
    // agents are ready again once they have registered.
    c.start_master();
    assert!(Cluster::eventually(BOUND, || !status(&c.master_addr, "").contains("no answer")));
    let left = c.master().unwrap().node_list().unwrap().recovering_ms;
    let said = status(&c.master_addr, health::MASTER);
    assert!(
        left > 500,
        "the window passed before the test looked ({left} ms left)"
    );
    assert_eq!(said, "NOT_SERVING", "a recovering master said it serves");
    assert!(Cluster::eventually(BOUND, || status(&c.master_addr, "") == "SERVING"));
    for a in &agents {
        assert!(Cluster::eventually(BOUND, || status(a, "") == "SERVING"));
    }
}

#[test]
fn each_daemon_tells_systemd_it_is_ready_once() {
    let dir = std::env::temp_dir().join(format!("oncilla-notify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let c = Cluster::start_env(2, "16MiB", &[("NOTIFY_SOCKET", path.to_str().unwrap())]);
    let mut ready = 0;
    let until = Instant::now() + BOUND;
    let mut buf = [0u8; 512];
    // The master and two agents, each once; then nothing more for a while.
    while Instant::now() < until && ready < 3 {
        if let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]);
            assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
            ready += 1;
        }
    }
    assert_eq!(ready, 3, "READY=1 from master and both agents");
    let quiet_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < quiet_until {
        assert!(sock.recv(&mut buf).is_err(), "a daemon said READY twice");
    }
    c.still_serves();
    drop(c);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn ocmctl_top_shows_nodes_and_allocations_frame_after_frame() {
    let c = Cluster::start(2, "16MiB");
    let out = c.ocmctl(&["alloc", "1MiB", "--node", "node-1", "--name", "seen-by-top"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c.ocmctl(&["top", "--count", "2", "--interval", "200ms"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let frames: Vec<&str> = text.split("--- frame ").skip(1).collect();
    assert_eq!(frames.len(), 2, "{text}");
    for f in frames {
        assert!(f.contains("2 nodes, 1 allocations"), "{f}");
        assert!(
            f.contains("node-0") && f.contains("node-1") && f.contains("seen-by-top"),
            "{f}"
        );
    }
    let out = c.ocmctl(&["top", "--count", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nodes"].as_array().unwrap().len(), 2);
    assert_eq!(v["allocations"][0]["name"], "seen-by-top");
    let bad = c.ocmctl(&["top", "--interval", "10ms"]);
    assert!(!bad.status.success());
    // A master that cannot be reached is shown, frame after frame.
    let out = c.ocmctl(&[
        "top",
        "--count",
        "2",
        "--interval",
        "0.2s",
        "--master",
        "127.0.0.1:1",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let frames: Vec<&str> = text.split("--- frame ").skip(1).collect();
    assert_eq!(frames.len(), 2, "{text}");
    for f in frames {
        assert!(f.contains(" UTC\n"), "{f}");
        assert!(f.contains("master 127.0.0.1:1: master unreachable"), "{f}");
    }
}

/// A second agent under a live node's name is refused by the master, and
/// says so and exits (before, it logged "master unreachable" and retried
/// for ever); the first keeps serving.
#[test]
fn an_agent_whose_name_is_taken_says_so_and_exits() {
    let c = Cluster::start(2, "16MiB");
    let socket = c.dir.join("twin.sock");
    let mut twin = std::process::Command::new(support::bin("oncillad"))
        .args(["--join", &c.master_addr, "--name", "node-1"])
        .args(["--capacity", "4MiB", "--listen", "127.0.0.1:0"])
        .args(["--data-listen", "127.0.0.1:0", "--socket"])
        .arg(&socket)
        .arg("--token-file")
        .arg(c.token_file())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ended = Cluster::eventually(Cluster::EVENT, || twin.try_wait().unwrap().is_some());
    if !ended {
        let _ = twin.kill();
    }
    let out = twin.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(ended, "the twin still runs: {err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the master refused this node") && err.contains("cannot take its name"),
        "{err}"
    );
    assert!(!err.contains("master unreachable"), "{err}");
    c.still_serves();
    let nodes = c.nodes();
    assert_eq!(nodes.len(), 2);
}
