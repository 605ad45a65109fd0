//! Replicated allocations on a real cluster (daemons as processes on
//! loopback): copies on different nodes, two writers to overlapping bytes
//! leaving every copy identical (checked by reading the primary, killing
//! its node with SIGKILL and reading the replica), reads that fail over
//! without the application seeing it, and a replica that takes writes only
//! from its primary (attacked with the cluster token on its data port).

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Error, Kind, MapOptions};
use oncilla_model::alloc::{Allocation, KEY_LEN};
use oncilla_net::wire::{Op, Request, Status};
use support::{pattern, Cluster};

const MIB: usize = 1 << 20;
/// How long a node's loss may take to settle: failure detection, a tick,
/// on a loaded machine.
const BOUND: Duration = Duration::from_secs(30);

/// The allocation named `name` as the master records it (copies included).
fn record(c: &Cluster, id: u64) -> Allocation {
    c.master()
        .unwrap()
        .allocation(&oncilla_model::alloc::AllocRef::Id(id))
        .unwrap()
}

/// The nodes holding copy `copy` of `a`.
fn holders(a: &Allocation, copy: u32) -> Vec<String> {
    let mut nodes: Vec<String> = a.copy_extents(copy).map(|e| e.node.clone()).collect();
    nodes.dedup();
    nodes
}

fn index_of(node: &str) -> usize {
    node.trim_start_matches("node-").parse().unwrap()
}

#[test]
fn two_writers_leave_every_copy_identical_and_reads_survive_the_primarys_loss() {
    let mut c = Cluster::start(3, "32MiB");
    let size = 4 * MIB;
    let owner = c.client(0);
    let a = owner
        .alloc_with(
            &AllocSpec::new(size as u64, Kind::RemoteHost)
                .named("replicated-table")
                .on_nodes(["node-1"])
                .replicas(2),
        )
        .unwrap();
    let rec = record(&c, a.id());
    assert_eq!(
        holders(&rec, 0),
        ["node-1"],
        "the primary is where it was asked"
    );
    let replica = holders(&rec, 1);
    assert_eq!(replica.len(), 1, "{rec:?}");
    assert_ne!(replica[0], "node-1", "a replica on the primary's node");
    assert_eq!(rec.copy_extents(1).map(|e| e.len).sum::<u64>(), size as u64);
    // A reader on the node that holds neither copy reads the primary first.
    let reader_node = (0..3)
        .find(|&i| i != 1 && i != index_of(&replica[0]))
        .unwrap();

    // Two sessions on two nodes write overlapping thirds, many rounds.
    let other = c.client(2);
    let b = other.attach("replicated-table").unwrap();
    let rounds = 30;
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..rounds {
                a.copy_in(0, &pattern(3 * MIB, i)).unwrap();
            }
        });
        s.spawn(|| {
            for i in 0..rounds {
                b.copy_in(MIB as u64, &pattern(3 * MIB, 1000 + i)).unwrap();
            }
        });
    });
    let reader = c.client(reader_node);
    let r = reader.attach("replicated-table").unwrap();
    // A mapping of it made before the loss, nothing touched yet.
    let mapper = reader.attach("replicated-table").unwrap();
    let m = mapper.map(MapOptions::default()).unwrap();
    assert!(m.is_paged());
    // One copy, on the node that holds neither copy of the table: copies
    // between it and the table must get through the primary's loss too.
    let plain = owner
        .alloc_with(
            &AllocSpec::new(size as u64, Kind::RemoteHost)
                .on_nodes([format!("node-{reader_node}").as_str()]),
        )
        .unwrap();
    let mut primary = vec![0u8; size];
    r.copy_out(0, &mut primary).unwrap();
    // Bytes only one writer touched are its last round's.
    assert!(primary[..MIB] == pattern(3 * MIB, rounds - 1)[..MIB]);
    assert!(primary[3 * MIB..] == pattern(3 * MIB, 1000 + rounds - 1)[2 * MIB..]);

    // The primary's node dies: the same read comes from the replica, and
    // must be the same bytes.
    c.kill_agent(1);
    let mut from_replica = vec![0u8; size];
    r.copy_out(0, &mut from_replica).unwrap();
    assert!(
        from_replica == primary,
        "the replica differs from the primary at byte {:?}",
        from_replica.iter().zip(&primary).position(|(x, y)| x != y)
    );
    // The mapping fetches from the copies there are now, and writes back
    // to them.
    let mut via_map = vec![0u8; size];
    // SAFETY: `size` bytes at the mapping's start, which lives for the call.
    unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), via_map.as_mut_ptr(), size) };
    assert!(
        via_map == primary,
        "read through a mapping made before the loss"
    );
    let stamp = pattern(4096, 5);
    // SAFETY: 4 KiB inside the mapping.
    unsafe { std::ptr::copy_nonoverlapping(stamp.as_ptr(), m.as_ptr().add(2 * MIB), 4096) };
    m.flush(2 * MIB as u64, 4096).unwrap();
    let mut stamped = vec![0u8; 4096];
    r.copy_out(2 * MIB as u64, &mut stamped).unwrap();
    assert!(
        stamped == stamp,
        "written back through the mapping after the loss"
    );
    primary[2 * MIB..2 * MIB + 4096].copy_from_slice(&stamp);
    drop(m);
    // A copy from the table by a handle that has not met the loss yet
    // (planned from the dead primary, then through its failover).
    owner.copy(&plain, 0, &a, 0, size as u64).unwrap();
    let mut copied = vec![0u8; size];
    plain.copy_out(0, &mut copied).unwrap();
    assert!(copied == primary, "copied from the table after its loss");
    // And into it, by the other writer's handle, which has not met it
    // either.
    let fresh = pattern(MIB, 77);
    plain.copy_in(0, &fresh).unwrap();
    other.copy(&b, 0, &plain, 0, MIB as u64).unwrap();
    let mut again = vec![0u8; size];
    b.copy_out(0, &mut again).unwrap();
    assert!(
        again[..MIB] == fresh[..],
        "copied into the table after its loss"
    );
    assert!(again[MIB..] == primary[MIB..]);
    let mut via_a = vec![0u8; size];
    a.copy_out(0, &mut via_a).unwrap();
    assert!(via_a == again, "every handle sees the same bytes");
}

#[test]
fn a_lost_copy_is_recreated_while_writes_go_on_and_a_lost_primary_gives_way() {
    let mut c = Cluster::start(3, "64MiB");
    let size = 16 * MIB;
    let spec = |name: &str, size: usize| {
        AllocSpec::new(size as u64, Kind::RemoteHost)
            .named(name)
            .on_nodes(["node-1"])
            .replicas(2)
    };
    // The replica's node is killed while a process on the third node
    // writes (named allocations outlive their maker's node).
    let made = c
        .client(0)
        .alloc_with(&spec("loses-a-replica", size))
        .unwrap();
    let id = made.id();
    let replica = holders(&record(&c, id), 1)[0].clone();
    let k = (0..3).find(|&i| i != 1 && i != index_of(&replica)).unwrap();
    let writer = c.client(k);
    let a = writer.attach("loses-a-replica").unwrap();
    drop(made);
    a.copy_in(0, &pattern(size, 1)).unwrap();
    c.kill_agent(index_of(&replica));
    // The write waits for the master to drop the dead copy, and succeeds.
    let killed = Instant::now();
    a.copy_in(0, &pattern(size, 2))
        .expect("a write while the replica's node dies");
    println!(
        "the first write after the replica's node was killed took {:?}",
        killed.elapsed()
    );
    assert!(
        !record(&c, id).held_on(&replica),
        "the dead copy is still in the record"
    );

    // The master re-creates the copy on the third node while the writer
    // goes on: no write fails, and the new copy ends with the last one.
    let mut seed = 2;
    let recreated = Cluster::eventually(BOUND, || {
        seed += 1;
        a.copy_in(0, &pattern(size, seed)).unwrap();
        let rec = record(&c, id);
        holders(&rec, 1) == [format!("node-{k}")]
    });
    assert!(recreated, "no copy was re-created");
    let healthy = Cluster::eventually(BOUND, || {
        c.ocmctl_json(&["show", &id.to_string(), "--json"])["health"] == "healthy"
    });
    assert!(healthy, "the re-created copy is not counted whole");
    let rec = record(&c, id);
    assert_eq!(rec.copy_extents(1).map(|e| e.len).sum::<u64>(), size as u64);
    println!(
        "copy re-created after {:?} (writes went on: {} rounds)",
        killed.elapsed(),
        seed - 2
    );

    // The primary's node is killed: the re-created copy is promoted and
    // holds every byte of the last write; another allocation's replica is
    // promoted too. The handles opened before the loss write on through
    // the promoted copies (each write waits for the promotion), and a
    // process that attaches now reads what they wrote.
    let b = writer
        .alloc_with(&spec("loses-its-primary", 4 * MIB))
        .unwrap();
    b.copy_in(0, &pattern(4 * MIB, 100)).unwrap();
    let reader = c.client(k);
    let mut back = vec![0u8; size];
    let early = reader.attach("loses-a-replica").unwrap();
    c.kill_agent(1);
    let killed = Instant::now();
    early.copy_out(0, &mut back).unwrap();
    assert!(
        back == pattern(size, seed),
        "the re-created copy lost bytes"
    );
    b.copy_in(0, &pattern(4 * MIB, 101))
        .expect("a write while the primary's node dies");
    println!(
        "the first write after the primary's node was killed took {:?}",
        killed.elapsed()
    );
    a.copy_in(0, &pattern(size, seed + 1))
        .expect("a write to the other allocation after its promotion");
    assert_eq!(holders(&record(&c, id), 0), [format!("node-{k}")]);
    assert_eq!(holders(&record(&c, b.id()), 0), [format!("node-{k}")]);
    let again = reader.attach("loses-its-primary").unwrap();
    let mut back = vec![0u8; 4 * MIB];
    again.copy_out(0, &mut back).unwrap();
    assert!(
        back == pattern(4 * MIB, 101),
        "the promoted copy lost bytes"
    );
    let mut back = vec![0u8; size];
    reader
        .attach("loses-a-replica")
        .unwrap()
        .copy_out(0, &mut back)
        .unwrap();
    assert!(back == pattern(size, seed + 1));
}

/// The loss: a 256 MiB allocation with two copies, two processes
/// writing halves of three quarters of it and a third reading the last
/// quarter, and the replica's node killed with SIGKILL mid-run. No call
/// fails (a call may wait out the failure detection); the master
/// re-creates the copy on the fourth node while the writes go on; every
/// byte is the last written; the master's and the agents' accounts
/// agree; and the re-created copy holds what the primary holds (read
/// after the primary's node is killed too).
#[test]
fn a_replica_killed_under_writers_and_readers_costs_no_call_and_no_byte() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;
    const CHUNK: usize = 8 * MIB;
    const CHUNKS: usize = 32; // 256 MiB
    const WRITTEN: usize = 24; // chunks [0, 24) rewritten, [24, 32) read
    const MAX_ROUNDS: usize = 10_000;
    let mut c = Cluster::start(4, "288MiB");
    let made = c
        .client(0)
        .alloc_with(
            &AllocSpec::new((CHUNK * CHUNKS) as u64, Kind::RemoteHost)
                .named("loses-a-replica-under-load")
                .on_nodes(["node-1"])
                .replicas(2),
        )
        .unwrap();
    let id = made.id();
    let replica = index_of(&holders(&record(&c, id), 1)[0]);
    let (x, y) = {
        let mut free = (0..4).filter(|&i| i != 1 && i != replica);
        (free.next().unwrap(), free.next().unwrap())
    };
    drop(made);
    // Four patterns; each write stamps its chunk and round at the front,
    // so a chunk written to the wrong place or left at an older round
    // shows.
    let bases: Vec<Vec<u8>> = (0..4).map(|s| pattern(CHUNK, 10 + s)).collect();
    let content = |chunk: usize, round: usize| {
        let mut b = bases[round % 4].clone();
        b[..8].copy_from_slice(&(chunk as u64).to_le_bytes());
        b[8..16].copy_from_slice(&(round as u64).to_le_bytes());
        b
    };
    let (cx, cy, cr) = (c.client(x), c.client(y), c.client(x));
    let name = "loses-a-replica-under-load";
    let handles = [cx.attach(name).unwrap(), cy.attach(name).unwrap()];
    let reader = cr.attach(name).unwrap();
    for chunk in 0..CHUNKS {
        handles[0]
            .copy_in((chunk * CHUNK) as u64, &content(chunk, 0))
            .unwrap();
    }

    let stop = AtomicBool::new(false);
    let writes = AtomicUsize::new(0);
    let slowest = Mutex::new(Duration::ZERO);
    let timed = |t: Instant| {
        let took = t.elapsed();
        let mut s = slowest.lock().unwrap();
        *s = (*s).max(took);
    };
    let half = WRITTEN / 2;
    let (last_rounds, recreated_after, reads) = std::thread::scope(|s| {
        let writers: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(w, h)| {
                let (stop, writes, content, timed) = (&stop, &writes, &content, &timed);
                s.spawn(move || {
                    let mut last = vec![0; half];
                    for round in 1..MAX_ROUNDS {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        for (j, l) in last.iter_mut().enumerate() {
                            let chunk = w * half + j;
                            let t = Instant::now();
                            h.copy_in((chunk * CHUNK) as u64, &content(chunk, round))
                                .unwrap_or_else(|e| {
                                    panic!("writer {w}, chunk {chunk}, round {round}: {e}")
                                });
                            timed(t);
                            *l = round;
                            writes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    last
                })
            })
            .collect();
        let (stop_r, content_r, timed_r, reader) = (&stop, &content, &timed, &reader);
        let read = s.spawn(move || {
            let mut back = vec![0u8; CHUNK];
            let mut reads = 0;
            for i in 0..MAX_ROUNDS * CHUNKS {
                if stop_r.load(Ordering::Relaxed) {
                    break;
                }
                let chunk = WRITTEN + i % (CHUNKS - WRITTEN);
                let t = Instant::now();
                reader
                    .copy_out((chunk * CHUNK) as u64, &mut back)
                    .unwrap_or_else(|e| panic!("reader, chunk {chunk}: {e}"));
                timed_r(t);
                assert!(back == content_r(chunk, 0), "chunk {chunk} read wrong");
                reads += 1;
            }
            reads
        });
        // Both writers have written every chunk of theirs once more.
        assert!(
            Cluster::eventually(BOUND, || writes.load(Ordering::Relaxed) >= WRITTEN),
            "the writers made no progress"
        );
        c.kill_agent(replica);
        let killed = Instant::now();
        let recreated = Cluster::eventually(BOUND * 2, || {
            let rec = record(&c, id);
            let whole = rec.copy_extents(1).map(|e| e.len).sum::<u64>() == (CHUNK * CHUNKS) as u64;
            whole
                && !rec.held_on(&format!("node-{replica}"))
                && c.ocmctl_json(&["show", &id.to_string(), "--json"])["health"] == "healthy"
        });
        let recreated_after = killed.elapsed();
        // One more round of every chunk after the copy was re-created.
        let then = writes.load(Ordering::Relaxed);
        let more = Cluster::eventually(BOUND, || writes.load(Ordering::Relaxed) >= then + WRITTEN);
        stop.store(true, Ordering::Relaxed);
        let mut last_rounds = Vec::new();
        for w in writers {
            last_rounds.extend(w.join().unwrap());
        }
        let reads = read.join().unwrap();
        assert!(recreated, "the lost copy was not re-created");
        assert!(more, "writes stopped after the copy was re-created");
        assert!(reads > 0, "the reader read nothing");
        (last_rounds, recreated_after, reads)
    });
    println!(
        "{} writes and {reads} reads of 8 MiB, none failed; copy re-created {recreated_after:?} after the kill; slowest call {:?} (failure detection: {} ms)",
        writes.load(Ordering::Relaxed),
        slowest.lock().unwrap(),
        5 * support::heartbeat_ms()
    );

    // Every byte is the last written: read on the primary's node (its own
    // copy first)...
    let check = |h: &liboncilla::Allocation, from: &str| {
        let mut back = vec![0u8; CHUNK];
        for chunk in 0..CHUNKS {
            let round = last_rounds.get(chunk).copied().unwrap_or(0);
            h.copy_out((chunk * CHUNK) as u64, &mut back).unwrap();
            assert!(
                back == content(chunk, round),
                "{from}: chunk {chunk} is not round {round}'s"
            );
        }
    };
    let on_primary = c.client(1);
    let h = on_primary.attach(name).unwrap();
    check(&h, "the primary");
    drop((h, on_primary));
    c.accounts_agree();
    // ...and from the re-created copy alone, once the primary is gone.
    c.kill_agent(1);
    check(&reader, "the re-created copy");
}

#[test]
fn placement_refuses_replicas_it_cannot_keep_apart() {
    let c = Cluster::start(2, "16MiB");
    let ocm = c.client(0);
    let three = ocm.alloc_with(&AllocSpec::new(MIB as u64, Kind::RemoteHost).replicas(3));
    match three {
        Err(Error::CapacityExhausted(msg)) => {
            assert!(msg.contains("needs another node"), "{msg}");
        }
        other => panic!("3 copies on 2 nodes: {other:?}"),
    }
    for (spec, why) in [
        (
            AllocSpec::new(MIB as u64, Kind::LocalHost).replicas(2),
            "remote host memory",
        ),
        (
            AllocSpec::new(MIB as u64, Kind::RemoteHost).replicas(4),
            "1 to 3 copies",
        ),
        (
            AllocSpec::new(MIB as u64, Kind::RemoteHost)
                .replicas(2)
                .fabric(liboncilla::Fabric::Shm),
            "reached over TCP",
        ),
    ] {
        match ocm.alloc_with(&spec) {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains(why), "{msg}"),
            other => panic!("{spec:?}: {other:?}"),
        }
    }
    // Two copies fit, and each node holds one.
    let a = ocm
        .alloc_with(&AllocSpec::new(MIB as u64, Kind::RemoteHost).replicas(2))
        .unwrap();
    let rec = record(&c, a.id());
    let (p, r) = (holders(&rec, 0), holders(&rec, 1));
    assert_eq!(p.len() + r.len(), 2);
    assert_ne!(p, r);

    // The operator's view and flag.
    let made = c.ocmctl_json(&["alloc", "1MiB", "--replicas", "2", "--json"]);
    assert_eq!(made["replicas"], 2, "{made}");
    let copies: Vec<u64> = made["extents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["copy"].as_u64().unwrap())
        .collect();
    assert_eq!(copies, [0, 1], "{made}");
    let shown = c.ocmctl_ok(&["show", &made["id"].to_string()]);
    assert!(shown.contains("2 copies"), "{shown}");
    let refused = c.ocmctl(&["alloc", "1MiB", "--replicas", "4"]);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("1 to 3 copies"), "{why}");
    c.still_serves();
}

#[test]
fn a_replica_takes_writes_only_from_its_primary() {
    let c = Cluster::start(2, "16MiB");
    let spec = oncilla_model::alloc::AllocSpec::new(
        MIB as u64,
        oncilla_model::Kind::RemoteHost,
        oncilla_model::alloc::Placement {
            nodes: vec![oncilla_model::alloc::NodeShare {
                node: "node-0".into(),
                weight: 1,
            }],
            replicas: 2,
            ..Default::default()
        },
        String::new(),
        true,
        oncilla_model::Fabric::Tcp,
    )
    .unwrap();
    let rec = c.master().unwrap().allocate(spec).unwrap();
    let key: [u8; KEY_LEN] = rec.access_key.as_slice().try_into().unwrap();
    let primary = &rec.extents[0];
    let replica = rec.copy_extents(1).next().unwrap();
    assert_eq!(
        (primary.node.as_str(), replica.node.as_str()),
        ("node-0", "node-1")
    );
    let req = |op, len: usize| Request {
        op,
        alloc_id: rec.id,
        key,
        offset: 0,
        len: len as u64,
    };
    let bytes = pattern(64 << 10, 7);

    // A connection that presented the cluster token is not a primary: a
    // write to the replica is sent to the primary, and a REPLICATE is
    // refused (only the replicator credential agents mint may send one).
    let mut at_replica = c.data_client(replica.data_addr.parse().unwrap());
    let (status, msg) =
        support::data_exchange(&mut at_replica, &req(Op::Write, bytes.len()), &bytes);
    assert_eq!(
        status,
        Status::NotPrimary,
        "{}",
        String::from_utf8_lossy(&msg)
    );
    // (A REPLICATE's 16-byte stamp comes before its payload.)
    let stamped: Vec<u8> = [0u8; 16].iter().chain(&bytes).copied().collect();
    let (status, msg) =
        support::data_exchange(&mut at_replica, &req(Op::Replicate, bytes.len()), &stamped);
    assert_eq!(status, Status::NoSuchAllocation);
    assert!(
        String::from_utf8_lossy(&msg).contains("only an allocation's primary"),
        "{}",
        String::from_utf8_lossy(&msg)
    );
    // The stream stayed in step, and nothing of those bytes landed.
    let (status, before) =
        support::data_exchange(&mut at_replica, &req(Op::Read, bytes.len()), &[]);
    assert_eq!(status, Status::Ok);
    assert!(
        before.iter().all(|&b| b == 0),
        "a refused write changed the replica"
    );

    // A write to the primary is in the replica once acknowledged.
    let mut at_primary = c.data_client(primary.data_addr.parse().unwrap());
    let (status, msg) =
        support::data_exchange(&mut at_primary, &req(Op::Write, bytes.len()), &bytes);
    assert_eq!(status, Status::Ok, "{}", String::from_utf8_lossy(&msg));
    let (status, after) = support::data_exchange(&mut at_replica, &req(Op::Read, bytes.len()), &[]);
    assert_eq!(status, Status::Ok);
    assert!(
        after == bytes,
        "the acknowledged write is not in the replica"
    );
    c.still_serves();
}

/// Striped over three of five nodes with two copies, some node holds a
/// primary share and the replica of another's (three replica shares, two
/// nodes without a primary share). Killing the other's node makes it
/// take over those bytes beside its own (each write then goes to the
/// replica holding its bytes): no write fails, no byte is lost. Once the
/// killed node is back empty and the copy was made again, killing the
/// node that took over sends its own bytes and those it took over to
/// different nodes, and again no write fails and no byte is lost.
#[test]
fn a_node_holding_a_primary_share_takes_over_another_and_gives_both_up() {
    let mut c = Cluster::start(5, "32MiB");
    let size = 12 * MIB;
    let writer = c.client(4);
    let a = writer
        .alloc_with(
            &AllocSpec::new(size as u64, Kind::RemoteHost)
                .on_nodes(["node-0", "node-1", "node-2"])
                .replicas(2),
        )
        .unwrap();
    let id = a.id();
    let rec = record(&c, id);
    let primaries = holders(&rec, 0);
    assert_eq!(primaries.len(), 3, "{rec:?}");
    let whole = |rec: &Allocation, copy: u32| rec.copy_extents(copy).map(|e| e.len).sum::<u64>();
    assert_eq!(whole(&rec, 1), size as u64);
    // p's replica is on x, which holds a primary share too.
    let (p, x) = primaries
        .iter()
        .find_map(|p| {
            let on = rec
                .copy_extents(1)
                .find(|e| {
                    rec.extents
                        .iter()
                        .any(|o| o.node == *p && o.alloc_offset == e.alloc_offset)
                })?
                .node
                .clone();
            primaries.contains(&on).then(|| (p.clone(), on))
        })
        .expect("three replica shares, two nodes without a primary one");
    let check = |seed: u32, what: &str| {
        let mut back = vec![0u8; size];
        a.copy_out(0, &mut back).unwrap();
        assert!(
            back == pattern(size, seed),
            "{what}: differs at byte {:?}",
            back.iter()
                .zip(pattern(size, seed))
                .position(|(x, y)| *x != y)
        );
    };
    a.copy_in(0, &pattern(size, 1)).unwrap();

    c.kill_agent(index_of(&p));
    a.copy_in(0, &pattern(size, 2))
        .unwrap_or_else(|e| panic!("a write of every byte after {p} was killed: {e}"));
    check(2, "after the first kill");
    let rec = record(&c, id);
    assert!(!rec.held_on(&p), "{rec:?}");
    assert_eq!(whole(&rec, 0), size as u64, "every byte has a primary");
    assert_eq!(holders(&rec, 0).iter().filter(|n| **n == x).count(), 1);

    // p comes back empty: the bytes x took over get a replica again,
    // while the writes go on.
    c.start_agent(index_of(&p));
    let mut seed = 2;
    let healthy = Cluster::eventually(BOUND, || {
        seed += 1;
        a.copy_in(0, &pattern(size, seed)).unwrap();
        c.ocmctl_json(&["show", &id.to_string(), "--json"])["health"] == "healthy"
    });
    assert!(healthy, "no copy was made again: {:?}", record(&c, id));
    assert_eq!(whole(&record(&c, id), 1), size as u64);

    // x dies: its own bytes and those it took over go to the nodes
    // holding their replicas.
    c.kill_agent(index_of(&x));
    a.copy_in(0, &pattern(size, seed + 1))
        .unwrap_or_else(|e| panic!("a write of every byte after {x} was killed: {e}"));
    check(seed + 1, "after the second kill");
    let rec = record(&c, id);
    assert!(!rec.held_on(&x), "{rec:?}");
    assert_eq!(whole(&rec, 0), size as u64, "{rec:?}");
    c.accounts_agree();
}

/// The master is killed while it re-creates a lost copy: the moment the
/// copy's new node has reserved it, that node is frozen (SIGSTOP) and the
/// master killed, so the copy holds at most the first bytes its fill
/// sent (or all, where the fill outran the test). The next master must not
/// take that copy as whole: it has it given back and filled again, and
/// once the primary's node is killed too, the copy left holds every byte
/// (bytes the fill never sent would read back as zeros).
#[test]
fn a_copy_cut_short_with_its_master_is_filled_again_not_taken() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let mut c = Cluster::start(3, "128MiB");
    let size = 64 * MIB;
    let writer = c.client(1);
    let a = writer
        .alloc_with(
            &AllocSpec::new(size as u64, Kind::RemoteHost)
                .named("cut-short")
                .on_nodes(["node-1"])
                .replicas(2),
        )
        .unwrap();
    let id = a.id();
    a.copy_in(0, &pattern(size, 7)).unwrap();
    let replica = holders(&record(&c, id), 1)[0].clone();
    let t = (0..3).find(|&i| i != 1 && i != index_of(&replica)).unwrap();
    let t_data = c.node(&format!("node-{t}")).unwrap()["data_addr"]
        .as_str()
        .unwrap()
        .to_string();
    let t_pid = Pid::from_raw(i32::try_from(c.agent_pid(t).unwrap()).unwrap());
    c.kill_agent(index_of(&replica));
    // Watched closely (not through `eventually`'s pauses): the fill of
    // 64 MiB takes a fraction of a second.
    let until = Instant::now() + BOUND;
    let reserved = |c: &Cluster| c.log(&format!("node-{t}")).contains("reserved a new copy");
    while !reserved(&c) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    kill(t_pid, Signal::SIGSTOP).unwrap();
    c.kill_master();
    // A fill under way stalls on the frozen node until the primary gives
    // it up: only then is t let go, so the fill cannot finish after all.
    let fill_began = c
        .log("node-1")
        .lines()
        .any(|l| l.contains("copies changed") && l.contains(&t_data));
    let given_up = fill_began
        && Cluster::eventually(BOUND, || {
            let log = c.log("node-1");
            log.contains("could not fill a new replica") || log.contains("replica filled")
        });
    kill(t_pid, Signal::SIGCONT).unwrap();
    println!(
        "the master was killed with the fill begun: {fill_began}; given up or done: {given_up}"
    );
    assert!(
        reserved(&c),
        "the master did not start re-creating the copy"
    );

    c.start_master();
    c.wait_nodes_up(2);
    let head = pattern(MIB, 8);
    a.copy_in(0, &head)
        .expect("a write after the master's restart");
    let healthy = Cluster::eventually(BOUND, || {
        c.ocmctl_json(&["show", &id.to_string(), "--json"])["health"] == "healthy"
    });
    assert!(healthy, "the copy was not made again: {:?}", record(&c, id));
    println!(
        "the new master turned the cut copy down: {}",
        c.log("master").contains("not confirmed whole")
    );
    assert_eq!(holders(&record(&c, id), 1), [format!("node-{t}")]);
    c.accounts_agree();

    // Only the copy on t is left once node-1 dies: it holds every byte.
    c.kill_agent(1);
    let mut want = pattern(size, 7);
    want[..MIB].copy_from_slice(&head);
    let mut back = vec![0u8; size];
    c.client(t)
        .attach("cut-short")
        .unwrap()
        .copy_out(0, &mut back)
        .unwrap();
    assert!(
        back == want,
        "the copy made before the master's kill was taken as whole: byte {:?} differs",
        back.iter().zip(&want).position(|(x, y)| x != y)
    );
}
