//! The verbs fabric against a real RDMA provider: a real cluster whose
//! agents sit on RDMA devices (`ONCILLA_TEST_RDMA_DEV`, set by
//! `deploy/softroce/verbs-tests.sh` inside the Soft-RoCE guest, or by hand
//! on a host with an HCA). Each test prints one skip line and passes where
//! no device is given or the build has no `verbs` feature.
//!
//! What they prove: copies of every size class both ways (bounce buffer,
//! registration per copy, chunking, more requests than the window, offsets
//! past 4 GiB); batches; one allocation reached by verbs and TCP at once;
//! a freed allocation's RDMA key refused (never a later tenant's bytes)
//! with the queue pair rebuilt for the next copy; copies under a
//! locked-memory limit too small to register their buffers; an RDMA port
//! removed mid-run; an agent that spends no CPU per byte; and queue
//! pairs set up over TLS on a cluster that speaks it.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use liboncilla::Operator;
use liboncilla::{AllocSpec, Batch, Error, Fabric, Kind, Oncilla};
use support::Cluster;

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

/// `None` (and one line saying why) where this run has no RDMA.
fn rdma_run(test: &str) -> Option<()> {
    if support::rdma() {
        return Some(());
    }
    eprintln!(
        "skipped {test}: no RDMA device given (ONCILLA_TEST_RDMA_DEV) or built without `--features verbs`; deploy/softroce/verbs-tests.sh runs it against Soft-RoCE"
    );
    None
}

fn on(ocm: &Oncilla, size: u64, nodes: &[&str]) -> liboncilla::Allocation {
    ocm.alloc_with(&AllocSpec::new(size, Kind::RemoteHost).on_nodes(nodes.iter().copied()))
        .unwrap()
}

/// How many queue pairs an agent has connected so far.
fn pairs(c: &Cluster, node: &str) -> usize {
    c.log(node).matches("verbs queue pair connected").count()
}

#[test]
fn copies_of_every_size_class_round_trip_both_ways() {
    let Some(()) = rdma_run("copies_of_every_size_class_round_trip_both_ways") else {
        return;
    };
    let c = Cluster::start(3, "96MiB");
    let ocm = c.client(0);
    let one = on(&ocm, 48 << 20, &["node-1"]);
    assert_eq!(one.fabrics(), [Fabric::Verbs]);
    // Stripes of 64 KiB over two nodes: many pieces per node per copy.
    let striped = ocm
        .alloc_with(
            &AllocSpec::new(8 << 20, Kind::RemoteHost)
                .on_nodes(["node-1", "node-2"])
                .stripe(64 << 10),
        )
        .unwrap();
    assert!(striped.fabrics().iter().all(|f| *f == Fabric::Verbs));
    // Around every threshold: bounce buffer (64 KiB), chunk (1 MiB), a
    // window of 32 chunks; at offsets that are not page aligned.
    let sizes = [
        1,
        100,
        4096,
        (64 << 10) - 1,
        64 << 10,
        (64 << 10) + 1,
        (1 << 20) - 3,
        1 << 20,
        (1 << 20) + 5,
        (33 << 20) + 7,
    ];
    for (i, &n) in sizes.iter().enumerate() {
        for a in [&one, &striped] {
            if n as u64 + 4099 > a.size() {
                continue;
            }
            let offset = 4099 * (i as u64 % 3);
            let data = bytes(n, i as u8);
            a.copy_in(offset, &data).unwrap();
            let mut back = vec![0u8; n];
            a.copy_out(offset, &mut back).unwrap();
            assert!(back == data, "{n} bytes at {offset} of {}", a.id());
        }
    }
    // Between allocations, both remote.
    let data = bytes(3 << 20, 7);
    one.copy_in(5, &data).unwrap();
    ocm.copy(&striped, 11, &one, 5, data.len() as u64).unwrap();
    let mut back = vec![0u8; data.len()];
    striped.copy_out(11, &mut back).unwrap();
    assert!(back == data, "allocation to allocation");
}

/// On a cluster whose TCP listeners speak TLS, queue pairs are still set
/// up (`ConnectVerbs` over TLS, with the CA the agent handed the session)
/// and copies go over verbs; the RDMA bytes themselves are not encrypted.
#[test]
fn a_tls_cluster_sets_up_queue_pairs_over_tls() {
    let Some(()) = rdma_run("a_tls_cluster_sets_up_queue_pairs_over_tls") else {
        return;
    };
    let c = Cluster::start_tls(2, "64MiB");
    let ocm = c.client(0);
    let a = on(&ocm, 8 << 20, &["node-1"]);
    assert_eq!(a.fabrics(), [Fabric::Verbs]);
    let data = bytes(5 << 20, 3);
    a.copy_in(17, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    a.copy_out(17, &mut back).unwrap();
    assert!(back == data, "bytes over verbs on a TLS cluster");
    assert!(pairs(&c, "node-1") >= 1, "no queue pair was connected");
}

/// Allocation offsets past 4 GiB (64-bit addressing all the way), touched
/// sparsely: a few megabytes, not the whole range.
#[test]
fn offsets_past_4_gib_are_addressed_exactly() {
    let Some(()) = rdma_run("offsets_past_4_gib_are_addressed_exactly") else {
        return;
    };
    // Free huge pages count: the pool takes them where they are reserved
    // (the guest runner reserves them for this test).
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
            .unwrap_or(0)
    };
    let avail = (field("MemAvailable:") + field("HugePages_Free:") * field("Hugepagesize:")) << 10;
    let size: u64 = (4 << 30) + (64 << 20);
    if avail < size + (1 << 30) {
        eprintln!(
            "skipped offsets_past_4_gib_are_addressed_exactly: {} MiB available, it needs {} MiB",
            avail >> 20,
            (size + (1 << 30)) >> 20
        );
        return;
    }
    let c = Cluster::start_sized(&["16MiB", "4160MiB"], Duration::from_secs(300));
    let ocm = c.client(0);
    let a = on(&ocm, size, &["node-1"]);
    // One extent per pool slab it spans, every one over verbs.
    assert!(
        a.fabrics().iter().all(|f| *f == Fabric::Verbs),
        "{:?}",
        a.fabrics()
    );
    let marks = [
        0u64,
        (2 << 30) - 4096,
        (4 << 30) - 3,
        (4 << 30) + (17 << 20) + 1,
        size - (1 << 20),
    ];
    for (i, &at) in marks.iter().enumerate() {
        a.copy_in(at, &bytes(1 << 20, i as u8)).unwrap();
    }
    for (i, &at) in marks.iter().enumerate() {
        let mut back = vec![0u8; 1 << 20];
        a.copy_out(at, &mut back).unwrap();
        assert!(back == bytes(1 << 20, i as u8), "1 MiB at {at}");
    }
}

#[test]
fn batches_move_every_byte_over_verbs() {
    let Some(()) = rdma_run("batches_move_every_byte_over_verbs") else {
        return;
    };
    let c = Cluster::start(2, "64MiB");
    let ocm = c.client(0);
    let a = on(&ocm, 16 << 20, &["node-1"]);
    let mut b = Batch::new();
    for i in 0..8u64 {
        b.write(&a, i * (2 << 20) + 3, bytes((1 << 20) + 77, i as u8));
    }
    ocm.submit(b).wait().unwrap();
    let mut b = Batch::new();
    for i in 0..8u64 {
        b.read(&a, i * (2 << 20) + 3, vec![0; (1 << 20) + 77]);
    }
    let back = ocm.submit(b).wait().unwrap();
    for (i, buf) in back.iter().enumerate() {
        assert!(*buf == bytes((1 << 20) + 77, i as u8), "batch buffer {i}");
    }
    // Many small pieces in one batch: packed into the bounce buffers, more
    // than one round of them (200 x ~4 KiB, and sizes around 64 KiB).
    let small = |i: u64| -> (u64, usize) {
        let len = match i % 5 {
            0 => 1,
            1 => 4099,
            2 => 64 << 10,
            3 => (64 << 10) - 1,
            _ => 3000,
        };
        (i * (80 << 10) + 11, len)
    };
    let mut b = Batch::new();
    for i in 0..200u64 {
        let (at, len) = small(i);
        b.write(&a, at, bytes(len, (i * 7) as u8));
    }
    ocm.submit(b).wait().unwrap();
    let mut b = Batch::new();
    for i in 0..200u64 {
        let (at, len) = small(i);
        b.read(&a, at, vec![0; len]);
    }
    let back = ocm.submit(b).wait().unwrap();
    for (i, buf) in back.iter().enumerate() {
        let (_, len) = small(i as u64);
        assert!(*buf == bytes(len, (i * 7) as u8), "small batch buffer {i}");
    }
}

/// One allocation on a node with verbs and one without: each extent goes
/// over what reaches it, in the same copy.
#[test]
fn one_allocation_over_verbs_and_tcp_at_once() {
    let Some(()) = rdma_run("one_allocation_over_verbs_and_tcp_at_once") else {
        return;
    };
    let mut c = Cluster::start(3, "32MiB");
    // node-2 comes back with a device that does not exist: no verbs.
    c.stop_agent(2);
    c.start_agent_with(2, &["--rdma-device", "no-such-hca"]);
    assert!(Cluster::eventually(Duration::from_secs(20), || {
        c.node("node-2").is_some_and(|n| {
            n["state"] == "up"
                && !n["fabrics"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|f| f == "verbs")
        })
    }));
    let note = c.node("node-2").unwrap()["rdma_note"].to_string();
    assert!(note.contains("no-such-hca"), "{note}");
    c.wait_nodes_up(3);
    let ocm = c.client(0);
    let a = ocm
        .alloc_with(
            &AllocSpec::new(6 << 20, Kind::RemoteHost)
                .on_nodes(["node-1", "node-2"])
                .stripe(1 << 20),
        )
        .unwrap();
    // Stripes alternate node-1 (verbs), node-2 (tcp).
    let by_node: Vec<(String, Fabric)> = a
        .descriptor()
        .extents
        .iter()
        .map(|e| e.node.clone())
        .zip(a.fabrics())
        .collect();
    assert!(
        by_node
            .iter()
            .all(|(n, f)| (n == "node-1") == (*f == Fabric::Verbs)),
        "{by_node:?}"
    );
    assert!(
        by_node.iter().any(|(_, f)| *f == Fabric::Tcp),
        "{by_node:?}"
    );
    let data = bytes(6 << 20, 3);
    a.copy_in(0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    a.copy_out(0, &mut back).unwrap();
    assert!(back == data);
}

/// Memory pressure: under a locked-memory limit far below a copy's size
/// (and without the CAP_IPC_LOCK that lets root ignore it), this process
/// cannot register the copy's buffer; 16 MiB still moves both ways over
/// verbs, through the registered bounce buffers.
#[test]
fn copies_under_a_locked_memory_limit_go_through_bounce_buffers() {
    let Some(()) = rdma_run("copies_under_a_locked_memory_limit_go_through_bounce_buffers") else {
        return;
    };
    let c = Cluster::start(2, "32MiB");
    let ocm = c.client(0);
    let a = on(&ocm, 17 << 20, &["node-1"]);
    let data = bytes(16 << 20, 5);
    let limit = MemlockLimit::set(2 << 20);
    // A thread of its own drops CAP_IPC_LOCK and opens its own fabric: the
    // kernel refuses verbs commands on a device opened under other
    // credentials, so this thread's are left alone.
    let desc = a.descriptor().clone();
    let token = c.token.clone();
    let back = std::thread::spawn(move || {
        drop_ipc_lock();
        // The limit bites: the kernel refuses to pin the buffer (verbs
        // registration is checked against the same limit as mlock).
        let mut back = vec![0u8; data.len()];
        // SAFETY: `back` is a live heap buffer; locking it changes no
        // bytes, and a lock that succeeds is undone at once.
        let locked = unsafe { nix::libc::mlock(back.as_ptr().cast(), back.len()) } == 0;
        if locked {
            // SAFETY: as above.
            unsafe { nix::libc::munlock(back.as_ptr().cast(), back.len()) };
        }
        assert!(!locked, "the locked-memory limit does not apply");
        let dp = Operator::new(token, None).fabric(liboncilla::Fabric::Verbs);
        dp.write(&desc, 3, &data).unwrap();
        dp.read(&desc, 3, &mut back).unwrap();
        (data, back)
    })
    .join()
    .unwrap();
    drop(limit);
    let (data, mut back) = back;
    assert!(back == data, "bytes moved through bounce buffers differ");
    // And without the limit, the same buffers are registered as usual.
    back.fill(0);
    a.copy_out(3, &mut back).unwrap();
    assert!(back == data);
}

/// Lowers this process's RLIMIT_MEMLOCK (soft) until dropped.
struct MemlockLimit {
    old: (u64, u64),
}

impl MemlockLimit {
    fn set(bytes: u64) -> Self {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let old = getrlimit(Resource::RLIMIT_MEMLOCK).unwrap();
        setrlimit(Resource::RLIMIT_MEMLOCK, bytes, old.1).unwrap();
        MemlockLimit { old }
    }
}

impl Drop for MemlockLimit {
    fn drop(&mut self) {
        let _ = nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_MEMLOCK,
            self.old.0,
            self.old.1,
        );
    }
}

const CAP_IPC_LOCK: u32 = 14;
const CAP_V3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drops CAP_IPC_LOCK (which lets root ignore RLIMIT_MEMLOCK) from the
/// calling thread's effective set, for good.
fn drop_ipc_lock() {
    let mut hdr = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget with a version-3 header fills exactly two entries.
    let rc = unsafe { nix::libc::syscall(nix::libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    // SAFETY: as above; only the calling thread's sets change.
    let rc = unsafe { nix::libc::syscall(nix::libc::SYS_capset, &mut hdr, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}

/// A freed allocation's RDMA key opens nothing: not the old bytes, not the
/// next tenant's. The copy fails as "no such allocation" and the queue
/// pair (in the error state after it) is rebuilt for the next copy.
#[test]
fn a_freed_allocations_key_is_refused_and_the_pair_is_rebuilt() {
    let Some(()) = rdma_run("a_freed_allocations_key_is_refused_and_the_pair_is_rebuilt") else {
        return;
    };
    let c = Cluster::start(2, "8MiB");
    let ocm = c.client(0);
    let old = on(&ocm, 4 << 20, &["node-1"]);
    old.copy_in(0, &bytes(4 << 20, 1)).unwrap();
    let stale = old.descriptor().clone();
    old.free().unwrap();
    // Once the old memory is back (and reported), the next tenant gets it:
    // the whole pool is one free hole and placement takes its start.
    assert!(
        Cluster::eventually(Cluster::EVENT, || {
            c.node("node-1").is_some_and(|n| {
                n["free"] == 8 << 20 && n["largest_free"] == 8 << 20 && n["scrubbing"] == 0
            })
        }),
        "node-1's pool never came back whole: {:?}",
        c.node("node-1")
    );
    let new = on(&ocm, 4 << 20, &["node-1"]);
    assert_eq!(
        new.descriptor().extents[0].pool_offset,
        stale.extents[0].pool_offset,
        "the test needs the new allocation on the old memory"
    );
    let secret = bytes(4 << 20, 2);
    new.copy_in(0, &secret).unwrap();
    let before = pairs(&c, "node-1");

    let dp = Operator::new(c.token.clone(), c.tls.clone()).fabric(liboncilla::Fabric::Verbs);
    for len in [100usize, 1 << 20] {
        let mut peek = vec![0u8; len];
        let err = dp.read(&stale, 0, &mut peek).unwrap_err();
        assert!(
            matches!(&err, Error::NotFound(m) if m.contains("node-1") && m.contains("RDMA key")),
            "{err}"
        );
        assert!(peek.iter().all(|&b| b == 0), "saw a tenant's bytes");
        let err = dp.write(&stale, 0, &vec![0xEE; len]).unwrap_err();
        assert!(matches!(err, Error::NotFound(_)), "{err}");
    }
    let mut back = vec![0u8; secret.len()];
    new.copy_out(0, &mut back).unwrap();
    assert!(
        back == secret,
        "a stale key changed the next tenant's bytes"
    );
    // Every refused copy left its pair in the error state; each next copy
    // connected a new one, and the last one works.
    assert!(pairs(&c, "node-1") > before, "{}", c.log("node-1"));
    let mut small = [0u8; 10];
    dp.read(new.descriptor(), 5, &mut small).unwrap();
    assert_eq!(small[..], secret[5..15]);
}

/// The agent does no per-byte work for verbs copies: while 128 MiB move
/// over verbs it spends no more CPU (user and kernel) than it does idle for
/// as long (heartbeats every 200 ms are its whole load), where the same
/// bytes over TCP go through its receive and send calls.
#[test]
fn the_agent_spends_no_cpu_per_byte_on_verbs_copies() {
    let Some(()) = rdma_run("the_agent_spends_no_cpu_per_byte_on_verbs_copies") else {
        return;
    };
    // 200 ms heartbeats whatever the run's setting: the idle load this
    // compares against is measured with them (a slower heartbeat shrinks
    // the baseline, not the agent's time-proportional costs).
    let c = Cluster::start_heartbeat(2, "64MiB", 200);
    let ocm = c.client(0);
    let total = |(u, k): (Duration, Duration)| u + k;
    // The idle rate first, before any allocation exists (no scrubbing).
    let idle_for = Duration::from_secs(3);
    let before = total(c.agent_cpu(1));
    std::thread::sleep(idle_for);
    let idle = total(c.agent_cpu(1)) - before;
    let data = bytes(32 << 20, 9);
    let mut back = vec![0u8; data.len()];
    let mut cost = |fabric: Fabric| {
        let spec = AllocSpec::new(32 << 20, Kind::RemoteHost)
            .on_nodes(["node-1"])
            .fabric(fabric);
        let b = ocm.alloc_with(&spec).unwrap();
        assert_eq!(b.fabrics(), [fabric]);
        let before = total(c.agent_cpu(1));
        let started = std::time::Instant::now();
        for _ in 0..2 {
            b.copy_in(0, &data).unwrap();
            b.copy_out(0, &mut back).unwrap();
        }
        assert!(back == data);
        let spent = total(c.agent_cpu(1)) - before;
        let took = started.elapsed();
        // What idling for as long would have cost.
        let baseline = idle.mul_f64(took.as_secs_f64() / idle_for.as_secs_f64());
        (spent, took, baseline)
    };
    let verbs = cost(Fabric::Verbs);
    let tcp = cost(Fabric::Tcp);
    let line = |(spent, took, baseline): (Duration, Duration, Duration)| {
        format!("{spent:?} CPU in {took:?} (idle for as long: {baseline:?})")
    };
    eprintln!(
        "agent CPU for 128 MiB moved: verbs {}, tcp {}",
        line(verbs),
        line(tcp)
    );
    // Tick-granular accounting under emulation: half the idle cost and
    // 100 ms of slack.
    let (spent, _, baseline) = verbs;
    assert!(
        spent <= baseline.mul_f64(1.5) + Duration::from_millis(100),
        "verbs copies cost the agent {}, more than idling: it should do nothing per byte; its threads: {:?}",
        line(verbs),
        c.agent_threads(1)
    );
}

/// An RDMA port removed while a cluster uses it (`rdma link delete`, only
/// where `ONCILLA_TEST_RDMA_LINK=DEV:NETDEV` says the test may, as in the
/// throw-away guest; the port is put back afterwards). The agent on it lets
/// go of the device within its sweep (rxe cannot remove a device a process
/// holds: the command would wait forever), tells the master, and copies to
/// that node fail with a clear error or go over TCP, never hang.
#[test]
fn port_removed_mid_run_fails_clearly_then_falls_back() {
    let Some(()) = rdma_run("port_removed_mid_run_fails_clearly_then_falls_back") else {
        return;
    };
    let Some((dev, netdev)) = std::env::var("ONCILLA_TEST_RDMA_LINK").ok().and_then(|v| {
        v.split_once(':')
            .map(|(a, b)| (a.to_string(), b.to_string()))
    }) else {
        eprintln!("skipped port_removed_mid_run_fails_clearly_then_falls_back: set ONCILLA_TEST_RDMA_LINK=DEV:NETDEV where the test may delete that port (the Soft-RoCE guest)");
        return;
    };
    let c = Cluster::start(2, "16MiB");
    assert!(
        c.log("node-1").contains(&format!("ports={dev}:")),
        "node-1 should be on {dev}: {}",
        c.log("node-1")
    );
    let ocm = c.client(0);
    let a = on(&ocm, 4 << 20, &["node-1"]);
    assert_eq!(a.fabrics(), [Fabric::Verbs]);
    let data = bytes(4 << 20, 4);
    a.copy_in(0, &data).unwrap();

    // Bounded: the kernel finishes the removal once the agent lets go.
    let started = std::time::Instant::now();
    let out = std::process::Command::new("timeout")
        .args(["60", "rdma", "link", "delete", &dev])
        .output()
        .unwrap();
    struct PutBack<'a>(&'a str, &'a str);
    impl Drop for PutBack<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("rdma")
                .args(["link", "add", self.0, "type", "rxe", "netdev", self.1])
                .status();
        }
    }
    let _put_back = PutBack(&dev, &netdev);
    assert!(
        out.status.success(),
        "rdma link delete {dev} did not finish in 60 s ({:?}): the agent kept the device; {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("rdma link delete {dev} took {:?}", started.elapsed());
    assert!(
        c.log("node-1").contains("RDMA port went away"),
        "{}",
        c.log("node-1")
    );
    // The master hears of it: node-1 no longer offers verbs, and says why.
    assert!(
        Cluster::eventually(Cluster::EVENT, || {
            c.node("node-1").is_some_and(|n| {
                !n["fabrics"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|f| f == "verbs")
                    && n["rdma_note"].as_str().unwrap_or("").contains("went away")
                    && n["rdma"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["device"] == dev.as_str() && p["state"] == "REMOVED")
            })
        }),
        "{:?}",
        c.node("node-1")
    );

    // Each copy ends within the verbs deadlines: an error that names the
    // node, or the bytes (over TCP once verbs is known to be gone).
    let mut outcomes = Vec::new();
    let mut back = vec![0u8; data.len()];
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let r = a.copy_out(0, &mut back);
        assert!(started.elapsed() < Duration::from_secs(60), "a copy hung");
        match r {
            Ok(()) => {
                assert!(back == data);
                outcomes.push("ok".to_string());
            }
            Err(e) => {
                assert!(
                    matches!(&e, Error::NodeUnreachable { node, .. } | Error::Fabric { node, .. } if node == "node-1"),
                    "{e}"
                );
                outcomes.push(e.to_string());
            }
        }
    }
    eprintln!("copies after the port went: {outcomes:#?}");
    assert_eq!(
        outcomes.last().map(String::as_str),
        Some("ok"),
        "falls back to TCP"
    );
    // New allocations there work, over TCP.
    let b = on(&ocm, 1 << 20, &["node-1"]);
    assert_eq!(b.fabrics(), [Fabric::Tcp]);
    b.copy_in(0, &data[..1 << 20]).unwrap();
    let mut back = vec![0u8; 1 << 20];
    b.copy_out(0, &mut back).unwrap();
    assert!(back[..] == data[..1 << 20]);
}
