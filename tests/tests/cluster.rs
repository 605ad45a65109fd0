//! End to end through liboncilla against real daemons: placement kinds,
//! copies across extents, and every error a user can hit.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use liboncilla::Operator;
use liboncilla::{AllocSpec, Error, Fabric, Kind, Oncilla, Options};
use oncilla_net::auth::Token;
use support::{bytes, Cluster};

#[test]
fn kinds_place_where_asked_and_copies_roundtrip() {
    let c = Cluster::start(3, "16MiB");
    let ocm = c.client(0);
    assert_eq!(ocm.node(), "node-0");

    // The default policy is local-first: this node, through shared memory.
    let near = ocm.alloc(1 << 20, Kind::RemoteHost).unwrap();
    assert!(!near.is_remote());
    assert_eq!(near.fabrics(), [Fabric::Shm]);
    drop(near);

    let remote = ocm
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    assert!(remote.is_remote());
    assert_eq!(remote.fabrics(), [support::remote_fabric()]);

    let local = ocm.alloc(64 << 10, Kind::LocalHost).unwrap();
    assert!(!local.is_remote());
    assert_eq!(local.descriptor().extents[0].node, "node-0");

    let size = (3 << 20) + 7;
    let striped = ocm
        .alloc_with(&AllocSpec::new(size, Kind::RemoteHost).on_nodes(["node-1", "node-2"]))
        .unwrap();
    let nodes: Vec<&str> = striped
        .descriptor()
        .extents
        .iter()
        .map(|e| e.node.as_str())
        .collect();
    assert_eq!(nodes, ["node-1", "node-2"]);

    for a in [&remote, &local, &striped] {
        let data = bytes(a.size() as usize, a.id() as u8);
        a.copy_in(0, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        a.copy_out(0, &mut back).unwrap();
        assert!(back == data, "allocation {} did not round-trip", a.id());
    }
    // A range that crosses the boundary between node-1 and node-2.
    let mid = striped.descriptor().extents[1].alloc_offset;
    let patch = bytes(10_000, 99);
    striped.copy_in(mid - 5_000, &patch).unwrap();
    let mut back = vec![0u8; 10_000];
    striped.copy_out(mid - 5_000, &mut back).unwrap();
    assert_eq!(back, patch);

    // Allocation-to-allocation copy.
    ocm.copy(&remote, 0, &striped, mid - 5_000, 10_000).unwrap();
    let mut back = vec![0u8; 10_000];
    remote.copy_out(0, &mut back).unwrap();
    assert_eq!(back, patch);

    assert_eq!(c.allocation_count(), 3);
    drop((remote, local));
    striped.free().unwrap();
    assert_eq!(c.allocation_count(), 0);
}

#[test]
fn local_allocations_are_mapped_pool_memory() {
    let c = Cluster::start(2, "8MiB");
    let ocm = c.client(0);
    let mut local = ocm.alloc(10_000, Kind::LocalHost).unwrap();
    let buf = local.localbuf().unwrap();
    assert_eq!(buf.len(), 10_000);
    assert!(buf.iter().all(|&b| b == 0), "fresh memory is zeroed");
    buf[..5].copy_from_slice(b"hello");
    buf[9_995..].copy_from_slice(b"world");

    // The same bytes, seen through the agent's pool over TCP.
    let dp = Operator::new(c.token.clone(), c.tls.clone()).fabric(liboncilla::Fabric::Tcp);
    let mut over_tcp = [0u8; 5];
    dp.read(local.descriptor(), 9_995, &mut over_tcp).unwrap();
    assert_eq!(&over_tcp, b"world");
    dp.write(local.descriptor(), 0, b"HELLO").unwrap();
    let mut back = [0u8; 5];
    local.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"HELLO");
    assert!(matches!(
        local.copy_in(9_999, b"xy"),
        Err(Error::OutOfBounds { .. })
    ));

    let mut remote = ocm
        .alloc_with(&AllocSpec::new(4096, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    let err = remote.localbuf().unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("not local"),
        "{err}"
    );
}

/// A new allocation never shows bytes of an old one, remote or local, even
/// when it is made while the old one is still being scrubbed (the pool is
/// too small to serve it from clean memory alone).
#[test]
fn freed_memory_never_reaches_the_next_tenant() {
    let c = Cluster::start(2, "8MiB");
    let ocm = c.client(0);
    let size = 6 << 20;
    for round in 0..3u8 {
        let a = ocm.alloc(size as u64, Kind::RemoteHost).unwrap();
        let mut back = vec![0xFFu8; size];
        a.copy_out(0, &mut back).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "remote round {round}: saw a previous tenant's bytes"
        );
        a.copy_in(0, &vec![0xC0 | round; size]).unwrap();
        a.free().unwrap();

        let mut l = ocm.alloc(size as u64, Kind::LocalHost).unwrap();
        let buf = l.localbuf().unwrap();
        assert!(
            buf.iter().all(|&b| b == 0),
            "local round {round}: saw a previous tenant's bytes"
        );
        buf.fill(0xD0 | round);
        l.free().unwrap();
    }
}

#[test]
fn errors_say_what_went_wrong() {
    let c = Cluster::start(2, "8MiB");
    let ocm = c.client(0);
    let a = ocm.alloc(4096, Kind::RemoteHost).unwrap();

    let err = a.copy_in(4000, &[0u8; 200]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutOfBounds {
                offset: 4000,
                len: 200,
                size: 4096
            }
        ),
        "{err}"
    );
    let mut buf = [0u8; 1];
    assert!(matches!(
        a.copy_out(u64::MAX, &mut buf),
        Err(Error::OutOfBounds { .. })
    ));

    let err = ocm.alloc(1 << 30, Kind::RemoteHost).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::CapacityExhausted(_)), "{msg}");
    assert!(
        msg.contains("not enough capacity") && msg.contains("node-1") && msg.contains("free"),
        "{msg}"
    );

    let err = ocm
        .alloc_with(&AllocSpec::new(10, Kind::RemoteHost).on_nodes(["nope"]))
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(_))
            && err.to_string().contains("unknown node \"nope\""),
        "{err}"
    );

    let err = ocm.alloc(0, Kind::RemoteHost).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");

    // Freed behind the handle's back: copies and free report it.
    let id = a.id().to_string();
    let out = c.ocmctl(&["free", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = a.copy_out(0, &mut buf).unwrap_err();
    assert!(
        matches!(err, Error::NotFound(_)) && err.to_string().contains("no such allocation"),
        "{err}"
    );
    let err = a.free().unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err}");
}

#[test]
fn wrong_token_is_denied_everywhere() {
    let c = Cluster::start(1, "8MiB");
    let wrong = Token::new("not-the-token").unwrap();
    let err = Oncilla::connect_with(Options::new(c.socket(0), wrong.clone()))
        .err()
        .expect("session with a wrong token");
    assert!(
        matches!(err, Error::PermissionDenied(_)) && err.to_string().contains("permission denied"),
        "{err}"
    );

    let a = c.client(0).alloc(4096, Kind::LocalHost).unwrap();
    let err = Operator::new(wrong, None)
        .fabric(liboncilla::Fabric::Tcp)
        .read(a.descriptor(), 0, &mut [0u8; 8])
        .unwrap_err();
    assert!(
        matches!(err, Error::PermissionDenied(_)) && err.to_string().contains("permission denied"),
        "{err}"
    );

    let out = std::process::Command::new(support::bin("ocmctl"))
        .args([
            "nodes",
            "--master",
            &c.master_addr,
            "--token",
            "not-the-token",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("permission denied"));
}

#[test]
fn master_outage_stops_allocation_not_copies() {
    let mut c = Cluster::start(2, "8MiB");
    let ocm = c.client(0);
    let a = ocm.alloc(8192, Kind::RemoteHost).unwrap();
    c.kill_master();

    let err = ocm.alloc(4096, Kind::RemoteHost).unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    assert!(err.to_string().contains("master unreachable"), "{err}");

    a.copy_in(100, b"still here").unwrap();
    let mut back = [0u8; 10];
    a.copy_out(100, &mut back).unwrap();
    assert_eq!(&back, b"still here");
}

#[test]
fn missing_agent_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("oncilla-none-{}", std::process::id()));
    let err = Oncilla::connect_with(Options::new(
        dir.join("agent.sock"),
        Token::new("t").unwrap(),
    ))
    .err()
    .expect("no agent there");
    assert!(matches!(err, Error::AgentUnreachable { .. }), "{err}");
    assert!(err.to_string().contains("is the agent running"), "{err}");
}

const CHILD_ENV: &str = "ONCILLA_TEST_CHILD";

/// Runs in a child process (re-executed test binary): allocates and then
/// leaves without freeing — by `exit`, which skips destructors, or by SIGKILL.
#[test]
fn child_allocates_and_leaves() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return; // only meaningful as the child of the test below
    };
    let ocm = Oncilla::connect_with(Options::from_env().unwrap()).unwrap();
    let a = ocm.alloc(4096, Kind::RemoteHost).unwrap();
    let b = ocm.alloc(8192, Kind::LocalHost).unwrap();
    println!("allocated {} {}", a.id(), b.id());
    std::mem::forget((a, b));
    if mode == "kill" {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
    std::process::exit(0);
}

#[test]
fn exited_or_killed_processes_leave_no_allocation() {
    let c = Cluster::start(2, "8MiB");
    let persistent = c.ocmctl(&["alloc", "4096"]);
    assert!(persistent.status.success());
    for mode in ["exit", "kill"] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_allocates_and_leaves",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, mode)
            .env("ONCILLA_SOCKET", c.socket(0))
            .env("ONCILLA_TOKEN_FILE", c.token_file())
            .env_remove("ONCILLA_TOKEN")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("allocated"),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let gone = Cluster::eventually(Duration::from_secs(15), || c.allocation_count() == 1);
        assert!(gone, "allocations of the {mode}ed process were not freed");
    }
}

#[test]
fn fabric_can_be_forced_to_tcp_per_session_or_allocation() {
    let c = Cluster::start(2, "8MiB");
    let mut opts = Options::new(c.socket(0), c.token.clone());
    opts.fabric = Fabric::parse("TCP").unwrap();
    let ocm = Oncilla::connect_with(opts).unwrap();
    let mut a = ocm.alloc(10_000, Kind::LocalHost).unwrap();
    assert_eq!(a.fabrics(), [Fabric::Tcp]);
    assert!(a.localbuf().is_err(), "nothing is mapped over TCP");
    a.copy_in(9_000, b"over tcp").unwrap();

    // Per allocation: shm cannot reach another node, and says so.
    let shm = c.client(0);
    let err = shm
        .alloc_with(
            &AllocSpec::new(4096, Kind::RemoteHost)
                .on_nodes(["node-1"])
                .fabric(Fabric::Shm),
        )
        .unwrap_err();
    assert!(err.to_string().contains("fabric shm reaches only"), "{err}");
    assert!(Fabric::parse("ib").is_err());
    assert_eq!(Fabric::parse("verbs").unwrap(), Fabric::Verbs);

    // The same bytes through a session that maps them (attach by id).
    let named = ocm
        .alloc_with(&AllocSpec::new(4096, Kind::LocalHost).named("tcp-made"))
        .unwrap();
    named.copy_in(0, b"mapped?").unwrap();
    let mapped = shm.attach_id(named.id()).unwrap();
    assert_eq!(mapped.fabrics(), [Fabric::Shm]);
    let mut back = [0u8; 7];
    mapped.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"mapped?");
    drop(mapped);
    named.force_free().unwrap();
}

#[test]
fn batches_and_many_stream_copies_move_every_byte() {
    let c = Cluster::start(3, "32MiB");
    // Eight connections per node, so a 12 MiB copy is dealt over several.
    let ocm = Oncilla::connect_with(Options::new(c.socket(0), c.token.clone()).streams(8)).unwrap();
    let one = ocm
        .alloc_with(&AllocSpec::new(12 << 20, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    let striped = ocm
        .alloc_with(
            &AllocSpec::new((8 << 20) + 5, Kind::RemoteHost)
                .on_nodes(["node-1", "node-2"])
                .stripe(64 << 10),
        )
        .unwrap();
    let local = ocm.alloc(1 << 20, Kind::LocalHost).unwrap();

    let big = bytes(12 << 20, 3);
    one.copy_in(0, &big).unwrap();
    let mut back = vec![0u8; big.len()];
    one.copy_out(0, &mut back).unwrap();
    assert!(back == big, "multi-stream copy did not round-trip");

    // One batch: writes to every allocation, small and large, then a batch
    // of reads mixed with writes to other ranges (reads and writes share
    // connections).
    let s = bytes(striped.size() as usize, 9);
    let l = bytes(1 << 20, 11);
    let mut b = liboncilla::Batch::new();
    b.write(&striped, 0, s.clone())
        .write(&local, 0, l.clone())
        .write(&one, 8, b"8 bytes!".to_vec());
    let pending = ocm.submit(b);
    let bufs = pending.wait().unwrap();
    assert_eq!(bufs.len(), 3);
    assert_eq!(bufs[0], s, "write buffers come back unchanged");

    let mut b = liboncilla::Batch::new();
    b.read(&striped, 0, vec![0; s.len()])
        .read(&local, 0, vec![0; l.len()])
        .read(&one, 0, vec![0; 16])
        .write(&one, 4 << 20, vec![0xEE; 4 << 20])
        .read(&one, 8 << 20, vec![0; 4 << 20]);
    assert_eq!(b.len(), 5);
    let pending = ocm.submit(b);
    let started = std::time::Instant::now();
    while !pending.is_done() && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(pending.is_done());
    let bufs = pending.wait().unwrap();
    assert!(bufs[0] == s, "striped batch read");
    assert!(bufs[1] == l, "local batch read");
    assert_eq!(&bufs[2][..8], &big[..8]);
    assert_eq!(&bufs[2][8..], b"8 bytes!");
    assert!(bufs[4][..] == big[8 << 20..], "read beside a write");
    let mut mid = vec![0u8; 4 << 20];
    one.copy_out(4 << 20, &mut mid).unwrap();
    assert!(mid.iter().all(|&x| x == 0xEE));

    // A failing copy fails the batch and names the problem.
    let mut b = liboncilla::Batch::new();
    b.read(&one, (12 << 20) - 4, vec![0; 8]);
    assert!(matches!(
        ocm.submit(b).wait(),
        Err(Error::OutOfBounds { .. })
    ));
}

/// Every node says whether verbs works and, where it does not, why; `auto`
/// copies use verbs exactly where it works and TCP otherwise; demanding
/// verbs where it is missing fails with the reason instead of hanging or
/// pretending. Checked on both kinds of run: without RDMA (the default
/// build, or no device given) and in the Soft-RoCE guest.
#[test]
fn verbs_is_reported_as_it_is_and_auto_uses_it_only_where_it_works() {
    let c = Cluster::start(2, "8MiB");
    let nodes = nodes_json(&c);
    let table = String::from_utf8_lossy(&c.ocmctl(&["nodes"]).stdout).into_owned();
    assert!(table.contains("RDMA"), "{table}");
    let forced = Oncilla::connect_with({
        let mut o = Options::new(c.socket(0), c.token.clone());
        o.fabric = Fabric::Verbs;
        o
    })
    .unwrap();
    let ocm = c.client(0);
    let a = ocm
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    let data = vec![0x5a; 1 << 20];
    a.copy_in(0, &data).unwrap();
    let mut back = vec![0; 1 << 20];
    a.copy_out(0, &mut back).unwrap();
    assert!(back == data);

    if support::rdma() {
        for n in nodes.as_array().unwrap() {
            let fabrics = n["fabrics"].as_array().unwrap();
            assert!(fabrics.iter().any(|f| f == "verbs"), "{n}");
            assert_eq!(n["rdma_note"].as_str().unwrap_or_default(), "", "{n}");
            let ports = n["rdma"].as_array().unwrap();
            assert!(
                ports.iter().any(|p| p["state"] == "ACTIVE"),
                "an active port is listed: {n}"
            );
        }
        assert_eq!(a.fabrics(), vec![Fabric::Verbs]);
        // Every extent carries a key of its own on every agent port.
        assert!(a.descriptor().extents.iter().all(|e| !e.rdma.is_empty()));
        let v = forced
            .alloc_with(&AllocSpec::new(4096, Kind::RemoteHost).on_nodes(["node-1"]))
            .unwrap();
        assert_eq!(v.fabrics(), vec![Fabric::Verbs]);
        v.copy_in(100, b"verbs").unwrap();
        return;
    }
    for n in nodes.as_array().unwrap() {
        let fabrics = n["fabrics"].as_array().unwrap();
        if std::path::Path::new("/sys/class/infiniband").exists() {
            // A host with RDMA: whatever it says, it says it consistently.
            continue;
        }
        assert!(!fabrics.iter().any(|f| f == "verbs"), "{n}");
        let note = n["rdma_note"].as_str().unwrap_or_default();
        assert!(
            note.contains("no RDMA") || note.contains("no verbs support"),
            "{note}"
        );
    }
    assert_eq!(a.fabrics(), vec![Fabric::Tcp]);
    assert!(a.descriptor().extents.iter().all(|e| e.rdma.is_empty()));
    let Err(err) = forced.alloc_with(&AllocSpec::new(4096, Kind::RemoteHost).on_nodes(["node-1"]))
    else {
        panic!("verbs cannot be demanded without RDMA");
    };
    assert!(err.to_string().contains("verbs"), "{err}");
}

/// On a host with an RDMA device (`ONCILLA_TEST_RDMA_DEV=mlx5_0`, daemons
/// and this test built with the `verbs` feature): a remote allocation
/// copies over verbs, large and small (bounce-buffer) copies both ways.
#[test]
fn verbs_copies_on_real_hardware() {
    let Ok(dev) = std::env::var("ONCILLA_TEST_RDMA_DEV") else {
        eprintln!(
            "skipped: set ONCILLA_TEST_RDMA_DEV to an RDMA device to run the verbs hardware test"
        );
        return;
    };
    if !cfg!(feature = "verbs") {
        eprintln!("skipped: ONCILLA_TEST_RDMA_DEV={dev} but this test was built without `--features verbs`");
        return;
    }
    // Pools just large enough: each is registered with the device whole,
    // which is slow under the guest's emulated CPU.
    let c = Cluster::start(2, "96MiB");
    let mut o = Options::new(c.socket(0), c.token.clone());
    o.fabric = Fabric::Verbs;
    let ocm = Oncilla::connect_with(o).unwrap();
    let a = ocm
        .alloc_with(&AllocSpec::new(64 << 20, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    assert_eq!(a.fabrics(), vec![Fabric::Verbs]);
    let data: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
    a.copy_in(0, &data).unwrap();
    let mut back = vec![0; data.len()];
    a.copy_out(0, &mut back).unwrap();
    assert!(back == data, "64 MiB over verbs did not round-trip");
    let mut small = [0u8; 100];
    a.copy_out(12_345, &mut small).unwrap();
    assert_eq!(&small[..], &data[12_345..12_445]);
}

/// On a host whose agents registered GPU memory with their RDMA ports
/// (`gpu_rdma` in `ocmctl nodes --json`: GPU, verbs, and nvidia-peermem or
/// dma-buf; daemons and this test built with the `verbs` feature): remote
/// GPU memory is reached over verbs, and copies between remote host memory
/// and local GPU memory go by RDMA straight to and from the device.
#[test]
fn gpudirect_rdma_on_real_hardware() {
    let c = Cluster::start(2, "64MiB");
    let nodes = nodes_json(&c);
    let direct = nodes
        .as_array()
        .unwrap()
        .iter()
        .find_map(|n| n["gpu_rdma"].as_str().map(str::to_string));
    let Some(how) = direct else {
        let why = nodes[0]["gpu_rdma_note"].as_str().unwrap_or("not reported");
        eprintln!("skipped: no GPUDirect RDMA on this machine ({why})");
        return;
    };
    if !cfg!(feature = "verbs") {
        eprintln!("skipped: the agents have GPUDirect RDMA ({how}) but this test was built without `--features verbs`");
        return;
    }
    let mut o = Options::new(c.socket(0), c.token.clone());
    o.fabric = Fabric::Verbs;
    let ocm = Oncilla::connect_with(o).unwrap();
    let len: u64 = 16 << 20;
    let remote_gpu = ocm
        .alloc_with(&AllocSpec::new(len, Kind::RemoteGpu).on_nodes(["node-1"]))
        .unwrap();
    assert_eq!(remote_gpu.fabrics(), vec![Fabric::Verbs]);
    let remote_host = ocm
        .alloc_with(&AllocSpec::new(len, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    let local_gpu = ocm.alloc(len, Kind::LocalGpu).unwrap();
    let data = bytes(len as usize - 4096, 5);
    remote_gpu.copy_in(4096, &data).unwrap();
    let mut back = vec![0; data.len()];
    remote_gpu.copy_out(4096, &mut back).unwrap();
    assert!(
        back == data,
        "remote GPU memory over verbs did not round-trip"
    );
    remote_host.copy_in(0, &data).unwrap();
    ocm.copy(&local_gpu, 4096, &remote_host, 0, data.len() as u64)
        .unwrap();
    ocm.copy(&remote_gpu, 0, &local_gpu, 4096, data.len() as u64)
        .unwrap();
    let mut back = vec![0; data.len()];
    remote_gpu.copy_out(0, &mut back).unwrap();
    assert!(
        back == data,
        "remote host -> local GPU -> remote GPU by RDMA"
    );
}

/// `ocmctl nodes --json`, which must succeed.
fn nodes_json(c: &Cluster) -> serde_json::Value {
    c.ocmctl_json(&["nodes", "--json"])
}

/// How many GPUs the cluster's nodes have: every node of this one-machine
/// cluster shares the machine's driver, so node-0 speaks for all.
fn gpus_of(nodes: &serde_json::Value) -> usize {
    nodes[0]["gpus"].as_array().map_or(0, Vec::len)
}

/// Without a CUDA driver every GPU request fails with a clear "no GPU"
/// error naming the reason, nodes say why they offer none, and host memory
/// keeps working. (On a GPU machine `gpu_kinds_copy_between_every_pair`
/// covers the other side.)
#[test]
fn without_a_gpu_gpu_kinds_say_no_gpu_and_host_kinds_work() {
    let c = Cluster::start(2, "8MiB");
    let nodes = nodes_json(&c);
    if gpus_of(&nodes) > 0 {
        eprintln!("skipped: this machine has a GPU; see gpu_kinds_copy_between_every_pair");
        return;
    }
    for n in nodes.as_array().unwrap() {
        let note = n["gpu_note"].as_str().unwrap_or_default();
        assert!(note.contains("CUDA"), "{n}");
        // No GPU, so no GPUDirect either, and the reason says so.
        assert!(n["gpu_rdma"].is_null(), "{n}");
        let why = n["gpu_rdma_note"].as_str().unwrap_or_default();
        assert_eq!(why, "no GPU on this node", "{n}");
    }
    // The note is for the person, on stderr; stdout is the table alone.
    let out = c.ocmctl(&["nodes"]);
    let notes = String::from_utf8_lossy(&out.stderr);
    assert!(
        notes.contains("node-0: no GPU: no CUDA driver on this node"),
        "{notes}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("no GPU:"));

    let ocm = c.client(0);
    for spec in [
        AllocSpec::new(1 << 20, Kind::LocalGpu),
        AllocSpec::new(1 << 20, Kind::RemoteGpu),
        AllocSpec::new(1 << 20, Kind::RemoteGpu)
            .on_nodes(["node-1"])
            .gpu(0),
    ] {
        let Err(err) = ocm.alloc_with(&spec) else {
            panic!("{spec:?} allocated without a GPU");
        };
        assert!(matches!(err, liboncilla::Error::NoGpu(_)), "{err:?}");
        assert!(err.to_string().starts_with("no GPU"), "{err}");
        assert!(err.to_string().contains("no CUDA driver"), "{err}");
    }
    // Operators get the same answer.
    let out = c.ocmctl(&["alloc", "1MiB", "--gpu", "any"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no GPU"),
        "{:?}",
        out
    );

    // Nothing was left behind, and host memory still copies.
    let allocs = c.ocmctl(&["allocs", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&allocs.stdout).unwrap();
    assert_eq!(list.as_array().map(Vec::len), Some(0), "{list}");
    let a = ocm.alloc(1 << 20, Kind::RemoteHost).unwrap();
    let b = ocm.alloc(1 << 20, Kind::LocalHost).unwrap();
    let data = bytes(1 << 20, 9);
    a.copy_in(0, &data).unwrap();
    ocm.copy(&b, 0, &a, 0, 1 << 20).unwrap();
    let mut back = vec![0; 1 << 20];
    b.copy_out(0, &mut back).unwrap();
    assert!(back == data);
}

/// On a GPU machine: every pair of kinds copies with one `copy` call, at
/// offsets, and the bytes arrive. Elsewhere it prints one line and passes.
#[test]
fn gpu_kinds_copy_between_every_pair() {
    let c = Cluster::start(2, "64MiB");
    if gpus_of(&nodes_json(&c)) == 0 {
        eprintln!(
            "skipped: no GPU on this machine (the nodes report none); GPU kind pairs not run"
        );
        return;
    }
    let ocm = c.client(0);
    let len: u64 = 20 << 20;
    let kinds = [
        AllocSpec::new(len, Kind::LocalHost),
        AllocSpec::new(len, Kind::RemoteHost).on_nodes(["node-1"]),
        AllocSpec::new(len, Kind::LocalGpu),
        AllocSpec::new(len, Kind::RemoteGpu).on_nodes(["node-1"]),
    ];
    let allocs: Vec<_> = kinds.iter().map(|s| ocm.alloc_with(s).unwrap()).collect();
    let data = bytes(len as usize - 4096, 3);
    for (i, src) in allocs.iter().enumerate() {
        src.copy_in(4096, &data).unwrap();
        for (j, dst) in allocs.iter().enumerate() {
            if i == j {
                continue;
            }
            ocm.copy(dst, 0, src, 4096, data.len() as u64).unwrap();
            let mut back = vec![0; data.len()];
            dst.copy_out(0, &mut back).unwrap();
            assert!(back == data, "{:?} -> {:?}", src.kind(), dst.kind());
        }
    }
    // Two allocations on one device copy on the device.
    let other = ocm.alloc(len, Kind::LocalGpu).unwrap();
    ocm.copy(&other, 0, &allocs[2], 4096, data.len() as u64)
        .unwrap();
    let mut back = vec![0; data.len()];
    other.copy_out(0, &mut back).unwrap();
    assert!(back == data);
    assert!(matches!(
        allocs[2].copy_out(len, &mut [0u8; 1]),
        Err(liboncilla::Error::OutOfBounds { .. })
    ));
    eprintln!("GPU kind pairs: 12 copies of {} bytes verified", data.len());
}
