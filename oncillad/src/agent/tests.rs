//! The agent alone (no cluster): reservations and releases in its pool,
//! which memory may be mapped, sessions and what it reports.

use super::*;
use crate::pool::{HugePages, PoolSpec};
use oncilla_model::alloc::Owner;
use oncilla_model::cluster::{Range, ReplicaShare, SetCopies};
use oncilla_model::Fabric;

fn agent() -> Agent {
    agent_of(64)
}

/// An agent whose pool holds `pages` pages of 4 KiB.
pub(super) fn agent_of(pages: u64) -> Agent {
    let node = NodeInfo {
        name: "n1".into(),
        ..Default::default()
    };
    let spec = PoolSpec {
        capacity: pages * 4096,
        huge_pages: HugePages::Off,
        slab: 16 * 4096,
    };
    let pool = Pool::new(spec).unwrap();
    let rdma = Rdma::start_at(std::path::Path::new("/nonexistent/infiniband"), &[], &pool);
    Agent::new(
        node,
        Arc::new(pool),
        Arc::new(rdma),
        std::time::Duration::from_secs(300),
    )
}

/// A batch is reserved all or none: a failure gives back what the batch
/// brought, and leaves what was held before it.
#[test]
fn a_failed_batch_gives_back_what_it_reserved() {
    let a = agent();
    a.reserve(res(1, &[3; KEY_LEN], &[(0, 4096)], rec(), Fabric::Auto))
        .unwrap();
    let ok = |id, at| res(id, &[3; KEY_LEN], &[(at, 4096)], rec(), Fabric::Auto);
    let err = a
        .reserve_many(vec![
            ok(2, 0),
            ok(1, 4096),
            ok(3, 0),
            res(4, &[4; 3], &[(0, 10)], rec(), Fabric::Auto),
        ])
        .unwrap_err();
    assert!(err.to_string().contains("access key"), "{err}");
    // 2 and 3 came with the batch and went with it; 1 was held before
    // (what the batch added to it is the master's rollback to release).
    let mut held = a.held_ids();
    held.sort_unstable();
    assert_eq!(held, [1]);
    let made = a.reserve_many(vec![ok(5, 0), ok(6, 0)]).unwrap();
    assert_eq!(made.len(), 2);
    assert_eq!(a.pool().stats().used, 4 * 4096);
}

#[test]
fn reserve_and_release() {
    let a = agent();
    a.reserve(res(1, &[3; KEY_LEN], &[(0, 5000)], rec(), Fabric::Auto))
        .unwrap();
    a.reserve(res(1, &[3; KEY_LEN], &[(5000, 100)], rec(), Fabric::Auto))
        .unwrap();
    assert_eq!(a.pool().stats().used, 3 * 4096);
    assert!(
        a.reserve(res(1, &[3; KEY_LEN], &[(4000, 10)], rec(), Fabric::Auto))
            .is_err(),
        "overlap"
    );
    assert!(
        a.reserve(res(1, &[4; KEY_LEN], &[(9000, 10)], rec(), Fabric::Auto))
            .is_err(),
        "other key"
    );
    assert!(
        a.reserve(res(2, &[4; 3], &[(0, 10)], rec(), Fabric::Auto))
            .is_err(),
        "short key"
    );
    assert!(
        a.reserve(res(
            3,
            &[4; KEY_LEN],
            &[(0, 10), (5, 10)],
            rec(),
            Fabric::Auto
        ))
        .is_err(),
        "self-overlap"
    );
    assert!(
        a.reserve(res(3, &[4; KEY_LEN], &[], rec(), Fabric::Auto))
            .is_err(),
        "nothing"
    );
    let held = a.release(1).unwrap();
    assert_eq!(held.extents.len(), 2);
    drop(held);
    assert_eq!(a.pool().stats().used, 0);
    assert!(a.release(1).is_none());
}

/// A copy given up on a node that keeps other bytes of the allocation:
/// only its extents go, and their memory; a range through an extent is
/// refused; the last bytes take the allocation with them.
#[test]
fn part_of_an_allocation_goes_and_the_rest_stays() {
    let a = agent();
    let key = [3; KEY_LEN];
    a.reserve(res(1, &key, &[(0, 8192)], rec(), Fabric::Auto))
        .unwrap();
    let mut copy = res(1, &key, &[(8192, 4096), (16384, 4096)], rec(), Fabric::Auto);
    copy.copy = 1;
    a.reserve(copy).unwrap();
    assert_eq!(a.pool().stats().used, 4 * 4096);
    let Err(err) = a.release_part(1, &[(4096, 8192)]) else {
        panic!("a range through an extent was taken");
    };
    assert!(err.to_string().contains("cuts through"), "{err}");
    assert_eq!(a.pool().stats().used, 4 * 4096, "nothing went");
    assert!(a.release_part(1, &[(1 << 30, 1)]).unwrap().is_none());
    assert!(a.release_part(9, &[(0, 1)]).unwrap().is_none());

    let was = a
        .release_part(1, &[(8192, 4096), (16384, 4096)])
        .unwrap()
        .unwrap();
    drop(was);
    assert_eq!(a.pool().stats().used, 2 * 4096);
    let kept = Arc::clone(a.held.get(&1).unwrap().value());
    assert!(kept
        .extents
        .iter()
        .all(|e| e.copy == 0 && e.alloc_offset < 8192));
    assert_eq!(kept.extents.iter().map(|e| e.len).sum::<u64>(), 8192);
    drop(kept);

    let was = a.release_part(1, &[(0, 8192)]).unwrap().unwrap();
    drop(was);
    assert!(a.held_ids().is_empty());
    assert_eq!(a.pool().stats().used, 0);
}

#[test]
fn splits_over_slabs_into_pieces() {
    let a = agent();
    // 20 pages do not fit one 16-page slab: two pieces tiling the range.
    let pieces = a
        .reserve(res(
            9,
            &[1; KEY_LEN],
            &[(100, 20 * 4096 - 5)],
            rec(),
            Fabric::Auto,
        ))
        .unwrap();
    assert_eq!(pieces.len(), 2);
    assert_eq!(pieces[0].alloc_offset, 100);
    assert_eq!(pieces[0].len, 16 * 4096);
    assert_eq!(pieces[1].alloc_offset, 100 + 16 * 4096);
    assert_eq!(pieces[1].len, 4 * 4096 - 5);
    let held = a.held().get(&9).unwrap().value().clone();
    assert_eq!(held.extent_for(100, 16 * 4096), Some(0));
    assert_eq!(held.extent_for(100 + 16 * 4096, 10), Some(1));
    assert_eq!(a.usage().used, 20 * 4096);
}

#[test]
fn striped_ranges_pack_into_one_pool_extent() {
    let a = agent();
    let ranges = [(0, 4096), (3 * 4096, 4096), (6 * 4096, 100)];
    let pieces = a
        .reserve(res(5, &[1; KEY_LEN], &ranges, rec(), Fabric::Auto))
        .unwrap();
    let got: Vec<(u64, u64)> = pieces.iter().map(|p| (p.alloc_offset, p.len)).collect();
    assert_eq!(got, ranges);
    // Densely packed: consecutive pool offsets, three pages in all.
    assert_eq!(pieces[1].pool_offset, pieces[0].pool_offset + 4096);
    assert_eq!(pieces[2].pool_offset, pieces[0].pool_offset + 2 * 4096);
    assert_eq!(a.usage().used, 3 * 4096);
    let held = a.held().get(&5).unwrap().value().clone();
    assert_eq!(held.extent_for(3 * 4096 + 10, 100), Some(1));
    assert_eq!(held.extent_for(4096, 1), None, "a gap held elsewhere");
}

/// A reservation of `ranges` of `id`, one copy.
pub(super) fn res(
    id: u64,
    key: &[u8],
    ranges: &[(u64, u64)],
    record: Allocation,
    fabric: Fabric,
) -> Reservation {
    Reservation {
        alloc_id: id,
        access_key: key.to_vec(),
        ranges: ranges
            .iter()
            .map(|&(alloc_offset, len)| Range { alloc_offset, len })
            .collect(),
        record,
        fabric,
        gpu: None,
        copy: 0,
        replicas: Vec::new(),
        fill: false,
    }
}

pub(super) fn rec() -> Allocation {
    let mut a = Allocation::new(0, 1 << 20, Kind::RemoteHost);
    a.name = "kept".into();
    a
}

/// Memory of a session on another node is never mapped here: its
/// small extents hold no file; a persistent allocation's, or one of a
/// session of this node, can be.
#[test]
fn only_memory_a_process_here_may_map_gets_files() {
    let a = agent();
    let mut foreign = rec();
    foreign.owner = Some(Owner {
        session_id: oncilla_model::alloc::session_id("n2", Some(1000), 1),
        node: "n2".into(),
        ..Default::default()
    });
    let mut local = foreign.clone();
    local.owner = Some(Owner {
        session_id: oncilla_model::alloc::session_id("n1", Some(1000), 2),
        node: "n1".into(),
        ..Default::default()
    });
    let mappable = |id: u64, record: Allocation| {
        a.reserve(res(
            id,
            &[id as u8; KEY_LEN],
            &[(0, 4096)],
            record,
            Fabric::Auto,
        ))
        .unwrap();
        let held = a.held.get(&id).map(|e| Arc::clone(e.value())).unwrap();
        held.extents[0].pool().unwrap().files().is_some()
    };
    assert!(!mappable(1, foreign));
    assert!(mappable(2, local));
    assert!(mappable(3, rec()));
}

#[test]
fn sessions_and_reports() {
    let a = agent();
    let s = a.open_session(7, Some(0), "prog".into()).unwrap();
    let t = a.open_session(8, None, "other".into()).unwrap();
    assert!(s.id.starts_with("n1-"));
    assert_eq!(a.session(&s.id).unwrap().pid, 7);
    a.note_attached(&t.id, 42, true);
    a.reserve(res(42, &[5; KEY_LEN], &[(0, 100)], rec(), Fabric::Shm))
        .unwrap();
    a.end_session(&s.id);
    assert!(matches!(a.session(&s.id), Err(CoreError::NoSuchSession(_))));
    assert_eq!(a.ended_sessions(), std::slice::from_ref(&s.id));

    let (report, ended) = a.registration();
    assert_eq!(ended, std::slice::from_ref(&s.id));
    assert_eq!(report.incarnation, a.incarnation());
    assert_eq!(report.next_session_seq, 2);
    assert_eq!(report.sessions.len(), 1);
    let only = &report.sessions[0];
    assert_eq!(only.who.session_seq, 1);
    assert_eq!(only.attached, [42]);
    let held = &report.held[0];
    assert_eq!((held.id, held.name.as_str()), (42, "kept"));
    assert_eq!(held.access_key, [5; KEY_LEN]);
    assert_eq!(held.extents.len(), 1);
    assert_eq!(held.extents[0].fabric, Fabric::Shm);

    a.ack_ended(&ended);
    assert!(a.ended_sessions().is_empty());
    a.release_all(&[42, 43]);
    assert_eq!(a.allocations(), 0);
}

/// Two copy changes of one allocation may arrive in either order (a
/// queued one and a re-created copy's): the one decided later keeps its
/// replicas; an earlier one's promotion still takes effect, once, and its
/// fill of a replica that the later one dropped is refused, not made.
#[test]
fn a_copy_change_decided_earlier_never_undoes_a_later_one() {
    let a = agent();
    let mut record = rec();
    record.placement.replicas = 2;
    let mut primary = res(1, &[1; KEY_LEN], &[(0, 4096)], record.clone(), Fabric::Tcp);
    primary.replicas = vec!["r1:1".into()];
    a.reserve(primary).unwrap();
    let mut replica = res(1, &[1; KEY_LEN], &[(4096, 4096)], record, Fabric::Tcp);
    replica.copy = 1;
    a.reserve(replica).unwrap();
    let replicas = || {
        let h = a.held.get(&1).unwrap();
        let order = h.copying.order();
        order
            .replicas
            .iter()
            .map(|r| r.data_addr.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(replicas(), ["r1:1"], "the reservation's replicas");
    let change = |generation, replicas: &[&str], fill: &[&str], promote: &[(u64, u64)]| SetCopies {
        alloc_id: 1,
        promote: promote
            .iter()
            .map(|&(alloc_offset, len)| Range { alloc_offset, len })
            .collect(),
        replicas: replicas
            .iter()
            .map(|addr| {
                ReplicaShare::of(
                    *addr,
                    &[Range {
                        alloc_offset: 0,
                        len: 8192,
                    }],
                )
            })
            .collect(),
        fill: fill.iter().map(ToString::to_string).collect(),
        generation,
    };
    // The later decision arrives first...
    a.set_copies(change(7, &["r2:1"], &["r2:1"], &[])).unwrap();
    assert_eq!(replicas(), ["r2:1"]);
    // ...then the earlier one: its replicas are not taken, its promotion
    // is, and its fill of a replica no longer listed is refused.
    a.set_copies(change(5, &["r1:1"], &[], &[(4096, 4096)]))
        .unwrap();
    assert_eq!(replicas(), ["r2:1"]);
    let copies = || {
        let h = a.held.get(&1).unwrap();
        h.extents
            .iter()
            .map(|e| (e.alloc_offset, e.copy))
            .collect::<Vec<_>>()
    };
    assert_eq!(copies(), [(0, 0), (4096, 0)], "promoted");
    let err = a
        .set_copies(change(6, &["r1:1"], &["r1:1"], &[]))
        .unwrap_err();
    assert!(matches!(err, CoreError::Superseded(_)), "{err}");
    assert_eq!(replicas(), ["r2:1"]);
    // The same promotion again (a change sent twice) changes nothing, and
    // the agent reports the latest generation it applied.
    a.set_copies(change(7, &["r2:1"], &[], &[(4096, 4096)]))
        .unwrap();
    assert_eq!(copies(), [(0, 0), (4096, 0)]);
    assert_eq!(a.registration().0.copies_generation, 7);
    a.set_copies(change(9, &[], &[], &[])).unwrap();
    assert!(replicas().is_empty());
    assert_eq!(a.registration().0.copies_generation, 9);
}
