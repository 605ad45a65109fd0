//! Fault injection on a real loopback cluster: clients, agents and the
//! master are separate processes killed with SIGKILL (or stopped) while
//! data moves. Each test checks what the failure model in ARCHITECTURE.md
//! promises: nothing lost that was meant to survive, nothing leaked, and
//! clear errors naming the node at fault. Every wait is bounded.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Error, Kind, Oncilla, Options, Policy};
use serde_json::Value;
use support::Cluster;

const ROLE_ENV: &str = "ONCILLA_FAILURE_ROLE";
/// How long the cluster may take to notice and clean up after a death.
const BOUND: Duration = Duration::from_secs(30);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
        .collect()
}

fn allocs(c: &Cluster) -> Vec<Value> {
    let out = c.ocmctl(&["allocs", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .cloned()
        .unwrap()
}

fn alloc_json(c: &Cluster, id: u64) -> Value {
    allocs(c)
        .into_iter()
        .find(|a| a["id"] == id)
        .unwrap_or_else(|| panic!("allocation {id} not listed"))
}

/// Sum of a numeric field over every node.
fn total(c: &Cluster, field: &str) -> u64 {
    c.nodes().iter().map(|n| n[field].as_u64().unwrap()).sum()
}

/// Child process roles.
#[test]
fn role() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return; // only meaningful as a child of the tests below
    };
    let ocm = Oncilla::connect_with(Options::from_env().unwrap()).unwrap();
    assert_eq!(role, "copier");
    // Session-owned memory on every node, a local allocation, and a named
    // one that must survive this process.
    let spread = ocm
        .alloc_with(&AllocSpec::new(4 << 20, Kind::RemoteHost).policy(Policy::Spread))
        .unwrap();
    let local = ocm.alloc(1 << 20, Kind::LocalHost).unwrap();
    let kept = ocm
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).named("survivor"))
        .unwrap();
    kept.copy_in(0, &pattern(1 << 20, 7)).unwrap();
    std::mem::forget(kept);
    println!("ready");
    let data = pattern(4 << 20, 1);
    let mut back = vec![0u8; 4 << 20];
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        spread.copy_in(0, &data).unwrap();
        spread.copy_out(0, &mut back).unwrap();
        local.copy_in(0, &data[..1 << 20]).unwrap();
    }
}

#[test]
fn a_client_killed_mid_copy_loses_its_allocations_within_the_bound() {
    let c = Cluster::start(3, "16MiB");
    assert_eq!(total(&c, "used"), 0);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "role", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, "copier")
        .env("ONCILLA_SOCKET", c.socket(0))
        .env("ONCILLA_TOKEN_FILE", c.token_file())
        .env_remove("ONCILLA_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest may print "test role ... " on the same line.
            if line.ends_with("ready") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("copier never got ready");
    assert_eq!(allocs(&c).len(), 3);
    // Let it copy a while, then kill it mid-copy.
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();

    let only_survivor = || {
        let a = allocs(&c);
        a.len() == 1 && a[0]["name"] == "survivor"
    };
    assert!(
        Cluster::eventually(BOUND, only_survivor),
        "orphans left: {:#?}",
        allocs(&c)
    );
    // Capacity back to the baseline plus the survivor, nothing scrubbing.
    let settled = || total(&c, "used") == 1 << 20 && total(&c, "scrubbing") == 0;
    assert!(Cluster::eventually(BOUND, settled), "{:#?}", c.nodes());
    let ocm = c.client(1);
    let kept = ocm.attach("survivor").unwrap();
    let mut back = vec![0u8; 1 << 20];
    kept.copy_out(0, &mut back).unwrap();
    assert!(back == pattern(1 << 20, 7), "the survivor's bytes changed");
    kept.force_free().unwrap();
}

#[test]
fn a_killed_agent_goes_down_and_only_allocations_on_it_degrade() {
    let mut c = Cluster::start(3, "16MiB");
    let ocm = c.client(0);
    let on = |node: &str, size: u64| {
        ocm.alloc_with(&AllocSpec::new(size, Kind::RemoteHost).on_nodes([node]))
            .unwrap()
    };
    let healthy = on("node-1", 1 << 20);
    let doomed = on("node-2", 1 << 20);
    let striped = ocm
        .alloc_with(
            &AllocSpec::new(2 << 20, Kind::RemoteHost)
                .on_nodes(["node-1", "node-2"])
                .stripe(64 << 10),
        )
        .unwrap();
    for a in [&healthy, &doomed, &striped] {
        a.copy_in(0, &pattern(a.size() as usize, a.id() as u8))
            .unwrap();
    }

    c.kill_agent(2);
    let down = || c.node("node-2").is_some_and(|n| n["state"] == "down");
    assert!(Cluster::eventually(BOUND, down), "{:#?}", c.nodes());
    let n2 = c.node("node-2").unwrap();
    assert!(n2["state_since_unix_ms"].as_u64().unwrap() > 0);
    // The master logs each change once per heartbeat tick.
    let said = |what: &str| Cluster::eventually(BOUND, || c.log("master").contains(what));
    assert!(said("to=\"suspect\""), "{}", c.log("master"));
    assert!(said("node down"), "{}", c.log("master"));

    assert_eq!(alloc_json(&c, healthy.id())["health"], "healthy");
    for a in [&doomed, &striped] {
        let j = alloc_json(&c, a.id());
        assert_eq!(j["health"], "degraded", "{j:#}");
        assert!(notes_name(&j, "node-2 down since"), "{j:#}");
    }
    // Healthy extents keep working; those on node-2 fail, naming it.
    let mut back = vec![0u8; 1 << 20];
    healthy.copy_out(0, &mut back).unwrap();
    assert!(back == pattern(1 << 20, healthy.id() as u8));
    let err = doomed.copy_out(0, &mut back).unwrap_err();
    assert!(
        matches!(&err, Error::NodeUnreachable { node, .. } if node == "node-2"),
        "{err}"
    );
    let mut first = vec![0u8; 64 << 10];
    striped.copy_out(0, &mut first).unwrap(); // the first stripe is on node-1
    assert!(first == pattern(2 << 20, striped.id() as u8)[..64 << 10]);
    let err = striped.copy_out(0, &mut back).unwrap_err();
    assert!(err.to_string().contains("node-2"), "{err}");
    let err = ocm
        .alloc_with(&AllocSpec::new(4096, Kind::RemoteHost).on_nodes(["node-2"]))
        .unwrap_err();
    assert!(err.to_string().contains("node-2"), "{err}");

    // Back with an empty pool: the master marks its extents lost, and the
    // agent answers copies with a clear "not here", never old bytes.
    c.start_agent(2);
    let up = || c.node("node-2").is_some_and(|n| n["state"] == "up");
    assert!(Cluster::eventually(BOUND, up), "{:#?}", c.nodes());
    for a in [&doomed, &striped] {
        let j = alloc_json(&c, a.id());
        assert_eq!(j["health"], "lost", "{j:#}");
        assert!(notes_name(&j, "node-2 restarted"), "{j:#}");
    }
    let err = doomed.copy_out(0, &mut back).unwrap_err();
    assert!(
        matches!(&err, Error::NotFound(m) if m.contains("node-2") && m.contains("empty pool")),
        "{err}"
    );
    assert!(c
        .log("node-2")
        .contains("agent starting with an empty pool"));
    drop((doomed, striped));
    assert!(Cluster::eventually(BOUND, || allocs(&c).len() == 1));
    assert!(Cluster::eventually(BOUND, || c
        .node("node-2")
        .is_some_and(|n| n["used"] == 0)));
}

#[test]
fn a_master_killed_during_copies_rebuilds_the_same_table() {
    let mut c = Cluster::start(3, "16MiB");
    let ocm = Arc::new(c.client(0));
    let striped = ocm
        .alloc_with(
            &AllocSpec::new(3 << 20, Kind::RemoteHost)
                .policy(Policy::Spread)
                .stripe(256 << 10),
        )
        .unwrap();
    let named = ocm
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).named("table"))
        .unwrap();
    let reader = c.client(1);
    let attached = reader.attach("table").unwrap();
    c.ocmctl_ok(&["alloc", "2MiB", "--node", "node-2"]);
    // A process whose session ends while the master is down.
    let leaver = c.client(2);
    let gone = leaver.alloc(1 << 20, Kind::LocalHost).unwrap();
    let gone_id = gone.id();
    let before: Vec<Value> = allocs(&c)
        .into_iter()
        .filter(|a| a["id"] != gone_id)
        .collect();
    assert_eq!(before.len(), 3);
    let used_before: Vec<(Value, Value)> = c
        .nodes()
        .iter()
        .map(|n| (n["name"].clone(), n["used"].clone()))
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let copies = Arc::new(AtomicU64::new(0));
    let copier = {
        let (stop, copies) = (Arc::clone(&stop), Arc::clone(&copies));
        std::thread::spawn(move || {
            let data = pattern(3 << 20, 3);
            let mut back = vec![0u8; 3 << 20];
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                striped.copy_in(0, &data).unwrap();
                striped.copy_out(0, &mut back).unwrap();
                assert!(back == data);
                copies.fetch_add(1, Ordering::SeqCst);
            }
            striped
        })
    };

    c.kill_master();
    let during = copies.load(Ordering::SeqCst);
    let err = ocm.alloc(4096, Kind::RemoteHost).unwrap_err();
    assert!(
        matches!(&err, Error::Unavailable(m) if m.contains("master unreachable")),
        "{err}"
    );
    named
        .copy_in(0, b"written while the master was down")
        .unwrap();
    drop(gone);
    drop(leaver);
    // Copies go on without the master.
    assert!(Cluster::eventually(BOUND, || copies.load(Ordering::SeqCst) > during + 3));

    c.start_master();
    c.wait_nodes_up(3);
    let after = allocs(&c);
    assert_eq!(after, before, "the rebuilt table differs");
    let used_after: Vec<(Value, Value)> = c
        .nodes()
        .iter()
        .map(|n| (n["name"].clone(), n["used"].clone()))
        .collect();
    let node2_before = used_before[2].1.as_u64().unwrap();
    assert_eq!(used_after[..2], used_before[..2]);
    assert_eq!(
        used_after[2].1.as_u64().unwrap(),
        node2_before - (1 << 20),
        "the session that ended during the outage still holds memory"
    );
    stop.store(true, Ordering::SeqCst);
    let striped = copier
        .join()
        .expect("a copy failed while the master was away");

    // Attachments survived: the creator may not free what another uses.
    let err = named.free().unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err}");
    let mut back = [0u8; 33];
    attached.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"written while the master was down");
    // New ids continue after the rebuilt ones.
    let fresh = ocm.alloc(4096, Kind::RemoteHost).unwrap();
    assert!(fresh.id() > gone_id);
    drop((fresh, striped, attached));
}

#[test]
fn a_cleanly_restarted_agent_starts_empty_and_mapped_clients_get_an_error() {
    let mut c = Cluster::start(2, "8MiB");
    let ocm = c.client(1);
    // Mapped through shared memory on node-1 itself.
    let local = ocm.alloc(1 << 20, Kind::LocalHost).unwrap();
    local.copy_in(0, &pattern(1 << 20, 9)).unwrap();
    let other = c.client(0);
    let remote = other
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    remote.copy_in(0, &pattern(1 << 20, 4)).unwrap();

    c.stop_agent(1);
    let mut back = vec![0u8; 1 << 20];
    let err = local.copy_out(0, &mut back).unwrap_err();
    assert!(
        matches!(&err, Error::NodeUnreachable { node, .. } if node == "node-1"),
        "{err}"
    );
    c.start_agent(1);
    let up = || {
        c.node("node-1")
            .is_some_and(|n| n["state"] == "up" && n["used"] == 0)
    };
    assert!(Cluster::eventually(BOUND, up), "{:#?}", c.nodes());
    assert!(c
        .log("node-1")
        .contains("agent starting with an empty pool"));
    // A clean stop: the agent said it was leaving, and the master took
    // its allocations' bytes as lost then, not at its return.
    assert!(c.log("master").contains("node left the cluster"));
    // Never the old bytes, never someone else's.
    let err = local.copy_out(0, &mut back).unwrap_err();
    assert!(matches!(err, Error::NodeUnreachable { .. }), "{err}");
    let err = remote.copy_out(0, &mut back).unwrap_err();
    assert!(
        matches!(&err, Error::NotFound(m) if m.contains("node-1")),
        "{err}"
    );
    assert_eq!(alloc_json(&c, remote.id())["health"], "lost");
}

/// Right after a master starts it waits for agents to re-register and
/// refuses to change its table; `ocmctl` and liboncilla wait that out on
/// their own (one line saying why) instead of failing with "retry in N ms"
/// (issue 23).
#[test]
fn callers_wait_through_a_restarted_masters_recovery() {
    // Heartbeats five times the suite's (1 s here, 5 s in the emulated
    // guest): a recovery window of three of them, longer than starting
    // ocmctl or opening a session takes on either.
    let mut c = Cluster::start_heartbeat(2, "16MiB", (5 * support::heartbeat_ms()).max(1000));
    let ocm = c.client(0);
    let recovering = |c: &Cluster| c.master().unwrap().node_list().unwrap().recovering_ms > 0;

    c.kill_master();
    c.start_master();
    assert!(
        Cluster::eventually(BOUND, || c.master().unwrap().node_list().is_ok()),
        "the master did not come back"
    );
    assert!(
        recovering(&c),
        "the master is past its recovery window already"
    );
    let out = c.ocmctl(&["alloc", "1MiB", "--node", "node-1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ocmctl alloc failed during recovery: {err}"
    );
    assert!(
        err.contains("waits for agents to re-register") && err.lines().count() == 1,
        "{err}"
    );

    c.kill_master();
    c.start_master();
    assert!(Cluster::eventually(BOUND, || c
        .master()
        .unwrap()
        .node_list()
        .is_ok()));
    assert!(
        recovering(&c),
        "the master is past its recovery window already"
    );
    let a = ocm
        .alloc(4096, Kind::RemoteHost)
        .expect("alloc through a session during recovery");
    a.copy_in(0, b"after the wait").unwrap();
    a.free().expect("free");
}

/// Whether one of an allocation's health notes starts with `what`: on a
/// loaded machine another node may have a note of its own (a beat missed
/// for a moment), so the one about node-2 need not come first.
fn notes_name(j: &serde_json::Value, what: &str) -> bool {
    j["health_notes"].as_array().is_some_and(|notes| {
        notes
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n.starts_with(what)))
    })
}

/// An agent stopped cleanly leaves the cluster at once: it is no longer
/// listed and what was on it is lost (before, it stayed `up`, then `down`
/// for ever). A node killed with -9 stays `down` until an operator removes
/// it with `ocmctl node remove`, which refuses a node that is up.
#[test]
fn a_stopped_agent_leaves_and_a_dead_one_can_be_removed() {
    let mut c = Cluster::start(3, "8MiB");
    let ocm = c.client(0);
    let on = |node: &str| {
        ocm.alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes([node]))
            .unwrap()
    };
    let (a1, a2) = (on("node-1"), on("node-2"));

    let refused = c.ocmctl(&["node", "remove", "node-2"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(err.contains("node node-2 is up, not down"), "{err}");

    // A process on node-1 holds memory on node-0, and its session stays
    // open while node-1 stops.
    let on1 = c.client(1);
    let held_by_1 = on1
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-0"]))
        .unwrap();
    let held_id = held_by_1.id();
    std::mem::forget(held_by_1);
    c.stop_agent(1);
    let gone = |c: &Cluster, name: &str| c.node(name).is_none();
    assert!(
        Cluster::eventually(BOUND, || gone(&c, "node-1")),
        "{:#?}",
        c.nodes()
    );
    assert_eq!(alloc_json(&c, a1.id())["health"], "lost");
    // Its sessions ended with it: what they held elsewhere is freed, and
    // it did not come back (it registered no more after leaving).
    let listed = |c: &Cluster| {
        let all = c.ocmctl_json(&["allocs", "--json"]);
        all.as_array()
            .is_some_and(|a| a.iter().any(|x| x["id"] == held_id))
    };
    assert!(
        Cluster::eventually(BOUND, || !listed(&c)),
        "allocation {held_id} kept"
    );
    assert!(gone(&c, "node-1"), "{:#?}", c.nodes());
    drop(on1);

    c.kill_agent(2);
    let down = || c.node("node-2").is_some_and(|n| n["state"] == "down");
    assert!(
        Cluster::eventually(Cluster::EVENT, down),
        "{:#?}",
        c.nodes()
    );
    let out = c.ocmctl(&["node", "remove", "node-2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("removed node node-2; 1 allocations"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(gone(&c, "node-2"));
    assert_eq!(alloc_json(&c, a2.id())["health"], "lost");
    let unknown = c.ocmctl(&["node", "remove", "node-9"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown node \"node-9\""));
    // What is left still serves, and a stopped node comes back as new.
    c.start_agent(1);
    assert!(Cluster::eventually(BOUND, || c
        .node("node-1")
        .is_some_and(|n| n["state"] == "up")));
    c.still_serves();
}
