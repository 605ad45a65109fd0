//! The master core and replicated allocations that lose a copy's node:
//! the copy leaves the record, a replica is promoted in place of a lost
//! primary, agents are told, and the copy is made again elsewhere
//! (against the fake agent link of the parent).

use super::*;

/// A replicated allocation on three nodes: `a` primary, `b` its replica.
async fn replicated(link: FakeLink) -> (Master<FakeLink>, Allocation) {
    let m = master(link).await;
    m.register(join("c", 1 << 20)).await.unwrap();
    let mut req = remote(10_000, &["a"], None);
    req.spec.placement.replicas = 2;
    let a = m.allocate(req).await.unwrap();
    assert_eq!(a.extents[0].node, "a");
    assert!(a.replicas.iter().all(|e| e.copy == 1 && e.node != "a"));
    (m, a)
}

#[tokio::test]
async fn a_lost_replica_leaves_the_record_and_the_primary_copies_to_the_rest() {
    let link = FakeLink::default();
    let (m, a) = replicated(link.clone()).await;
    let replica = a.replicas[0].node.clone();
    let mut fresh = join(&replica, 1 << 20);
    fresh.incarnation = 2;
    m.register(fresh).await.unwrap();
    let seen = m.allocation(&by_id(a.id)).unwrap();
    assert!(seen.replicas.is_empty(), "{seen:?}");
    assert_eq!(seen.extents, a.extents, "the primary stays");
    assert_eq!(seen.health, Health::Degraded);
    assert!(
        seen.health_notes
            .iter()
            .any(|n| n.contains("under-replicated")),
        "{:?}",
        seen.health_notes
    );
    m.tick().await;
    m.refill().await;
    let told = link.copies_set.lock().unwrap().clone();
    assert_eq!(told.len(), 2, "{told:?}");
    let (addr, change) = &told[0];
    assert_eq!(addr, "a:1", "the primary's agent");
    assert!(change.promote.is_empty() && change.replicas.is_empty());
    // Then the copy is made again elsewhere: the primary fills it, and
    // only then does the record list it.
    let (addr, refill) = &told[1];
    assert_eq!(addr, "a:1");
    assert_eq!(refill.fill.len(), 1, "{refill:?}");
    let addrs: Vec<&String> = refill.replicas.iter().map(|r| &r.data_addr).collect();
    assert_eq!(addrs, refill.fill.iter().collect::<Vec<_>>());
    assert_eq!(
        refill.replicas[0].ranges.iter().map(|r| r.len).sum::<u64>(),
        10_000,
        "every byte"
    );
    let seen = m.allocation(&by_id(a.id)).unwrap();
    assert_eq!(seen.health, Health::Healthy, "{:?}", seen.health_notes);
    assert_eq!(seen.copy_extents(1).map(|e| e.len).sum::<u64>(), 10_000);
    let new_node = seen.replicas[0].node.clone();
    assert_eq!(format!("{new_node}:2"), refill.fill[0]);
    assert_ne!(new_node, "a");
    // Then told the record's replicas once more (a change queued while
    // it filled would have missed the new copy), and nothing after.
    m.tick().await;
    let told = link.copies_set.lock().unwrap().clone();
    assert_eq!(told.len(), 3, "{told:?}");
    assert_eq!(told[2].1.replicas, refill.replicas);
    assert!(told[2].1.fill.is_empty());
    m.tick().await;
    assert_eq!(link.copies_set.lock().unwrap().len(), 3);
    // The restarted node's heartbeat holding the id is told to release
    // it, unless the new copy is there.
    let mut late = beat(&replica, vec![a.id], &[]);
    late.incarnation = 2;
    let release = m.heartbeat(late).await.release;
    if new_node == replica {
        assert!(release.is_empty());
    } else {
        assert_eq!(release, [a.id]);
    }
}

/// Every copy change is decided with a larger generation than the one
/// before, and than any an agent reported applying: agents keep the
/// latest decided whatever order changes arrive in, and a master that
/// starts again never decides below what they applied.
#[tokio::test]
async fn copy_changes_come_in_generations_above_what_agents_applied() {
    let link = FakeLink::default();
    let (m, a) = replicated(link.clone()).await;
    let mut seen_later = join("d", 1 << 20);
    seen_later.copies_generation = 1_000;
    m.register(seen_later).await.unwrap();
    let replica = a.replicas[0].node.clone();
    let mut fresh = join(&replica, 1 << 20);
    fresh.incarnation = 2;
    m.register(fresh).await.unwrap();
    m.tick().await;
    m.refill().await;
    m.tick().await;
    let told = link.copies_set.lock().unwrap().clone();
    assert_eq!(told.len(), 3, "{told:?}");
    let generations: Vec<u64> = told.iter().map(|(_, c)| c.generation).collect();
    assert!(generations[0] > 1_000, "{generations:?}");
    assert!(
        generations.windows(2).all(|w| w[0] < w[1]),
        "in the order decided: {generations:?}"
    );
}

#[tokio::test]
async fn a_lost_primary_gives_way_to_its_replica() {
    let link = FakeLink::default();
    let (m, a) = replicated(link.clone()).await;
    let replica = a.replicas[0].node.clone();
    let mut fresh = join("a", 1 << 20);
    fresh.incarnation = 2;
    m.register(fresh).await.unwrap();
    let seen = m.allocation(&by_id(a.id)).unwrap();
    assert!(seen
        .extents
        .iter()
        .all(|e| e.node == replica && e.copy == 0));
    assert_eq!(seen.extents.iter().map(|e| e.len).sum::<u64>(), 10_000);
    assert!(seen.replicas.is_empty());
    assert_eq!(seen.health, Health::Degraded, "one copy left");
    m.tick().await;
    m.refill().await;
    let told = link.copies_set.lock().unwrap().clone();
    assert_eq!(told.len(), 2, "a promotion, then a new copy: {told:?}");
    assert_eq!(told[0].0, format!("{replica}:1"));
    assert_eq!(told[1].0, format!("{replica}:1"));
    assert_eq!(told[1].1.fill.len(), 1);
    assert_eq!(
        m.allocation(&by_id(a.id)).unwrap().health,
        Health::Healthy,
        "two copies again"
    );
    assert_eq!(
        told[0].1.promote,
        [Range {
            alloc_offset: 0,
            len: 10_000
        }]
    );
    m.free(&by_id(a.id), "", None, false).await.unwrap();
}

#[tokio::test]
async fn a_replica_on_a_node_with_a_primary_share_is_promoted_beside_it() {
    // Primary shares on a and b; one's replica can only go to the other
    // (c holds one replica, and a node takes one share of a copy).
    let link = FakeLink::default();
    let m = master(link.clone()).await;
    m.register(join("c", 1 << 20)).await.unwrap();
    let mut req = remote(20_000, &["a", "b"], None);
    req.spec.placement.replicas = 2;
    let a = m.allocate(req).await.unwrap();
    let on = |node: &str| -> Vec<u32> {
        let mut copies: Vec<u32> = a
            .all_extents()
            .filter(|e| e.node == node)
            .map(|e| e.copy)
            .collect();
        copies.sort_unstable();
        copies.dedup();
        copies
    };
    // x holds its primary share and p's replica.
    let (x, p) = if on("a") == [0, 1] {
        ("a", "b")
    } else {
        ("b", "a")
    };
    assert_eq!((on(x), on(p), on("c")), (vec![0, 1], vec![0], vec![1]));
    let of = |node: &str, copy: u32| -> Vec<(u64, u64)> {
        let mut r: Vec<(u64, u64)> = a
            .all_extents()
            .filter(|e| e.node == node && e.copy == copy)
            .map(|e| (e.alloc_offset, e.len))
            .collect();
        r.sort_unstable();
        r
    };
    let (x_own, p_own) = (of(x, 0), of(p, 0));
    let mut fresh = join(p, 1 << 20);
    fresh.incarnation = 2;
    m.register(fresh).await.unwrap();
    // x holds every byte as primary now: its own, and p's from its
    // replica of them.
    let seen = m.allocation(&by_id(a.id)).unwrap();
    assert!(seen.extents.iter().all(|e| e.node == x), "{seen:?}");
    assert_eq!(seen.extents.iter().map(|e| e.len).sum::<u64>(), 20_000);
    assert_eq!(seen.health, Health::Degraded, "{:?}", seen.health_notes);
    assert!(
        seen.health_notes
            .iter()
            .any(|n| n.contains("under-replicated")),
        "{:?}",
        seen.health_notes
    );
    m.tick().await;
    let told = link.copies_set.lock().unwrap().clone();
    let (addr, change) = told.last().expect("x is told");
    assert_eq!(*addr, format!("{x}:1"));
    let promoted: Vec<(u64, u64)> = change
        .promote
        .iter()
        .map(|r| (r.alloc_offset, r.len))
        .collect();
    let sum = |r: &[(u64, u64)]| r.iter().map(|g| g.1).sum::<u64>();
    assert_eq!(sum(&promoted), sum(&p_own));
    assert!(promoted
        .iter()
        .all(|&(o, l)| p_own.iter().any(|&(po, pl)| o <= po && po + pl <= o + l)));
    // Its writes to its own bytes still go to c; p's bytes have no
    // replica until one is made.
    assert_eq!(change.replicas.len(), 1, "{change:?}");
    assert_eq!(change.replicas[0].data_addr, "c:2");
    let c_ranges: u64 = change.replicas[0].ranges.iter().map(|r| r.len).sum();
    assert_eq!(c_ranges, sum(&x_own));
    // The copy made again is of p's bytes only, on the one node that
    // holds none of the allocation (p, empty since it restarted), and x
    // keeps c for its own.
    m.refill().await;
    let told = link.copies_set.lock().unwrap().clone();
    let (addr, refill) = told.last().unwrap();
    assert_eq!(*addr, format!("{x}:1"));
    assert_eq!(refill.fill, [format!("{p}:2")], "{refill:?}");
    let by_addr = |addr: &str| {
        refill
            .replicas
            .iter()
            .find(|r| r.data_addr == addr)
            .map(|r| r.ranges.iter().map(|g| g.len).sum::<u64>())
    };
    assert_eq!(by_addr("c:2"), Some(c_ranges));
    assert_eq!(by_addr(&format!("{p}:2")), Some(20_000 - c_ranges));
    let seen = m.allocation(&by_id(a.id)).unwrap();
    assert_eq!(seen.health, Health::Healthy, "{:?}", seen.health_notes);
    assert_eq!(seen.copy_extents(1).map(|e| e.len).sum::<u64>(), 20_000);
}
