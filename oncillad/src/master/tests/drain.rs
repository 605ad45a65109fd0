//! Draining a node against the fake agent link: nothing new is placed on
//! it, a single-copy allocation and a replicated one each move off it
//! (fill first, then the drained node lets go, then the record and the
//! primaries change), and a move that fails leaves the record as it was.

use oncilla_model::cluster::Release;

use super::*;

/// Moves until nothing is left to try (bounded).
async fn drain_all(m: &Master<FakeLink>) {
    for _ in 0..16 {
        if !m.move_one().await {
            return;
        }
    }
    panic!("moves never ended");
}

fn left(m: &Master<FakeLink>, node: &str) -> Option<u64> {
    m.nodes()
        .into_iter()
        .find(|n| n.info.name == node)
        .and_then(|n| n.drain)
        .map(|d| d.left)
}

#[tokio::test]
async fn a_drained_node_takes_nothing_new_and_its_allocations_move() {
    let link = FakeLink::default();
    let m = master(link.clone()).await;
    m.register(join("c", 1 << 20)).await.unwrap();
    let single = m.allocate(remote(10_000, &["a"], None)).await.unwrap();
    let mut req = remote(10_000, &["a"], None);
    req.spec.placement.replicas = 2;
    let twice = m.allocate(req).await.unwrap();
    let replica = twice.replicas[0].node.clone();

    let shown = m.drain("a", true).unwrap();
    assert_eq!(shown.drain.map(|d| d.left), Some(2));
    // Named placement on it is refused, saying why; any other goes
    // elsewhere.
    let err = m.allocate(remote(4096, &["a"], None)).await.unwrap_err();
    assert!(matches!(err, CoreError::NodeDraining(_)), "{err}");
    for _ in 0..4 {
        let other = m.allocate(remote(4096, &[], None)).await.unwrap();
        assert!(!other.held_on("a"), "{other:?}");
        m.free(&by_id(other.id), "", None, false).await.unwrap();
    }

    let released = link.released.load(Ordering::SeqCst);
    drain_all(&m).await;
    assert_eq!(left(&m, "a"), Some(0), "the node holds nothing now");
    assert_eq!(
        link.released.load(Ordering::SeqCst),
        released + 2,
        "a let go of both"
    );

    let moved = m.allocation(&by_id(single.id)).unwrap();
    assert!(!moved.held_on("a"), "{moved:?}");
    assert_eq!(moved.extents.iter().map(|e| e.len).sum::<u64>(), 10_000);
    assert!(moved.extents.iter().all(|e| e.copy == 0));
    assert_eq!(moved.health, Health::Healthy);

    let moved2 = m.allocation(&by_id(twice.id)).unwrap();
    assert!(!moved2.held_on("a"), "{moved2:?}");
    assert_eq!(moved2.health, Health::Healthy, "{:?}", moved2.health_notes);
    let primary = &moved2.extents[0].node;
    assert_ne!(primary, &replica, "the new node is the primary");
    assert!(moved2.replicas.iter().all(|e| e.node == replica));

    // What the agents were told, in order: a filled each new copy; then
    // each new node was promoted (its replicas: the other copy's, or none).
    let told = link.copies_set.lock().unwrap().clone();
    let fills: Vec<&SetCopies> = told
        .iter()
        .filter(|(addr, c)| addr == "a:1" && !c.fill.is_empty())
        .map(|(_, c)| c)
        .collect();
    assert_eq!(fills.len(), 2, "{told:?}");
    let promoted: Vec<&(String, SetCopies)> =
        told.iter().filter(|(_, c)| !c.promote.is_empty()).collect();
    assert_eq!(promoted.len(), 2, "{told:?}");
    let to_primary = promoted
        .iter()
        .find(|(addr, c)| *addr == format!("{primary}:1") && c.alloc_id == twice.id)
        .expect("the replicated allocation's new primary is promoted");
    let addrs: Vec<&str> = to_primary
        .1
        .replicas
        .iter()
        .map(|r| r.data_addr.as_str())
        .collect();
    assert_eq!(addrs, [format!("{replica}:2")]);

    // Its room moved with it.
    let used = |n: &str| {
        m.nodes()
            .into_iter()
            .find(|s| s.info.name == n)
            .unwrap()
            .used
    };
    assert_eq!(used("a"), 0);

    let back = m.drain("a", false).unwrap();
    assert!(back.drain.is_none());
    let again = m.allocate(remote(4096, &["a"], None)).await.unwrap();
    assert!(again.held_on("a"));
}

#[tokio::test]
async fn a_move_that_cannot_reserve_leaves_the_record_and_says_why() {
    let link = FakeLink {
        fail_on: Some("b:1"),
        ..FakeLink::default()
    };
    let m = master(link.clone()).await;
    let single = m.allocate(remote(10_000, &["a"], None)).await.unwrap();
    m.drain("a", true).unwrap();
    let released = link.released.load(Ordering::SeqCst);
    assert!(m.move_one().await, "one move is tried");
    // b refused: a still holds it, nothing was asked of a, and the
    // reason is shown.
    assert_eq!(
        m.allocation(&by_id(single.id)).unwrap().extents,
        single.extents
    );
    let shown = m.nodes().into_iter().find(|n| n.info.name == "a").unwrap();
    let drain = shown.drain.expect("draining");
    assert_eq!(drain.left, 1);
    assert!(drain.note.contains("could not reserve"), "{}", drain.note);
    assert!(link
        .copies_set
        .lock()
        .unwrap()
        .iter()
        .all(|(_, c)| c.fill.is_empty()));
    // The new copy's reservation is released; the drained node's is not.
    assert_eq!(link.released.load(Ordering::SeqCst), released + 1);
    // Paused: not tried again at once.
    assert!(!m.move_one().await);
    // With no other node to go to (b holds the other copy of a's bytes),
    // it waits and says so.
    let lone = master(FakeLink::default()).await;
    let mut twice = remote(10_000, &["a"], None);
    twice.spec.placement.replicas = 2;
    let a = lone.allocate(twice).await.unwrap();
    lone.drain("a", true).unwrap();
    assert!(!lone.move_one().await);
    assert!(lone.allocation(&by_id(a.id)).unwrap().held_on("a"));
    let note = lone
        .nodes()
        .into_iter()
        .find(|n| n.info.name == "a")
        .and_then(|n| n.drain)
        .map(|d| d.note)
        .unwrap_or_default();
    assert!(note.contains("no node that holds none"), "{note}");
}

#[tokio::test]
async fn draining_an_unknown_node_is_refused() {
    let m = master(FakeLink::default()).await;
    let err = m.drain("zz", true).unwrap_err();
    assert!(matches!(err, CoreError::UnknownNode { .. }), "{err}");
}

#[tokio::test]
async fn a_drain_outlasts_the_nodes_restart_and_the_masters() {
    let m = master(FakeLink::default()).await;
    m.drain("a", true).unwrap();
    // The agent hears it with its heartbeats...
    assert!(m.heartbeat(beat("a", Vec::new(), &[])).await.draining);
    assert!(!m.heartbeat(beat("b", Vec::new(), &[])).await.draining);
    // ...a restart of its own keeps it...
    let mut again = join("a", 1 << 20);
    again.incarnation = 2;
    m.register(again).await.unwrap();
    assert!(m
        .nodes()
        .iter()
        .any(|n| n.info.name == "a" && n.drain.is_some()));
    // ...and a new master learns it from the agent's registration.
    let fresh = bare(
        FakeLink::default(),
        Liveness::from_heartbeat(Duration::from_secs(60)),
    );
    let mut drained = join("a", 1 << 20);
    drained.draining = true;
    fresh.register(drained).await.unwrap();
    fresh.register(join("b", 1 << 20)).await.unwrap();
    let err = fresh
        .allocate(remote(4096, &["a"], None))
        .await
        .unwrap_err();
    assert!(matches!(err, CoreError::NodeDraining(_)), "{err}");
    fresh.drain("a", false).unwrap();
    assert!(!fresh.heartbeat(beat("a", Vec::new(), &[])).await.draining);
}

#[tokio::test]
async fn a_drained_node_that_does_not_confirm_it_let_go_is_switched_all_the_same() {
    // The new copy has every acknowledged write (and is the primary) by
    // the time the drained node is asked to let go: a lost answer must not
    // throw it away.
    let link = FakeLink {
        release_fails_on: Some("a:1"),
        ..FakeLink::default()
    };
    let m = master(link.clone()).await;
    let single = m.allocate(remote(10_000, &["a"], None)).await.unwrap();
    m.drain("a", true).unwrap();
    drain_all(&m).await;
    let moved = m.allocation(&by_id(single.id)).unwrap();
    assert!(moved.extents.iter().all(|e| e.node == "b"), "{moved:?}");
    assert_eq!(left(&m, "a"), Some(0));
    // b took over before a was asked to let go.
    let told = link.copies_set.lock().unwrap().clone();
    let promoted: Vec<&String> = told
        .iter()
        .filter(|(_, c)| !c.promote.is_empty())
        .map(|(addr, _)| addr)
        .collect();
    assert_eq!(promoted, ["b:1"], "{told:?}");
    // a still holds it as far as it knows: its next heartbeat is told to
    // release it (no record lists it there).
    let reply = m.heartbeat(beat("a", vec![single.id], &[])).await;
    assert_eq!(reply.release, [single.id]);
    assert!(m
        .heartbeat(beat("b", vec![single.id], &[]))
        .await
        .release
        .is_empty());
}

#[tokio::test]
async fn a_refused_move_changes_nothing_and_is_shown() {
    let link = FakeLink {
        cannot_move_on: Some("a:1"),
        ..FakeLink::default()
    };
    let m = master(link.clone()).await;
    let single = m.allocate(remote(10_000, &["a"], None)).await.unwrap();
    m.drain("a", true).unwrap();
    assert!(m.move_one().await);
    let seen = m.allocation(&by_id(single.id)).unwrap();
    assert_eq!(seen.extents, single.extents, "not even its fabric");
    assert!(!seen.moving);
    let note = m
        .nodes()
        .into_iter()
        .find(|n| n.info.name == "a")
        .and_then(|n| n.drain)
        .map(|d| d.note)
        .unwrap_or_default();
    assert!(note.contains("mapped by a process"), "{note}");
    // The room held on b went back.
    let b = m.nodes().into_iter().find(|n| n.info.name == "b").unwrap();
    assert_eq!(b.used, 0);
}

#[tokio::test]
async fn a_restarted_master_releases_a_copy_a_move_left_unfinished() {
    // Node b reports the replica a move was filling when the master
    // stopped (copy 1 of an allocation with one copy); node a still holds
    // the allocation. The new master keeps a's and has b give its back
    // (at the next tick, after a is told to stop copying to it), whichever
    // registers first.
    let link = FakeLink::default();
    let m = bare(
        link.clone(),
        Liveness::from_heartbeat(Duration::from_secs(60)),
    );
    let mut rec = Allocation::new(MAX_ID / 2, 10_000, Kind::RemoteHost);
    rec.access_key = vec![7; KEY_LEN];
    let extent = |node: &str, copy: u32| extent(node, 0, 10_000, copy);
    let mut on_b = rec.clone();
    on_b.replicas = vec![extent("b", 1)];
    let mut on_a = rec.clone();
    on_a.extents = vec![extent("a", 0)];
    let mut b = join("b", 1 << 20);
    b.master_incarnation = 9;
    b.held = vec![on_b];
    let mut a = join("a", 1 << 20);
    a.master_incarnation = 9;
    a.held = vec![on_a.clone()];
    assert!(m.register(b).await.unwrap().release.is_empty());
    assert!(m.register(a).await.unwrap().release.is_empty());
    let seen = m.allocation(&by_id(rec.id)).unwrap();
    assert_eq!(seen.extents.len(), 1);
    assert_eq!(seen.extents[0].node, "a");
    assert!(seen.replicas.is_empty());
    m.tick().await;
    let told = link.copies_set.lock().unwrap().clone();
    assert!(
        told.iter()
            .any(|(to, c)| to == "a:1" && c.alloc_id == rec.id && c.replicas.is_empty()),
        "{told:?}"
    );
    assert_eq!(
        link.releases.lock().unwrap().clone(),
        [("b:1".to_string(), Release::part(rec.id, &[(0, 10_000)]))]
    );

    // Both report the bytes as their primary (the move's new node took
    // over as the master stopped): the first stays, the second goes.
    let m = bare(
        FakeLink::default(),
        Liveness::from_heartbeat(Duration::from_secs(60)),
    );
    let mut c = join("c", 1 << 20);
    c.master_incarnation = 9;
    let mut on_c = rec.clone();
    on_c.extents = vec![extent("c", 0)];
    c.held = vec![on_c];
    let mut a = join("a", 1 << 20);
    a.master_incarnation = 9;
    a.held = vec![on_a];
    assert!(m.register(c).await.unwrap().release.is_empty());
    assert_eq!(m.register(a).await.unwrap().release, [rec.id]);
    let seen = m.allocation(&by_id(rec.id)).unwrap();
    assert_eq!(seen.extents.len(), 1);
    assert_eq!(seen.extents[0].node, "c");
}

#[tokio::test]
async fn a_drained_node_with_two_copies_of_one_primary_moves_both_and_the_primary_keeps_both() {
    // p holds its own bytes X = [0, 5000) and bytes it took over, Y =
    // [5000, 10000), as primary; d holds copy 1 of X and copy 2 of Y
    // (both from p), e copy 2 of X, f copy 1 of Y; t1 and t2 hold none.
    let link = FakeLink::default();
    let m = bare(
        link.clone(),
        Liveness::from_heartbeat(Duration::from_secs(60)),
    );
    let mut rec = Allocation::new(MAX_ID / 2, 10_000, Kind::RemoteHost);
    rec.access_key = vec![7; KEY_LEN];
    rec.placement.replicas = 3;
    let extent = |node: &str, alloc_offset: u64, copy: u32| extent(node, alloc_offset, 5000, copy);
    let part = |extents: Vec<oncilla_model::alloc::Extent>| {
        let mut r = rec.clone();
        let (primary, replicas) = extents.into_iter().partition(|e| e.copy == 0);
        r.extents = primary;
        r.replicas = replicas;
        r
    };
    let held = [
        ("p", vec![extent("p", 0, 0), extent("p", 5000, 0)]),
        ("d", vec![extent("d", 0, 1), extent("d", 5000, 2)]),
        ("e", vec![extent("e", 0, 2)]),
        ("f", vec![extent("f", 5000, 1)]),
    ];
    for (node, extents) in held {
        let mut r = join(node, 1 << 20);
        r.master_incarnation = 9;
        r.held = vec![part(extents)];
        m.register(r).await.unwrap();
    }
    for node in ["t1", "t2"] {
        m.register(join(node, 1 << 20)).await.unwrap();
    }
    let seen = m.allocation(&by_id(rec.id)).unwrap();
    assert_eq!(seen.health, Health::Healthy, "{:?}", seen.health_notes);

    m.drain("d", true).unwrap();
    drain_all(&m).await;
    let moved = m.allocation(&by_id(rec.id)).unwrap();
    assert!(!moved.held_on("d"), "{moved:?}");
    let on = |copy: u32, offset: u64| {
        moved
            .copy_extents(copy)
            .find(|e| e.alloc_offset == offset)
            .map(|e| e.node.clone())
            .unwrap()
    };
    let (x1, y2) = (on(1, 0), on(2, 5000));
    assert!(
        x1.starts_with('t') && y2.starts_with('t') && x1 != y2,
        "{moved:?}"
    );
    // Every change p was told while the two copies filled named both new
    // nodes once both were asked for: the second never dropped the first.
    let told = link.copies_set.lock().unwrap().clone();
    let to_p: Vec<&SetCopies> = told
        .iter()
        .filter(|(addr, _)| addr == "p:1")
        .map(|(_, c)| c)
        .collect();
    let fills: Vec<&&SetCopies> = to_p.iter().filter(|c| !c.fill.is_empty()).collect();
    assert_eq!(fills.len(), 2, "{to_p:?}");
    for c in fills {
        for t in [&x1, &y2] {
            assert!(
                c.replicas.iter().any(|r| r.data_addr == format!("{t}:2")),
                "a fill's change leaves out {t}: {c:?}"
            );
        }
    }
    let last = to_p.last().unwrap();
    let addrs: Vec<&str> = last.replicas.iter().map(|r| r.data_addr.as_str()).collect();
    assert!(
        addrs.contains(&format!("{x1}:2").as_str()) && addrs.contains(&format!("{y2}:2").as_str()),
        "{last:?}"
    );
}
