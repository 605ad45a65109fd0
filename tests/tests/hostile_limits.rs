//! Limits a client can push the cluster to, on a real loopback cluster:
//! tables of the largest allocations list and survive a master restart,
//! and ids a peer makes up never wrap the master's counter. Each test
//! performs the push, checks the outcome is a clear answer (never a
//! cluster that cannot recover), then that the cluster still serves a
//! normal allocation, copy and free. Every wait is bounded.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Kind, Policy};
use serde_json::Value;
use support::Cluster;

fn ocmctl_json(c: &Cluster, args: &[&str]) -> Value {
    let out = c.ocmctl(args);
    assert!(
        out.status.success(),
        "ocmctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A normal allocation, copy and free still work.
fn still_serves(c: &Cluster) {
    let ocm = c.client(0);
    let a = ocm.alloc(1 << 20, Kind::RemoteHost).unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    a.copy_in(0, &data).unwrap();
    let mut back = vec![0u8; 1 << 20];
    a.copy_out(0, &mut back).unwrap();
    assert!(back == data);
    a.free().unwrap();
}

/// Three allocations of the most extents one may have (256 MiB in 4 KiB
/// stripes over two agents: 65,536 extents each, ~4 MB of descriptor
/// apiece). Before, listing them failed ("decoded message length too
/// large") and, after a master restart, each agent's registration (5.4 MB)
/// was refused forever: no node, nothing could be allocated or freed.
#[test]
fn the_largest_allocations_list_and_survive_a_master_restart() {
    let mut c = Cluster::start_sized(&["16MiB", "400MiB", "400MiB"], Duration::from_secs(120));
    let ocm = c.client(0);
    let started = Instant::now();
    let big: Vec<_> = (0..3)
        .map(|_| {
            ocm.alloc_with(
                &AllocSpec::new(256 << 20, Kind::RemoteHost)
                    .policy(Policy::Spread)
                    .on_nodes(["node-1", "node-2"])
                    .stripe(4096),
            )
            .unwrap()
        })
        .collect();
    println!(
        "3 allocations of 65,536 extents made in {:?}",
        started.elapsed()
    );
    for a in &big {
        assert_eq!(a.descriptor().extents.len(), 1 << 16);
    }
    // One more extent than that is refused, with the reason.
    let err = ocm
        .alloc_with(
            &AllocSpec::new((256 << 20) + 4096, Kind::RemoteHost)
                .policy(Policy::Spread)
                .stripe(4096),
        )
        .unwrap_err();
    assert!(err.to_string().contains("use a unit of at least"), "{err}");

    let listed = ocmctl_json(&c, &["allocs", "--json"]);
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 3, "every allocation is listed");
    let extents: usize = listed
        .iter()
        .map(|a| a["extents"].as_array().unwrap().len())
        .sum();
    assert_eq!(extents, 3 << 16);
    let ids: Vec<u64> = listed.iter().map(|a| a["id"].as_u64().unwrap()).collect();
    let mut want: Vec<u64> = big.iter().map(|a| a.id()).collect();
    want.sort_unstable();
    assert_eq!(ids, want, "in id order, none twice");

    // The master restarts: each agent registers 98,304 extents again.
    c.kill_master();
    c.start_master();
    c.wait_nodes_up(3);
    let after = ocmctl_json(&c, &["allocs", "--json"]);
    assert_eq!(after.as_array().unwrap().len(), 3, "the table is rebuilt");
    let data = vec![7u8; 1 << 20];
    big[2].copy_in(100 << 20, &data).unwrap();
    let mut back = vec![0u8; 1 << 20];
    big[2].copy_out(100 << 20, &mut back).unwrap();
    assert!(back == data);
    for a in big {
        a.free().unwrap();
    }
    still_serves(&c);
}
