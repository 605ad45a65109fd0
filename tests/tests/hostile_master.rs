//! Attacks on the master, on a real loopback cluster: tables of the
//! largest allocations list and survive a master restart, a forged
//! registration cannot take a live node's name, ids a peer makes up
//! never wrap the master's counter, and a zone must be a label. Each test
//! performs the push, checks the outcome is a clear answer (never a
//! cluster that cannot recover), then that the cluster still serves a
//! normal allocation, copy and free. Every wait is bounded.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Kind, Policy};
use oncilla_proto::pb;
use support::Cluster;

/// `Master.Register` sent raw.
fn register(c: &Cluster, req: pb::RegisterRequest) -> Result<(), (tonic::Code, String)> {
    c.master_raw(|mut m| async move { m.register(req).await })
        .map(|_| ())
}

/// Three allocations of the most extents one may have (256 MiB in 4 KiB
/// stripes over two agents: 65,536 extents each, ~4 MB of descriptor
/// apiece). Before, listing them failed ("decoded message length too
/// large") and, after a master restart, each agent's registration (5.4 MB)
/// was refused forever: no node, nothing could be allocated or freed.
#[test]
fn the_largest_allocations_list_and_survive_a_master_restart() {
    if !support::rdma_devices().is_empty() {
        // Under the Soft-RoCE guest's CPU emulation one agent reserving
        // 32,768 pieces outlasts the master's 15 s call deadline; the test
        // is about message sizes, not verbs, and runs on the host.
        println!("skipped in the RDMA guest: 65,536-extent allocations outlast a call deadline under emulation (runs on the host)");
        return;
    }
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

    let listed = c.ocmctl_json(&["allocs", "--json"]);
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
    // Each agent registers in parts (a message holds 65,536 extents); a
    // node is up with its first, and the rest follow as fast as a loaded
    // machine sends them.
    let listed = || {
        c.ocmctl_json(&["allocs", "--json"])
            .as_array()
            .map_or(0, Vec::len)
    };
    assert!(
        Cluster::eventually(Duration::from_secs(60), || listed() == 3),
        "the table is not rebuilt: {} of 3 allocations listed",
        listed()
    );
    let data = vec![7u8; 1 << 20];
    big[2].copy_in(100 << 20, &data).unwrap();
    let mut back = vec![0u8; 1 << 20];
    big[2].copy_out(100 << 20, &mut back).unwrap();
    assert!(back == data);
    for a in big {
        a.free().unwrap();
    }
    c.still_serves();
}

/// Before, a forged `Register` for node-1 under a new incarnation
/// repointed it at other addresses with 1 TiB and left its allocation
/// lost for good, even after the real agent registered again.
#[test]
fn a_forged_registration_cannot_take_a_live_nodes_name() {
    let c = Cluster::start(2, "32MiB");
    let ocm = c.client(0);
    let a = ocm
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    a.copy_in(0, b"kept").unwrap();
    let real = c.node("node-1").unwrap();
    let forged = pb::RegisterRequest {
        node: Some(pb::NodeInfo {
            name: "node-1".into(),
            agent_addr: "127.0.0.1:9".into(),
            data_addr: "127.0.0.1:9".into(),
            capacity: 1 << 40,
            ..Default::default()
        }),
        incarnation: 0x0bad_cafe,
        ..Default::default()
    };
    let (code, msg) = register(&c, forged).unwrap_err();
    assert_eq!(code, tonic::Code::PermissionDenied, "{msg}");
    assert!(msg.contains("node-1") && msg.contains("alive"), "{msg}");
    let now = c.node("node-1").unwrap();
    assert_eq!(now["agent_addr"], real["agent_addr"]);
    assert_eq!(now["capacity"], real["capacity"]);
    let shown = c.ocmctl_json(&["show", &a.id().to_string(), "--json"]);
    assert_eq!(shown["health"], "healthy", "{shown}");
    let mut back = [0u8; 4];
    a.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"kept");
    a.free().unwrap();
    c.still_serves();
}

/// Before, a `Register` carrying allocation id 2^64 - 1 wrapped the id
/// counter: new allocations got ids 2^64 - 1, 0, 1 (reused; 0 could not
/// be freed or shown).
#[test]
fn made_up_ids_never_wrap_the_counter() {
    let c = Cluster::start(2, "32MiB");
    let before = c.client(0).alloc(4096, Kind::RemoteHost).unwrap();
    let record = |id| pb::Allocation {
        id,
        size: 4096,
        kind: pb::MemKind::RemoteHost as i32,
        ..Default::default()
    };
    let ghost = |id| pb::RegisterRequest {
        node: Some(pb::NodeInfo {
            name: "ghost".into(),
            agent_addr: "127.0.0.1:9".into(),
            data_addr: "127.0.0.1:9".into(),
            capacity: 1 << 20,
            ..Default::default()
        }),
        incarnation: 7,
        master_incarnation: 1,
        held: vec![record(id)],
        ..Default::default()
    };
    let (code, msg) = register(&c, ghost(u64::MAX)).unwrap_err();
    assert_eq!(code, tonic::Code::InvalidArgument, "{msg}");
    assert!(msg.contains("above the limit"), "{msg}");
    let after = c.client(0).alloc(4096, Kind::RemoteHost).unwrap();
    assert!(
        after.id() > before.id(),
        "{} after {}",
        after.id(),
        before.id()
    );
    after.free().unwrap();
    before.free().unwrap();
    c.still_serves();
}

/// Before, enum values no build knows (policy 99, fabric 77, kind 9) were
/// taken as the defaults and the allocation was made.
#[test]
fn unknown_enum_values_are_refused_at_the_edge() {
    let c = Cluster::start(2, "32MiB");
    let spec = |kind: i32, policy: i32, fabric: i32| pb::AllocateRequest {
        spec: Some(pb::AllocSpec {
            size: 4096,
            kind,
            placement: Some(pb::Placement {
                policy,
                ..Default::default()
            }),
            fabric,
            ..Default::default()
        }),
        ..Default::default()
    };
    let remote = pb::MemKind::RemoteHost as i32;
    for (req, what) in [
        (spec(remote, 99, 0), "unknown placement policy 99"),
        (spec(remote, 0, 77), "unknown fabric 77"),
        (spec(9, 0, 0), "unknown memory kind 9"),
    ] {
        let (code, msg) = c
            .master_raw(|mut m| async move { m.allocate(req).await })
            .unwrap_err();
        assert_eq!(code, tonic::Code::InvalidArgument, "{msg}");
        assert!(msg.contains(what), "{msg} (wanted {what:?})");
    }
    let listed = c.ocmctl_json(&["allocs", "--json"]);
    assert!(
        listed.as_array().unwrap().is_empty(),
        "nothing was made: {listed}"
    );
    c.still_serves();
}

/// Before, a master that restarted while a node was away counted ids from
/// 1 again (from what the nodes present held): the first new allocation
/// took the id of the away node's allocation, and when that node came
/// back two allocations had one id. Now a master starts its ids past any
/// an earlier master gave (1,024 per millisecond since the epoch): the
/// new allocation's id is new, and the returning node's allocation keeps
/// its id and its bytes.
#[test]
fn ids_are_not_reused_after_a_master_restart_with_a_node_away() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let mut c = Cluster::start(2, "32MiB");
    let alloc = |c: &Cluster, node: &str| c.ocmctl_ok(&["alloc", "1MiB", "--node", node]);
    let kept = alloc(&c, "node-1");
    let file = c.dir.join("payload");
    std::fs::write(&file, b"kept").unwrap();
    c.ocmctl_ok(&["put", &kept, file.to_str().unwrap()]);
    // node-1 away (stopped, its memory intact) while the master restarts.
    let away = Pid::from_raw(i32::try_from(c.agent_pid(1).unwrap()).unwrap());
    kill(away, Signal::SIGSTOP).unwrap();
    c.kill_master();
    c.start_master();
    let ready = Cluster::eventually(Duration::from_secs(30), || {
        c.node("node-0").is_some_and(|n| n["state"] == "up") && !c.master_recovering()
    });
    let resume = || kill(away, Signal::SIGCONT).unwrap();
    if !ready {
        resume();
        panic!("the restarted master did not take node-0 back");
    }
    let fresh = alloc(&c, "node-0");
    resume();
    assert_ne!(fresh, kept, "a new allocation took the away node's id");
    c.wait_nodes_up(2);
    let get = c.ocmctl(&["get", &kept, "--len", "4"]);
    assert_eq!(
        get.stdout,
        b"kept",
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    let listed = c.ocmctl_json(&["allocs", "--json"]);
    let ids: Vec<String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].to_string())
        .collect();
    assert!(ids.contains(&kept) && ids.contains(&fresh), "{ids:?}");
    for id in [&kept, &fresh] {
        c.ocmctl_ok(&["free", id]);
    }
    c.still_serves();
}

/// A registration whose zone is not a label (a kilobyte with newlines and
/// escape codes, to forge lines in `ocmctl nodes` and the logs) is refused
/// at the master's edge, by name, and no node appears.
#[test]
fn a_zone_that_is_not_a_label_is_refused() {
    let c = Cluster::start(1, "8MiB");
    let zone = format!("rack\n\x1b[2Jnode-0 up{}", "x".repeat(1024));
    let bad = pb::RegisterRequest {
        node: Some(pb::NodeInfo {
            name: "node-9".into(),
            agent_addr: "127.0.0.1:9".into(),
            data_addr: "127.0.0.1:9".into(),
            capacity: 1 << 20,
            zone,
            ..Default::default()
        }),
        incarnation: 0x2bad,
        ..Default::default()
    };
    let (code, msg) = register(&c, bad).unwrap_err();
    assert_eq!(code, tonic::Code::InvalidArgument, "{msg}");
    assert!(
        msg.contains("zone") && msg.contains("is not a label"),
        "{msg}"
    );
    assert!(!msg.contains('\n') && msg.len() < 400, "{msg:?}");
    assert!(c.node("node-9").is_none());
    c.still_serves();
}
