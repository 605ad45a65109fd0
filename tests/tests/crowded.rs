//! Allocations that every node of a small cluster holds part of (daemons
//! as processes on loopback): when a node is lost, the bytes left with one
//! copy get their second on the nodes left, beside the bytes those hold;
//! a drained node's shares move beside the others' while clients copy,
//! with no failed call. Each ends with every byte read back from the one
//! node left, so a copy made beside others is checked byte by byte, and
//! with the master's and the agents' accounts compared.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Allocation, Kind};
use support::{pattern, Cluster};

const MIB: usize = 1 << 20;
const NODES: [&str; 3] = ["node-0", "node-1", "node-2"];
/// How long a node's loss may take to settle: failure detection, then
/// a copy made again per share, on a loaded machine.
const BOUND: Duration = Duration::from_secs(60);
/// Most rounds one load thread makes (it stops earlier when told).
const MAX_ROUNDS: u32 = 10_000;

/// The master's record of allocation `id`.
fn record(c: &Cluster, id: u64) -> oncilla_model::alloc::Allocation {
    c.master()
        .unwrap()
        .allocation(&oncilla_model::alloc::AllocRef::Id(id))
        .unwrap()
}

/// Asserts that every MiB of allocation `id` is held `copies` times, on
/// as many nodes, none of them `gone`.
fn every_mib(c: &Cluster, id: u64, copies: usize, gone: &str) {
    let rec = record(c, id);
    for at in (0..rec.size).step_by(MIB) {
        let mut on: Vec<&str> = rec
            .all_extents()
            .filter(|e| e.alloc_offset <= at && at < e.alloc_offset + e.len)
            .map(|e| e.node.as_str())
            .collect();
        on.sort_unstable();
        on.dedup();
        assert_eq!(on.len(), copies, "byte {at} is on {on:?}: {rec:?}");
        assert!(!on.contains(&gone), "byte {at} is still on {gone}");
    }
}

/// Asserts `a` holds `pattern(size, seed)`, naming the first byte that
/// differs.
fn holds(a: &Allocation, size: usize, seed: u32, what: &str) {
    let mut back = vec![0u8; size];
    a.copy_out(0, &mut back)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = pattern(size, seed);
    assert!(
        back == want,
        "{what}: differs from byte {:?}",
        back.iter().zip(&want).position(|(x, y)| x != y)
    );
}

#[test]
fn a_lost_nodes_bytes_get_their_second_copy_beside_the_bytes_left() {
    let mut c = Cluster::start(3, "32MiB");
    let size = 12 * MIB;
    let ocm = c.client(0);
    let a = ocm
        .alloc_with(
            &AllocSpec::new(size as u64, Kind::RemoteHost)
                .on_nodes(NODES)
                .replicas(2),
        )
        .unwrap();
    let id = a.id();
    let rec = record(&c, id);
    for n in NODES {
        assert!(rec.extents.iter().any(|e| e.node == n), "{rec:?}");
    }
    a.copy_in(0, &pattern(size, 1)).unwrap();

    // node-2 dies: node-0 and node-1 each hold bytes of the allocation,
    // and between them take the copies it held, while writes go on.
    c.kill_agent(2);
    let mut seed = 1;
    let healthy = Cluster::eventually(BOUND, || {
        seed += 1;
        a.copy_in(0, &pattern(size, seed))
            .unwrap_or_else(|e| panic!("a write after node-2 was killed: {e}"));
        c.ocmctl_json(&["show", &id.to_string(), "--json"])["health"] == "healthy"
    });
    if !healthy {
        let log = c.log("master");
        let tail: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("copy"))
            .collect();
        panic!(
            "no second copy was made: {:?}\n{}",
            record(&c, id),
            tail.join("\n")
        );
    }
    every_mib(&c, id, 2, "node-2");
    holds(&a, size, seed, "read with two copies");
    c.accounts_agree();

    // node-1 dies too: node-0 alone answers for every byte, those it got
    // as a copy made again among them.
    c.kill_agent(1);
    holds(&a, size, seed, "read from node-0 alone");
    a.copy_in(0, &pattern(size, seed + 1))
        .unwrap_or_else(|e| panic!("a write with node-0 alone: {e}"));
    holds(&a, size, seed + 1, "read back from node-0 alone");
}

/// Writes and reads back the whole of `a` with a new pattern each round
/// until `stop` (or [`MAX_ROUNDS`], or `limit`): every failed call or
/// wrong byte, and the last seed written.
fn load(
    a: &Allocation,
    size: usize,
    first: u32,
    stop: &AtomicBool,
    limit: Duration,
) -> (Vec<String>, u32) {
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut last = first;
    let mut back = vec![0u8; size];
    for round in 1..=MAX_ROUNDS {
        if stop.load(Ordering::SeqCst) || started.elapsed() > limit {
            break;
        }
        let seed = first + round;
        let bytes = pattern(size, seed);
        if let Err(e) = a.copy_in(0, &bytes) {
            failures.push(format!("round {round}: write: {e}"));
            continue;
        }
        last = seed;
        match a.copy_out(0, &mut back) {
            Err(e) => failures.push(format!("round {round}: read: {e}")),
            Ok(()) if back != bytes => failures.push(format!("round {round}: read other bytes")),
            Ok(()) => {}
        }
    }
    (failures, last)
}

#[test]
fn a_drained_nodes_shares_move_beside_the_others_with_no_failed_call() {
    let mut c = Cluster::start(3, "64MiB");
    let size = 12 * MIB;
    // One copy, its client on node-0 (its share there is mapped), and
    // two copies, its client on node-1.
    let near = c.client(0);
    let single = near
        .alloc_with(&AllocSpec::new(size as u64, Kind::RemoteHost).on_nodes(NODES))
        .unwrap();
    let far = c.client(1);
    let twice = far
        .alloc_with(
            &AllocSpec::new(size as u64, Kind::RemoteHost)
                .on_nodes(NODES)
                .replicas(2),
        )
        .unwrap();
    single.copy_in(0, &pattern(size, 1)).unwrap();
    twice.copy_in(0, &pattern(size, 100_001)).unwrap();

    let stop = AtomicBool::new(false);
    let ((f1, last1), (f2, last2)) = std::thread::scope(|s| {
        let t1 = s.spawn(|| load(&single, size, 1, &stop, Cluster::EVENT * 4));
        let t2 = s.spawn(|| load(&twice, size, 100_001, &stop, Cluster::EVENT * 4));
        let done = c.ocmctl_ok(&["drain", "node-2", "--wait", "--timeout", "240s"]);
        assert!(done.contains("is drained"), "{done}");
        stop.store(true, Ordering::SeqCst);
        (t1.join().unwrap(), t2.join().unwrap())
    });
    assert!(f1.is_empty(), "the single copy's client saw: {f1:?}");
    assert!(
        f2.is_empty(),
        "the replicated allocation's client saw: {f2:?}"
    );
    let node = c.node("node-2").unwrap();
    assert_eq!(node["used"], 0, "{node}");
    every_mib(&c, single.id(), 1, "node-2");
    every_mib(&c, twice.id(), 2, "node-2");
    c.accounts_agree();

    // Nothing was left there, and the replicated one's bytes are whole
    // on each of the two nodes left.
    c.kill_agent(2);
    holds(&single, size, last1, "the single copy, node-2 killed");
    holds(&twice, size, last2, "the replicated one, node-2 killed");
    c.kill_agent(0);
    holds(&twice, size, last2, "the replicated one from node-1 alone");
}
