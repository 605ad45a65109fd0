//! Snapshot tests of everything ocmctl shows (`insta`): a cluster of two
//! nodes (one with an RDMA port and a GPU, one down while the master still
//! recovers), allocations of each shape (persistent and named, striped,
//! owned by a session with a process attached, degraded, on a GPU) and
//! quotas. The reviewed outputs live in `snapshots/`; a change to what
//! ocmctl prints shows up there as a diff to accept (`cargo insta review`)
//! or refuse.

use oncilla_model::alloc::{Allocation, Extent, Health, NodeShare, Owner, Placement};
use oncilla_model::node::{
    Drain, GpuDevice, NodeInfo, NodeList, NodeState, NodeStatus, PoolUsage, RdmaPort,
};
use oncilla_model::quota::{Limits, Report, Summary, UserReport};
use oncilla_model::{Fabric, Kind, Policy};

use super::{allocs, nodes, quota};

/// The time every snapshot is taken at (unix ms).
const NOW: u64 = 1_800_000_000_000;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn node(name: &str, port: u16) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        agent_addr: format!("10.0.0.{port}:7071"),
        data_addr: format!("10.0.0.{port}:7072"),
        capacity: 4 * GIB,
        fabrics: vec!["tcp".into(), "shm".into()],
        ..NodeInfo::default()
    }
}

fn cluster() -> NodeList {
    let mut rdma = node("node-0", 1);
    rdma.fabrics.push("verbs".into());
    rdma.page_size = 2 * MIB;
    rdma.rdma = vec![RdmaPort {
        device: "mlx5_0".into(),
        port: 1,
        link_layer: "Ethernet".into(),
        state: "ACTIVE".into(),
        active_mtu: 4096,
        gids: 4,
        numa_node: 0,
        lid: 0,
        rate: "100 Gb/sec".into(),
    }];
    rdma.gpu_devices = vec![GpuDevice {
        index: 0,
        name: "NVIDIA H100".into(),
        total: 80 * GIB,
        free: 79 * GIB,
    }];
    rdma.gpu_rdma = "dmabuf".into();
    rdma.zone = "rack-a".into();
    let mut fell_back = node("node-1", 2);
    fell_back.page_size = 4096;
    fell_back.pool_note = "huge pages unavailable: 4 KiB pages".into();
    fell_back.rdma_note = "no RDMA device".into();
    fell_back.gpu_note = "libcuda.so.1 not found".into();
    NodeList {
        nodes: vec![
            NodeStatus {
                info: rdma,
                used: GIB + 64 * MIB,
                state: NodeState::Up,
                last_heartbeat_ms_ago: 250,
                pool: PoolUsage {
                    used: GIB + 64 * MIB,
                    scrubbing: 0,
                    free: 3 * GIB - 64 * MIB,
                    largest_free: 2 * GIB,
                },
                state_since_unix_ms: NOW - 3_723_000,
                incarnation: 7,
                drain: Some(Drain {
                    left: 2,
                    note: "no node that holds none of allocation 7 has room for 1.0 GiB of it"
                        .into(),
                }),
            },
            NodeStatus {
                info: fell_back,
                used: GIB,
                state: NodeState::Down,
                last_heartbeat_ms_ago: 95_000,
                pool: PoolUsage {
                    used: GIB,
                    scrubbing: 16 * MIB,
                    free: 3 * GIB - 16 * MIB,
                    largest_free: 3 * GIB - 16 * MIB,
                },
                state_since_unix_ms: NOW - 61_000,
                incarnation: 2,
                drain: None,
            },
        ],
        recovering_ms: 1500,
    }
}

fn extent(node: &str, alloc_offset: u64, len: u64, fabric: Fabric) -> Extent {
    Extent {
        copy: 0,
        filling: false,
        node: node.into(),
        alloc_offset,
        len,
        pool_offset: alloc_offset + 8 * MIB,
        data_addr: format!("{node}.example:7072"),
        fabric,
        agent_addr: format!("{node}.example:7071"),
        gpu: None,
        rdma: Vec::new(),
    }
}

fn owner(pid: u32, program: &str, node: &str) -> Owner {
    Owner {
        session_id: format!("{node}-u1000-{pid:016x}"),
        node: node.into(),
        pid,
        program: program.into(),
        agent_incarnation: 7,
        session_seq: 1,
        uid: Some(1000),
    }
}

fn allocations() -> Vec<Allocation> {
    // Persistent, named, striped over both nodes.
    let mut striped = Allocation::new(1, 2 * GIB, Kind::RemoteHost);
    striped.name = "matrix-a".into();
    striped.created_unix_ms = NOW - 45_000;
    striped.placement = Placement {
        replicas: 0,
        policy: Policy::Spread,
        nodes: vec![],
        stripe: 512 * MIB,
        gpu: None,
    };
    striped.extents = (0..4)
        .map(|i| {
            let on = if i % 2 == 0 { "node-0" } else { "node-1" };
            extent(on, i * 512 * MIB, 512 * MIB, Fabric::Tcp)
        })
        .collect();
    striped.attached = vec![owner(4242, "solver", "node-0")];
    striped.shared = true;
    // A session's, on named nodes, degraded: node-1 is down.
    let mut owned = Allocation::new(2, 96 * MIB, Kind::LocalHost);
    owned.created_unix_ms = NOW - 7_384_000;
    owned.owner = Some(owner(77, "trainer", "node-0"));
    owned.user = Some(1000);
    owned.origin_node = "node-0".into();
    owned.placement = Placement {
        replicas: 0,
        policy: Policy::LocalFirst,
        nodes: vec![
            NodeShare {
                node: "node-0".into(),
                weight: 2,
            },
            NodeShare {
                node: "node-1".into(),
                weight: 1,
            },
        ],
        stripe: 0,
        gpu: None,
    };
    owned.extents = vec![
        extent("node-0", 0, 64 * MIB, Fabric::Shm),
        extent("node-1", 64 * MIB, 32 * MIB, Fabric::Verbs),
    ];
    owned.health = Health::Degraded;
    owned.health_notes = vec!["node-1 is down: 32 MiB wait for it to come back".into()];
    // GPU memory, persistent, unnamed.
    let mut gpu = Allocation::new(3, 64 * MIB, Kind::RemoteGpu);
    gpu.created_unix_ms = NOW - 2_000;
    gpu.placement.gpu = Some(0);
    let mut on_gpu = extent("node-0", 0, 64 * MIB, Fabric::Tcp);
    on_gpu.gpu = Some(0);
    gpu.extents = vec![on_gpu];
    vec![striped, owned, gpu]
}

fn report() -> Report {
    Report {
        default: Limits {
            bytes: Some(8 * GIB),
            node_bytes: Some(4 * GIB),
            allocations: Some(1000),
            persistent: None,
        },
        users: vec![
            UserReport {
                uid: 1000,
                limits: None,
                usage: Summary {
                    bytes: 96 * MIB,
                    node_bytes: 64 * MIB,
                    allocations: 1,
                    persistent: 0,
                },
            },
            UserReport {
                uid: 1001,
                limits: Some(Limits {
                    bytes: Some(GIB),
                    node_bytes: None,
                    allocations: Some(4),
                    persistent: Some(1),
                }),
                usage: Summary::default(),
            },
        ],
        persistent: true,
    }
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

#[test]
fn nodes_table() {
    insta::assert_snapshot!(nodes::table(&cluster(), NOW));
}

#[test]
fn nodes_json() {
    insta::assert_snapshot!(pretty(&nodes::json(&cluster())));
}

#[test]
fn allocations_table() {
    insta::assert_snapshot!(allocs::table(&allocations(), NOW));
}

#[test]
fn an_allocation_in_detail() {
    let all = allocations();
    let detail: Vec<String> = all.iter().map(|a| allocs::detail(a, NOW)).collect();
    insta::assert_snapshot!(detail.join("\n---\n"));
}

#[test]
fn allocations_json() {
    let all: Vec<serde_json::Value> = allocations().iter().map(allocs::json).collect();
    insta::assert_snapshot!(pretty(&serde_json::Value::Array(all)));
}

#[test]
fn access_keys_never_show() {
    let mut a = allocations().remove(0);
    a.access_key = vec![0xab; 32];
    let shown = [
        allocs::table(std::slice::from_ref(&a), NOW),
        allocs::detail(&a, NOW),
        pretty(&allocs::json(&a)),
    ];
    for text in shown {
        assert!(!text.to_lowercase().contains("abab"), "{text}");
        assert!(!text.contains("171, 171"), "{text}");
    }
}

#[test]
fn quotas_table() {
    insta::assert_snapshot!(quota::table(&report()));
}

#[test]
fn quotas_json() {
    insta::assert_snapshot!(pretty(&quota::json(&report())));
}

#[test]
fn times_read_as_utc_dates() {
    assert_eq!(super::utc(0), "1970-01-01 00:00:00 UTC");
    assert_eq!(super::utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    assert_eq!(super::utc(1_795_690_571_277), "2026-11-26 10:56:11 UTC");
    assert_eq!(super::utc(4_102_444_799_000), "2099-12-31 23:59:59 UTC");
}
