//! Copies made beside other bytes of the same allocation (against the fake
//! agent link): in a cluster where every node holds part of an
//! allocation, a lost copy is re-created and a drained node's shares move
//! on the nodes left, never next to another copy of the same bytes; what
//! is given up goes back by its bytes alone; and a restarted master keeps
//! a node's own bytes while it lets go of a copy a move left unfinished.

use oncilla_model::alloc::Extent;
use oncilla_model::cluster::Release;

use super::*;
use crate::master::ranges::merged;

const SHARE: u64 = 8192;

/// An allocation over nodes `a`, `b` and `c`, one share on each, with
/// `copies` copies.
async fn on_three(link: FakeLink, copies: u32) -> (Master<FakeLink>, Allocation) {
    let m = master(link).await;
    m.register(join("c", 1 << 20)).await.unwrap();
    let mut req = remote(3 * SHARE, &["a", "b", "c"], None);
    req.spec.placement.replicas = copies;
    let a = m.allocate(req).await.unwrap();
    for n in ["a", "b", "c"] {
        assert!(a.extents.iter().any(|e| e.node == n), "{a:?}");
    }
    (m, a)
}

/// The nodes holding byte `at` of `a`, in any copy.
fn holders(a: &Allocation, at: u64) -> Vec<String> {
    let mut nodes: Vec<String> = a
        .all_extents()
        .filter(|e| e.alloc_offset <= at && at < e.alloc_offset + e.len)
        .map(|e| e.node.clone())
        .collect();
    nodes.sort();
    nodes
}

/// Asserts every page of `a` is held `copies` times, on as many nodes,
/// none of them `not`.
fn every_byte(a: &Allocation, copies: usize, not: &str) {
    for at in (0..a.size).step_by(4096) {
        let mut h = holders(a, at);
        assert_eq!(h.len(), copies, "byte {at}: {h:?} in {a:?}");
        h.dedup();
        assert_eq!(
            h.len(),
            copies,
            "two copies of byte {at} on one node: {a:?}"
        );
        assert!(!h.iter().any(|n| n == not), "byte {at} still on {not}");
    }
}

#[tokio::test]
async fn a_lost_nodes_bytes_get_their_copies_back_on_the_nodes_left() {
    let link = FakeLink::default();
    let (m, a) = on_three(link.clone(), 2).await;
    // Every node held a primary share and another's replica: each node
    // left holds other bytes of it, and before, none could take a copy.
    m.leave("c", Some(1)).await.unwrap();
    let seen = m.allocation(&by_id(a.id)).unwrap();
    assert_eq!(seen.health, Health::Degraded, "{seen:?}");
    for _ in 0..8 {
        m.tick().await;
        m.refill().await;
    }
    let seen = m.allocation(&by_id(a.id)).unwrap();
    assert_eq!(seen.health, Health::Healthy, "{:?}", seen.health_notes);
    every_byte(&seen, 2, "c");
    // Nothing was given back: every fill was kept.
    assert!(link.releases.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_drained_nodes_shares_move_beside_the_others() {
    let link = FakeLink::default();
    let (m, single) = on_three(link.clone(), 1).await;
    let mut req = remote(3 * SHARE, &["a", "b", "c"], None);
    req.spec.placement.replicas = 2;
    let twice = m.allocate(req).await.unwrap();
    m.drain("a", true).unwrap();
    for _ in 0..8 {
        if !m.move_one().await {
            break;
        }
    }
    let moved = m.allocation(&by_id(single.id)).unwrap();
    every_byte(&moved, 1, "a");
    assert!(moved.extents.iter().all(|e| e.copy == 0));
    let moved2 = m.allocation(&by_id(twice.id)).unwrap();
    assert_eq!(moved2.health, Health::Healthy, "{:?}", moved2.health_notes);
    every_byte(&moved2, 2, "a");
    // a let go of each allocation whole; nothing else was given back.
    let released = link.releases.lock().unwrap().clone();
    assert_eq!(
        released,
        [
            ("a:1".to_string(), Release::all(single.id)),
            ("a:1".to_string(), Release::all(twice.id))
        ]
    );
    // The node that took over a's primary bytes of the replicated one was
    // told, as it was promoted, the replicas of its own bytes too.
    let told = link.copies_set.lock().unwrap().clone();
    let (addr, change) = told
        .iter()
        .find(|(_, c)| c.alloc_id == twice.id && !c.promote.is_empty())
        .expect("a's primary bytes were taken over");
    let node = addr.trim_end_matches(":1");
    let own: Vec<&Extent> = twice.extents.iter().filter(|e| e.node == node).collect();
    assert!(!own.is_empty());
    for e in own {
        let covered = change.replicas.iter().flat_map(|r| &r.ranges).any(|g| {
            g.alloc_offset <= e.alloc_offset && e.alloc_offset + e.len <= g.alloc_offset + g.len
        });
        assert!(covered, "{node}'s own bytes lost their replica: {change:?}");
    }
}

#[tokio::test]
async fn a_copy_that_cannot_be_filled_is_given_back_by_its_bytes() {
    let link = FakeLink {
        cannot_move_on: Some("a:1"),
        ..FakeLink::default()
    };
    let (m, single) = on_three(link.clone(), 1).await;
    m.drain("a", true).unwrap();
    assert!(m.move_one().await);
    let kept = m.allocation(&by_id(single.id)).unwrap();
    assert_eq!(kept.all_extents().count(), single.all_extents().count());
    let released = link.releases.lock().unwrap().clone();
    assert_eq!(released.len(), 1, "{released:?}");
    let (to, r) = &released[0];
    assert_ne!(to, "a:1");
    let a_bytes = merged(single.extents.iter().filter(|e| e.node == "a"));
    assert_eq!(r, &Release::part(single.id, &a_bytes));
}

#[tokio::test]
async fn a_restarted_master_keeps_a_nodes_bytes_and_takes_back_an_unfinished_move() {
    let link = FakeLink::default();
    let m = bare(
        link.clone(),
        Liveness::from_heartbeat(Duration::from_secs(60)),
    );
    let id = 5;
    let mut record = Allocation::new(id, 2 * SHARE, Kind::RemoteHost);
    record.access_key = vec![1; KEY_LEN];
    // b holds its own half, and a copy of a's half that a master was
    // moving to it when it stopped.
    let mut on_b = record.clone();
    on_b.extents = vec![extent("b", SHARE, SHARE, 0)];
    on_b.replicas = vec![extent("b", 0, SHARE, 1)];
    let mut on_a = record.clone();
    on_a.extents = vec![extent("a", 0, SHARE, 0)];
    let reg = |name: &str, held: Allocation| Registration {
        node: node(name, 1 << 20),
        incarnation: 1,
        master_incarnation: 77,
        held: vec![held],
        ..Default::default()
    };
    m.register(reg("a", on_a)).await.unwrap();
    let answer = m.register(reg("b", on_b)).await.unwrap();
    assert!(answer.release.is_empty(), "b keeps its own bytes");
    let seen = m.allocation(&by_id(id)).unwrap();
    assert!(seen.replicas.is_empty(), "{seen:?}");
    assert_eq!(
        seen.extents
            .iter()
            .map(|e| (e.node.as_str(), e.alloc_offset))
            .collect::<Vec<_>>(),
        [("a", 0), ("b", SHARE)]
    );
    m.tick().await;
    assert_eq!(
        link.releases.lock().unwrap().clone(),
        [("b:1".to_string(), Release::part(id, &[(0, SHARE)]))]
    );
    // Confirmed: not asked again.
    m.tick().await;
    assert_eq!(link.releases.lock().unwrap().len(), 1);
}

/// a holds its bytes A and a copy of b's B; b holds B and a copy of c's C;
/// c holds C and a copy of A. Draining a sends A to b (c holds a copy of
/// it) and a's copy of B to c: b, promoted for A, must go on copying its
/// own B to c, the copy this move is making, or writes b acknowledges
/// until the switch would never reach it.
#[tokio::test]
async fn a_promoted_node_keeps_copying_its_own_bytes_to_the_copy_being_made() {
    let link = FakeLink::default();
    let m = bare(
        link.clone(),
        Liveness::from_heartbeat(Duration::from_secs(60)),
    );
    let mut rec = Allocation::new(MAX_ID / 3, 3 * SHARE, Kind::RemoteHost);
    rec.access_key = vec![7; KEY_LEN];
    rec.placement.replicas = 2;
    let (a, b, c) = (0, SHARE, 2 * SHARE);
    let held = [
        ("a", extent("a", a, SHARE, 0), extent("a", b, SHARE, 1)),
        ("b", extent("b", b, SHARE, 0), extent("b", c, SHARE, 1)),
        ("c", extent("c", c, SHARE, 0), extent("c", a, SHARE, 1)),
    ];
    for (node, primary, replica) in held {
        let mut r = join(node, 1 << 20);
        r.master_incarnation = 9;
        let mut part = rec.clone();
        part.extents = vec![primary];
        part.replicas = vec![replica];
        r.held = vec![part];
        m.register(r).await.unwrap();
    }
    m.drain("a", true).unwrap();
    assert!(m.move_one().await);
    let moved = m.allocation(&by_id(rec.id)).unwrap();
    assert!(!moved.held_on("a"), "{moved:?}");
    assert_eq!(moved.health, Health::Healthy, "{:?}", moved.health_notes);
    every_byte(&moved, 2, "a");
    let told = link.copies_set.lock().unwrap().clone();
    let (_, promoted) = told
        .iter()
        .find(|(addr, c)| addr == "b:1" && !c.promote.is_empty())
        .expect("b took over a's bytes");
    let to_c = promoted
        .replicas
        .iter()
        .find(|r| r.data_addr == "c:2")
        .expect("b copies to c");
    assert!(
        to_c.ranges
            .iter()
            .any(|g| g.alloc_offset <= b && b + SHARE <= g.alloc_offset + g.len),
        "b's own bytes are not copied to their new copy on c: {promoted:?}"
    );
}
