//! Draining a node on a real cluster (daemons as processes on loopback):
//! under load from two sessions, a single-copy allocation and a replicated
//! one move off the drained node with no failed client call; memory a
//! process on the node maps stays until it is unmapped, and `ocmctl
//! nodes` says why; afterwards the node holds nothing, can be killed with
//! nothing lost, and `ocmctl undrain` lets it take allocations again.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Allocation, Batch, Kind, Oncilla};
use support::Cluster;

const MIB: usize = 1 << 20;
/// Slots of one MiB in each loaded allocation.
const SLOTS: usize = 8;
/// Most rounds one load thread makes (it stops earlier when told).
const MAX_ROUNDS: u32 = 100_000;

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)).to_le_bytes()[1])
        .collect()
}

/// Writes a new pattern into one slot after another and reads each back
/// until `stop` (or [`MAX_ROUNDS`], or `limit`), every other round as a
/// batch of two copies through `ocm` (batches fail over too): every
/// failed call or wrong byte, and the seed each slot holds last.
fn load(
    ocm: &Oncilla,
    a: &Allocation,
    stop: &AtomicBool,
    limit: Duration,
) -> (Vec<String>, [u32; SLOTS], u32) {
    let mut failures = Vec::new();
    let mut last = [0u32; SLOTS];
    let started = Instant::now();
    let mut round = 0;
    let mut back = vec![0u8; MIB];
    while round < MAX_ROUNDS && !stop.load(Ordering::SeqCst) && started.elapsed() < limit {
        round += 1;
        let slot = round as usize % SLOTS;
        let seed = round + 1000;
        let offset = (slot * MIB) as u64;
        let bytes = pattern(MIB, seed);
        if round % 2 == 0 {
            // The slot's write, and the read of the slot written last.
            let before = (round as usize - 1) % SLOTS;
            let mut batch = Batch::new();
            batch
                .write(a, offset, bytes.clone())
                .read(a, (before * MIB) as u64, vec![0u8; MIB]);
            match ocm.submit(batch).wait() {
                Err(e) => failures.push(format!("round {round}: batch: {e}")),
                Ok(bufs) if bufs[1] != pattern(MIB, last[before]) => {
                    failures.push(format!("round {round}: batch read other bytes"))
                }
                Ok(_) => last[slot] = seed,
            }
            continue;
        }
        if let Err(e) = a.copy_in(offset, &bytes) {
            failures.push(format!("round {round}: write: {e}"));
            continue;
        }
        last[slot] = seed;
        match a.copy_out(offset, &mut back) {
            Err(e) => failures.push(format!("round {round}: read: {e}")),
            Ok(()) if back != bytes => failures.push(format!("round {round}: read other bytes")),
            Ok(()) => {}
        }
    }
    (failures, last, round)
}

/// Every slot of `a` holds the pattern `last` says.
fn check(a: &Allocation, last: &[u32; SLOTS]) {
    let mut all = vec![0u8; SLOTS * MIB];
    a.copy_out(0, &mut all).unwrap();
    for (slot, seed) in last.iter().enumerate() {
        assert!(
            all[slot * MIB..(slot + 1) * MIB] == pattern(MIB, *seed)[..],
            "slot {slot} lost its last write (seed {seed})"
        );
    }
}

#[test]
fn a_drained_node_empties_under_load_with_no_failed_call() {
    let mut c = Cluster::start(3, "64MiB");
    let size = (SLOTS * MIB) as u64;
    let writer = c.client(0);
    let single = writer
        .alloc_with(&AllocSpec::new(size, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    let other = c.client(2);
    let twice = other
        .alloc_with(
            &AllocSpec::new(size, Kind::RemoteHost)
                .on_nodes(["node-1"])
                .replicas(2),
        )
        .unwrap();
    // Memory a process on node-1 maps: persistent, attached there.
    let mapped_rec = c.persistent_on(MIB as u64, "node-1");
    let on_node = c.client(1);
    let mapped = on_node.attach_id(mapped_rec.id).unwrap();
    mapped.copy_in(0, &pattern(MIB, 7)).unwrap();
    // A handle of it on another node, opened before the move and first
    // used after it, in a copy between allocations.
    let reader = c.client(0);
    let stale = reader.attach_id(mapped_rec.id).unwrap();
    let mut start = [0u32; SLOTS];
    for (slot, seed) in start.iter_mut().enumerate() {
        *seed = slot as u32;
        let at = (slot * MIB) as u64;
        single.copy_in(at, &pattern(MIB, *seed)).unwrap();
        twice.copy_in(at, &pattern(MIB, *seed)).unwrap();
    }

    let stop = AtomicBool::new(false);
    let ((f1, last1, rounds1), (f2, last2, rounds2)) = std::thread::scope(|s| {
        let t1 = s.spawn(|| load(&writer, &single, &stop, Cluster::EVENT * 4));
        let t2 = s.spawn(|| load(&other, &twice, &stop, Cluster::EVENT * 4));
        let said = c.ocmctl_ok(&["drain", "node-1"]);
        assert!(said.contains("draining node node-1"), "{said}");
        // Nothing new goes there, and the refusal says why.
        let refused = c.ocmctl(&["alloc", "1MiB", "--node", "node-1"]);
        assert!(!refused.status.success());
        let why = String::from_utf8_lossy(&refused.stderr);
        assert!(why.contains("being drained"), "{why}");
        // The mapped allocation stays while it is mapped, and the node
        // says why.
        let blocked = Cluster::eventually(Cluster::EVENT, || {
            c.node("node-1").is_some_and(|n| {
                n["drain"]["left"] == 1
                    && n["drain"]["note"]
                        .as_str()
                        .is_some_and(|s| s.contains("mapped by a process"))
            })
        });
        assert!(blocked, "{:?}", c.node("node-1"));
        drop(mapped);
        let done = c.ocmctl_ok(&["drain", "node-1", "--wait", "--timeout", "240s"]);
        assert!(done.contains("is drained"), "{done}");
        stop.store(true, Ordering::SeqCst);
        (t1.join().unwrap(), t2.join().unwrap())
    });
    assert!(
        f1.is_empty(),
        "the single-copy allocation's client saw: {f1:?}"
    );
    assert!(
        f2.is_empty(),
        "the replicated allocation's client saw: {f2:?}"
    );
    assert!(rounds1 > 0 && rounds2 > 0);

    // The master's account: nothing on node-1, every allocation whole
    // elsewhere, the replicated one with both copies.
    let node = c.node("node-1").unwrap();
    assert_eq!(node["drain"]["left"], 0, "{node}");
    assert_eq!(node["used"], 0, "{node}");
    let master = c.master().unwrap();
    for id in [single.id(), twice.id(), mapped_rec.id] {
        let rec = master
            .allocation(&oncilla_model::alloc::AllocRef::Id(id))
            .unwrap();
        assert!(!rec.held_on("node-1"), "{rec:?}");
        assert_eq!(rec.health, oncilla_model::alloc::Health::Healthy, "{rec:?}");
    }
    let table = c.ocmctl_ok(&["nodes"]);
    assert!(table.contains("up, drained"), "{table}");

    // undrain: it takes allocations again.
    c.ocmctl_ok(&["undrain", "node-1"]);
    let id = c.ocmctl_ok(&["alloc", "1MiB", "--node", "node-1"]);
    c.ocmctl_ok(&["free", &id]);

    // Nothing was left there: with node-1 killed, every byte is read, and
    // a batch made with the handles (their routes as opened name node-1)
    // goes through too.
    c.kill_agent(1);
    let mut last1 = merge(&start, &last1);
    let mut last2 = merge(&start, &last2);
    check(&single, &last1);
    check(&twice, &last2);
    for (ocm, a, last) in [(&writer, &single, &mut last1), (&other, &twice, &mut last2)] {
        let mut batch = Batch::new();
        batch
            .write(a, 0, pattern(MIB, 99))
            .read(a, MIB as u64, vec![0u8; MIB]);
        let bufs = ocm.submit(batch).wait().unwrap();
        assert!(bufs[1] == pattern(MIB, last[1]), "a batch read other bytes");
        last[0] = 99;
        check(a, last);
    }
    let mut back = vec![0u8; MIB];
    reader
        .attach_id(mapped_rec.id)
        .unwrap()
        .copy_out(0, &mut back)
        .unwrap();
    assert!(
        back == pattern(MIB, 7),
        "the mapped allocation's bytes moved too"
    );
    // The handle opened before the move still names node-1: a copy from it
    // to another allocation finds where it went.
    let to = reader
        .alloc_with(&AllocSpec::new(MIB as u64, Kind::RemoteHost).on_nodes(["node-2"]))
        .unwrap();
    reader.copy(&to, 0, &stale, 0, MIB as u64).unwrap();
    to.copy_out(0, &mut back).unwrap();
    assert!(
        back == pattern(MIB, 7),
        "copied from a handle opened before the move"
    );
}

/// The last seed of each slot: the load's, or the first written where
/// the load never came.
fn merge(start: &[u32; SLOTS], load: &[u32; SLOTS]) -> [u32; SLOTS] {
    let mut out = *start;
    for (o, l) in out.iter_mut().zip(load) {
        if *l != 0 {
            *o = *l;
        }
    }
    out
}
