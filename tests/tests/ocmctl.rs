//! The operator's view: ocmctl against a real cluster, output and exit codes.

#![allow(clippy::unwrap_used)]

mod support;

use std::process::Output;
use std::time::Duration;

use support::Cluster;

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "ocmctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn fails_with(out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(1), "expected exit 1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(needle), "stderr {err:?} lacks {needle:?}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err:?}"
    );
}

/// Holes show in `ocmctl nodes`, and an allocation bigger than any hole is
/// served in pieces.
#[test]
fn fragmentation_is_visible_and_served_in_pieces() {
    const MIB: u64 = 1 << 20;
    let c = Cluster::start(2, "8MiB");
    // Three of 2 MiB: where each lies in the pool (the pool chooses).
    let made: Vec<(String, u64)> = (0..3)
        .map(|_| {
            let a: serde_json::Value = serde_json::from_str(&ok(
                &c.ocmctl(&["alloc", "2MiB", "--node", "node-1", "--json"])
            ))
            .unwrap();
            let extents = a["extents"].as_array().unwrap();
            assert_eq!(extents.len(), 1, "{a}");
            (
                a["id"].as_u64().unwrap().to_string(),
                extents[0]["pool_offset"].as_u64().unwrap(),
            )
        })
        .collect();
    // Free the one whose going leaves the smallest largest hole: two holes
    // of 2 MiB where the three lie side by side.
    let holes_without = |gone: usize| -> Vec<u64> {
        let mut taken: Vec<u64> = (0..3).filter(|&i| i != gone).map(|i| made[i].1).collect();
        taken.sort_unstable();
        let mut holes = Vec::new();
        let mut at = 0;
        for t in taken.into_iter().chain([8 * MIB]) {
            if t > at {
                holes.push(t - at);
            }
            at = at.max(t + 2 * MIB);
        }
        holes
    };
    let gone = (0..3)
        .min_by_key(|&i| holes_without(i).into_iter().max())
        .unwrap();
    let largest = holes_without(gone).into_iter().max().unwrap();
    ok(&c.ocmctl(&["free", &made[gone].0]));
    // 4 MiB free on node-1, in holes (once scrubbed and reported).
    let node1 = || -> serde_json::Value {
        let v: serde_json::Value =
            serde_json::from_str(&ok(&c.ocmctl(&["nodes", "--json"]))).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "node-1")
            .unwrap()
            .clone()
    };
    assert!(
        Cluster::eventually(Cluster::EVENT, || {
            let n = node1();
            n["largest_free"] == largest && n["scrubbing"] == 0 && n["free"] == 4 * MIB
        }),
        "{} (largest hole expected {largest}: {made:?}, freed {gone})",
        node1()
    );
    let table = ok(&c.ocmctl(&["nodes"]));
    assert!(
        table.contains("LARGEST") && table.contains("SCRUBBING"),
        "{table}"
    );
    assert!(largest < 4 * MIB, "the pool left no two holes: {made:?}");

    let big = ok(&c.ocmctl(&["alloc", "4MiB", "--node", "node-1", "--json"]));
    let big: serde_json::Value = serde_json::from_str(&big).unwrap();
    let extents = big["extents"].as_array().unwrap();
    assert!(extents.len() >= 2, "{big}");
    assert!(extents.iter().all(|e| e["node"] == "node-1"));
    let total: u64 = extents.iter().map(|e| e["len"].as_u64().unwrap()).sum();
    assert_eq!(total, 4 * MIB, "{big}");
    if largest == 2 * MIB {
        assert_eq!(extents.len(), 2, "{big}");
        assert_eq!(extents[1]["alloc_offset"], 2 * MIB);
    }
}

#[test]
fn alloc_put_get_show_free() {
    let c = Cluster::start(2, "8MiB");
    let nodes = ok(&c.ocmctl(&["nodes"]));
    assert!(
        nodes.starts_with("NAME") && nodes.contains("node-0") && nodes.contains("node-1"),
        "{nodes}"
    );
    let v: serde_json::Value = serde_json::from_str(&ok(&c.ocmctl(&["nodes", "--json"]))).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(v[0]["capacity"], 8 << 20);

    // Named nodes must be up: under emulation (the Soft-RoCE guest) a
    // starved agent's heartbeat can be late enough for the master to hold
    // it suspect ("node node-1 is down") for a moment. Wait, bounded, for
    // the allocation rather than for the clock.
    let alloc = || c.ocmctl(&["alloc", "3MiB", "--node", "node-0", "--node", "node-1"]);
    let mut out = alloc();
    Cluster::eventually(Duration::from_secs(30), || {
        if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("is down") {
            return true;
        }
        out = alloc();
        false
    });
    let id = ok(&out);
    let id = id.trim();
    let show: serde_json::Value =
        serde_json::from_str(&ok(&c.ocmctl(&["show", id, "--json"]))).unwrap();
    assert_eq!(show["extents"].as_array().unwrap().len(), 2);
    assert_eq!(show["persistent"], true);
    assert!(ok(&c.ocmctl(&["show", id])).contains("node-1"));

    // Allocations made by ocmctl outlive it.
    let allocs = ok(&c.ocmctl(&["allocs"]));
    assert!(
        allocs.contains("persistent") && allocs.contains("3.0 MiB"),
        "{allocs}"
    );

    let input = c.dir.join("in.bin");
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&input, &data).unwrap();
    ok(&c.ocmctl(&["put", id, input.to_str().unwrap(), "--offset", "100"]));
    let output = c.dir.join("out.bin");
    ok(&c.ocmctl(&[
        "get",
        id,
        "--offset",
        "100",
        "--len",
        "2000000",
        "-o",
        output.to_str().unwrap(),
    ]));
    assert!(std::fs::read(&output).unwrap() == data);
    let head = c.ocmctl(&["get", id, "--offset", "100", "--len", "5"]);
    assert_eq!(ok(&head).as_bytes(), &data[..5]);

    fails_with(
        &c.ocmctl(&["get", id, "--offset", "3145000", "--len", "1000"]),
        "out of bounds",
    );
    fails_with(
        &c.ocmctl(&["put", id, input.to_str().unwrap(), "--offset", "3000000"]),
        "out of bounds",
    );

    ok(&c.ocmctl(&["free", id]));
    fails_with(&c.ocmctl(&["free", id]), "no such allocation");
    fails_with(&c.ocmctl(&["show", id]), "no such allocation");
    fails_with(&c.ocmctl(&["get", "999"]), "no such allocation");
    assert_eq!(c.allocation_count(), 0);
}

#[test]
fn errors_are_one_clear_line() {
    let c = Cluster::start(2, "4MiB");
    let out = c.ocmctl(&["alloc", "1GiB"]);
    fails_with(&out, "not enough capacity");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("node-0 4.0 MiB") && err.contains("node-1 4.0 MiB"),
        "{err}"
    );
    fails_with(
        &c.ocmctl(&["alloc", "1MiB", "--node", "ghost"]),
        "unknown node \"ghost\"",
    );
    fails_with(&c.ocmctl(&["alloc", "12XB"]), "invalid size");
    fails_with(
        &c.ocmctl(&["nodes", "--master", "127.0.0.1:1"]),
        "master unreachable at 127.0.0.1:1",
    );
}

#[test]
fn alloc_flags_place_stripe_and_name() {
    let c = Cluster::start(3, "8MiB");
    let out = ok(&c.ocmctl(&[
        "alloc", "3MiB", "--policy", "spread", "--stripe", "256KiB", "--name", "cube", "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["name"], "cube");
    assert_eq!(v["extents"].as_array().unwrap().len(), 12, "{v}");
    assert_eq!(v["extents"][1]["alloc_offset"], 256 << 10);
    assert_eq!(v["extents"][0]["fabric"], "tcp");
    let allocs = ok(&c.ocmctl(&["allocs"]));
    assert!(
        allocs.contains("cube") && allocs.contains("[4]"),
        "{allocs}"
    );

    let out = ok(&c.ocmctl(&[
        "alloc", "4MiB", "--node", "node-0", "--weight", "3", "--node", "node-1", "--weight", "1",
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["extents"][0]["len"], 3 << 20, "{v}");
    assert_eq!(v["extents"][1]["node"], "node-1");

    let bad = c.ocmctl(&[
        "alloc", "4MiB", "--node", "node-0", "--weight", "1", "--weight", "2",
    ]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--weight given 2 times for 1 --node"));
    let bad = c.ocmctl(&["alloc", "4MiB", "--policy", "pack", "--stripe", "1MiB"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("stripe unit needs the spread policy"));
    let taken = c.ocmctl(&["alloc", "1MiB", "--name", "cube"]);
    assert!(String::from_utf8_lossy(&taken.stderr).contains("is taken by allocation"));
    ok(&c.ocmctl(&["free", "cube"]));
    let gone = c.ocmctl(&["show", "cube"]);
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no allocation is named \"cube\""));
}

/// Agents declare the failure domain they are in (`--zone`, or
/// `ONCILLA_ZONE`); `ocmctl nodes` shows it in its table and its JSON; a
/// label that is not one is refused at start, by name.
#[test]
fn agents_declare_their_zone_and_nodes_show_it() {
    let mut c = Cluster::start_env(2, "4MiB", &[("ONCILLA_ZONE", "rack-a")]);
    c.stop_agent(1);
    c.start_agent_with(1, &["--zone", "rack-b.2"]);
    let zone = |c: &Cluster, name: &str| {
        c.node(name)
            .and_then(|n| n["zone"].as_str().map(str::to_string))
    };
    assert!(
        Cluster::eventually(Duration::from_secs(30), || {
            zone(&c, "node-1").as_deref() == Some("rack-b.2") && c.nodes_up() == 2
        }),
        "node-1 did not come back in rack-b.2: {:?}",
        c.nodes()
    );
    assert_eq!(zone(&c, "node-0").as_deref(), Some("rack-a"));
    let table = ok(&c.ocmctl(&["nodes"]));
    let header = table.lines().next().unwrap();
    assert!(
        header.starts_with("NAME") && header.contains(" ZONE "),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("node-1") && l.contains(" rack-b.2 ")),
        "{table}"
    );

    let token = c.token_file();
    let out = std::process::Command::new(support::bin("oncillad"))
        .args([
            "--join",
            "127.0.0.1:1",
            "--capacity",
            "1MiB",
            "--zone",
            "rack 1",
        ])
        .args(["--token-file", &token])
        .env_remove("ONCILLA_ZONE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--zone: zone \"rack 1\" is not a label"),
        "{err}"
    );
}
