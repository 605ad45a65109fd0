//! A cluster whose nodes sit in separate network namespaces joined by veth
//! pairs (deploy/netns-cluster.sh), so data really crosses a network stack
//! between hosts, and a node can be cut off the network or killed. Needs
//! root and iproute2 (and etcd, for the elected masters' test); elsewhere
//! it says why it skipped. Every wait is
//! bounded; the namespaces go away even when a test fails.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

struct NetnsCluster {
    script: PathBuf,
    dir: PathBuf,
    prefix: String,
    /// Settings of deploy/netns-cluster.sh beside the usual ones.
    env: Vec<(&'static str, &'static str)>,
}

impl NetnsCluster {
    fn cmd(&self, args: &[&str]) -> Output {
        let bin = support::bin("oncillad");
        Command::new("bash")
            .arg(&self.script)
            .args(args)
            .env("ONCILLA_BIN", bin.parent().unwrap())
            .env("ONCILLA_NETNS_DIR", &self.dir)
            .env("ONCILLA_NETNS_PREFIX", &self.prefix)
            // Failure detection in about a second.
            .env("ONCILLA_HEARTBEAT_MS", "200")
            .env_remove("ONCILLA_TOKEN")
            .envs(self.env.iter().copied())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(
            out.status.success(),
            "{args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // What a failed test needs to say why: each daemon's last lines.
            for name in ["node-0", "node-1", "node-2", "etcd"] {
                let log = self.dir.join(format!("{name}.log"));
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!(
                    "--- the last lines of {}:\n{}",
                    log.display(),
                    lines[lines.len().saturating_sub(30)..].join("\n")
                );
            }
        }
        let _ = self.cmd(&["down"]);
    }
}

fn skip_reason() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("not root".into());
    }
    match Command::new("ip").args(["netns", "list"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`ip netns` unusable: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("no iproute2 (`ip`): {e}")),
    }
}

impl NetnsCluster {
    /// A cluster named by `tag` (namespaces and links of concurrent tests
    /// must not collide), or None with the reason printed.
    fn new(tag: &str) -> Option<Self> {
        if let Some(why) = skip_reason() {
            println!("skipped netns cluster test: {why}");
            return None;
        }
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let pid = std::process::id();
        Some(Self {
            script: root.join("deploy/netns-cluster.sh"),
            dir: std::env::temp_dir().join(format!("oncilla-netns-{tag}-{pid}")),
            prefix: format!("o{tag}{}", pid % 10_000),
            env: Vec::new(),
        })
    }

    /// Whether the master at node `i`'s address leads, asked from node
    /// `from`'s namespace (its health: only the leader serves).
    fn leads(&self, from: usize, i: usize) -> bool {
        let addr = format!("10.78.0.{}:7070", i + 10);
        let out = self.ocmctl(from, &["health", &addr, "--role", "master"]);
        String::from_utf8_lossy(&out.stdout).contains(": SERVING")
    }

    /// `ocmctl` run in node `i`'s namespace.
    fn ocmctl(&self, i: usize, args: &[&str]) -> Output {
        let node = i.to_string();
        let mut all = vec!["run", node.as_str(), "ocmctl"];
        all.extend_from_slice(args);
        self.cmd(&all)
    }

    fn node_state(&self, name: &str) -> Option<String> {
        let out = self.ocmctl(0, &["nodes", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v.as_array()?
            .iter()
            .find(|n| n["name"] == name)
            .and_then(|n| n["state"].as_str().map(str::to_string))
    }

    fn health(&self, id: &str) -> String {
        let out = self.ocmctl(0, &["show", id, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["health"].as_str().unwrap().to_string()
    }
}

/// Polls `cond` every 100 ms for at most 15 s.
fn eventually(cond: impl FnMut() -> bool) -> bool {
    eventually_within(Duration::from_secs(15), cond)
}

/// Polls `cond` every 100 ms for at most `bound`.
fn eventually_within(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    cond()
}

#[test]
fn a_partitioned_node_degrades_heals_and_a_killed_one_comes_back_empty() {
    let Some(c) = NetnsCluster::new("f") else {
        return;
    };
    c.ok(&["up", "3", "16MiB"]);
    let alloc = |node: &str| {
        let out = c.ok(&["run", "0", "ocmctl", "alloc", "1MiB", "--node", node]);
        out.trim().to_string()
    };
    let (near, far, freed) = (alloc("node-1"), alloc("node-2"), alloc("node-2"));
    let data: Vec<u8> = (0..1_048_576u32).map(|i| (i % 251) as u8).collect();
    let input = c.dir.join("in.bin");
    std::fs::write(&input, &data).unwrap();
    for id in [&near, &far] {
        c.ok(&["run", "0", "ocmctl", "put", id, input.to_str().unwrap()]);
    }
    let output = c.dir.join("out.bin");
    let get = |id: &str| {
        let _ = std::fs::remove_file(&output);
        c.ocmctl(
            1,
            &[
                "get",
                id,
                "--len",
                "1048576",
                "-o",
                output.to_str().unwrap(),
            ],
        )
    };

    // Unplug node-2: it goes down, its allocation degrades, node-1's works.
    c.ok(&["cut", "2"]);
    assert!(eventually(
        || c.node_state("node-2").as_deref() == Some("down")
    ));
    assert_eq!(c.health(&far), "degraded");
    assert_eq!(c.health(&near), "healthy");
    assert!(get(&near).status.success());
    assert!(std::fs::read(&output).unwrap() == data);
    let out = get(&far);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("node node-2 unreachable"), "{err}");
    // Freed while node-2 cannot hear it: the release must not be lost.
    c.ok(&["run", "0", "ocmctl", "free", &freed]);

    // Plug it back: same agent, nothing lost, and what was freed goes.
    c.ok(&["heal", "2"]);
    assert!(eventually(
        || c.node_state("node-2").as_deref() == Some("up")
    ));
    let log = c.dir.join("node-2.log");
    assert!(
        eventually(|| std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("released a stray allocation")),
        "node-2 kept the allocation freed during the partition"
    );
    assert_eq!(c.health(&far), "healthy");
    assert!(
        get(&far).status.success(),
        "{}",
        String::from_utf8_lossy(&get(&far).stderr)
    );
    assert!(
        std::fs::read(&output).unwrap() == data,
        "bytes changed across the partition"
    );

    // Kill it and start it again: it comes back empty, and says so.
    c.ok(&["kill", "2"]);
    c.ok(&["start", "2"]);
    assert!(eventually(|| c.health(&far) == "lost"));
    assert!(eventually(
        || c.node_state("node-2").as_deref() == Some("up")
    ));
    let out = get(&far);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no such allocation on node-2"),
        "{err}"
    );
    for id in [&near, &far] {
        c.ok(&["run", "0", "ocmctl", "free", id]);
    }
}

#[test]
fn a_write_whose_replicas_crawl_is_answered_before_the_client_gives_up() {
    let Some(mut c) = NetnsCluster::new("s") else {
        return;
    };
    // One connection: the 16 MiB write is one request, copied to both
    // replicas before it is answered.
    c.env.push(("ONCILLA_STREAMS", "1"));
    c.ok(&["up", "3", "48MiB"]);
    let id = c.ok(&[
        "run",
        "0",
        "ocmctl",
        "alloc",
        "16MiB",
        "--node",
        "node-0",
        "--replicas",
        "3",
    ]);
    let id = id.trim();
    let data: Vec<u8> = (0..16u32 << 20).map(|i| (i % 249) as u8).collect();
    let input = c.dir.join("in.bin");
    std::fs::write(&input, &data).unwrap();
    let put = || {
        let started = Instant::now();
        let out = c.ocmctl(0, &["put", id, input.to_str().unwrap()]);
        (out, started.elapsed())
    };
    let (out, _) = put();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The attack: both replicas' links crawl (2 Mbit/s into their data
    // ports: 16 MiB would take over a minute each). Each replica keeps
    // taking bytes, so no socket times out; only the copy's deadline ends it.
    for node in ["1", "2"] {
        let out = c.cmd(&["slow", node, "2mbit"]);
        if !out.status.success() {
            println!(
                "skipped the crawl: tc cannot shape the link here ({})",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return;
        }
    }
    let (out, took) = put();
    let err = String::from_utf8_lossy(&out.stderr);
    println!("a write with both replicas crawling was answered after {took:?}: {err}");
    assert!(
        !out.status.success(),
        "a crawl of a minute finished: {took:?}"
    );
    // The primary answered (its replicas named), rather than the client
    // giving the connection up for dead after 30 s of silence.
    assert!(
        err.contains("not in every replica") && !err.contains("unreachable"),
        "the client was not answered: {err}"
    );

    // Healed, the same write lands in every copy, the missed ranges first.
    // A replica may still be draining the copy the primary gave up on
    // (queued at 2 Mbit/s) and refuse until it has: bounded retries.
    c.ok(&["fast", "1"]);
    c.ok(&["fast", "2"]);
    let mut err = String::new();
    let landed = eventually_within(Duration::from_secs(90), || {
        let (out, _) = put();
        err = String::from_utf8_lossy(&out.stderr).into_owned();
        out.status.success()
    });
    assert!(landed, "the healed write never landed in every copy: {err}");
    let output = c.dir.join("out.bin");
    c.ok(&[
        "run",
        "1",
        "ocmctl",
        "get",
        id,
        "--len",
        &data.len().to_string(),
        "-o",
        output.to_str().unwrap(),
    ]);
    assert!(std::fs::read(&output).unwrap() == data, "bytes differ");
    assert_eq!(c.health(id), "healthy");
    c.ok(&["run", "0", "ocmctl", "free", id]);
}

#[test]
fn three_hosts_in_namespaces() {
    let Some(c) = NetnsCluster::new("d") else {
        return;
    };
    c.ok(&["up", "3", "16MiB"]);

    let nodes = c.ok(&["run", "1", "ocmctl", "nodes", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&nodes).unwrap();
    let addrs: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["data_addr"].as_str().unwrap())
        .collect();
    assert_eq!(addrs.len(), 3);
    assert!(addrs.iter().all(|a| a.starts_with("10.78.0.")), "{addrs:?}");

    // From host 1, put data on hosts 0 and 2 and read it back.
    let id = c.ok(&[
        "run", "1", "ocmctl", "alloc", "3MiB", "--node", "node-0", "--node", "node-2",
    ]);
    let id = id.trim();
    let input = c.dir.join("in.bin");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&input, &data).unwrap();
    c.ok(&["run", "1", "ocmctl", "put", id, input.to_str().unwrap()]);
    let output = c.dir.join("out.bin");
    c.ok(&[
        "run",
        "2",
        "ocmctl",
        "get",
        id,
        "--len",
        "3000000",
        "-o",
        output.to_str().unwrap(),
    ]);
    assert!(
        std::fs::read(&output).unwrap() == data,
        "bytes differ after crossing namespaces"
    );
    c.ok(&["run", "0", "ocmctl", "free", id]);
}

#[test]
fn a_leader_cut_off_the_network_stops_acting_and_a_standby_takes_over() {
    let Some(mut c) = NetnsCluster::new("e") else {
        return;
    };
    if !oncilla_cluster::etcd::Etcd::available() {
        println!("skipped: no etcd program (apt-get install etcd-server; .ci/run installs it)");
        return;
    }
    c.env = vec![("ONCILLA_NETNS_MASTERS", "2"), ("ONCILLA_NETNS_LEASE", "2")];
    c.ok(&["up", "3", "16MiB"]);
    let mut leader = None;
    assert!(eventually(|| {
        leader = (0..2).find(|&i| c.leads(2, i));
        leader.is_some()
    }));
    let leader = leader.unwrap();
    let other = 1 - leader;
    let before = c.ok(&["run", "2", "ocmctl", "alloc", "1MiB", "--node", "node-2"]);

    // Unplugged, the leader cannot renew its lease: the standby leads.
    c.ok(&["cut", &leader.to_string()]);
    assert!(
        eventually(|| c.leads(2, other)),
        "the standby did not take over"
    );
    let during = c.ok(&["run", "2", "ocmctl", "alloc", "1MiB", "--node", "node-2"]);
    // And the old leader stopped acting, as seen from its own side.
    assert!(eventually(|| !c.leads(leader, leader)));
    let log = c.dir.join(format!("node-{leader}.log"));
    assert!(std::fs::read_to_string(&log)
        .unwrap()
        .contains("this master's lease ended"));

    // Plugged back: it stands by, its agent follows the new leader, and
    // the table holds both allocations.
    c.ok(&["heal", &leader.to_string()]);
    let name = format!("node-{leader}");
    assert!(eventually(|| c.node_state(&name).as_deref() == Some("up")));
    assert!(c.leads(2, other) && !c.leads(2, leader));
    let all: serde_json::Value =
        serde_json::from_str(&c.ok(&["run", "2", "ocmctl", "allocs", "--json"])).unwrap();
    let ids: Vec<String> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].to_string())
        .collect();
    for id in [before.trim(), during.trim()] {
        assert!(ids.iter().any(|i| i == id), "{id} missing: {ids:?}");
    }
}
