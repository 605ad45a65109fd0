//! The master core against a fake agent link: allocation and its
//! accounting, rollback, sessions, attachments, liveness and recovery.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use oncilla_model::alloc::{
    AllocRef, AllocSpec, Allocation, Health, Invalid, NodeShare, Owner, Placement, KEY_LEN, MAX_ID,
};
use oncilla_model::cluster::{
    AllocateRequest, Heartbeat, Range, Registration, SessionReport, SetCopies,
};
use oncilla_model::node::{GpuDevice, NodeInfo, NodeState};
use oncilla_model::{Fabric, Kind};

use super::{Liveness, Master};
use crate::error::CoreError;
use fake_link::FakeLink;

mod batch;
mod beside;
mod copies;
mod drain;
mod fake_link;
mod leave;
mod parts;
mod unconfirmed;
mod users;

/// `len` bytes at `alloc_offset` of copy `copy` on `node` (its agent at
/// `node:1`, its data port at `node:2`), over TCP.
pub(super) fn extent(
    node: &str,
    alloc_offset: u64,
    len: u64,
    copy: u32,
) -> oncilla_model::alloc::Extent {
    oncilla_model::alloc::Extent {
        node: node.into(),
        alloc_offset,
        len,
        pool_offset: 0,
        data_addr: format!("{node}:2"),
        fabric: Fabric::Tcp,
        agent_addr: format!("{node}:1"),
        gpu: None,
        rdma: Vec::new(),
        copy,
        filling: false,
    }
}

fn node(name: &str, cap: u64) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        agent_addr: format!("{name}:1"),
        data_addr: format!("{name}:2"),
        capacity: cap,
        ..Default::default()
    }
}

fn owner(s: &str) -> Option<Owner> {
    Some(Owner {
        session_id: s.into(),
        ..Default::default()
    })
}

/// A master that serves at once (no recovery window).
fn bare(link: FakeLink, liveness: Liveness) -> Master<FakeLink> {
    let mut m = Master::new(link, liveness);
    m.recovery = Duration::ZERO;
    m
}

fn join(name: &str, cap: u64) -> Registration {
    Registration {
        node: node(name, cap),
        incarnation: 1,
        ..Default::default()
    }
}

async fn master(link: FakeLink) -> Master<FakeLink> {
    let m = bare(link, Liveness::from_heartbeat(Duration::from_secs(60)));
    m.register(join("a", 1 << 20)).await.unwrap();
    m.register(join("b", 1 << 20)).await.unwrap();
    m
}

fn spec(size: u64, nodes: &[&str]) -> AllocSpec {
    let placement = Placement {
        nodes: nodes
            .iter()
            .map(|s| NodeShare {
                node: s.to_string(),
                weight: 1,
            })
            .collect(),
        ..Placement::default()
    };
    AllocSpec::new(
        size,
        Kind::RemoteHost,
        placement,
        String::new(),
        false,
        Fabric::Auto,
    )
    .unwrap()
}

fn remote(size: u64, nodes: &[&str], requester: Option<Owner>) -> AllocateRequest {
    AllocateRequest {
        spec: spec(size, nodes),
        origin_node: String::new(),
        requester,
    }
}

fn by_id(id: u64) -> AllocRef {
    AllocRef::Id(id)
}

fn by_name(name: &str) -> AllocRef {
    AllocRef::Name(name.into())
}

#[tokio::test]
async fn allocate_free_accounting() {
    let m = master(FakeLink::default()).await;
    let a = m.allocate(remote(10_000, &["a", "b"], None)).await.unwrap();
    // Two nodes (a takes whole pages), each answering with pieces, in
    // allocation order.
    let tiles: Vec<(u64, u64)> = a.extents.iter().map(|e| (e.alloc_offset, e.len)).collect();
    assert_eq!(tiles, [(0, 4096), (4096, 4096), (8192, 1808)]);
    assert_eq!(a.access_key.len(), KEY_LEN);
    let used: u64 = m.nodes().iter().map(|n| n.used).sum();
    assert_eq!(used, 8192 + 4096);
    m.free(&by_id(a.id), "", None, false).await.unwrap();
    assert!(m.nodes().iter().all(|n| n.used == 0));
    assert!(matches!(
        m.free(&by_id(a.id), "", None, false).await,
        Err(CoreError::NoSuchAllocation(_))
    ));
}

#[tokio::test]
async fn striped_footprint_is_counted_once_per_node() {
    let m = master(FakeLink::default()).await;
    let mut s = spec(5 * 4096 + 10, &["a", "b"]);
    s.placement.stripe = 4096;
    let req = AllocateRequest {
        spec: s,
        origin_node: String::new(),
        requester: None,
    };
    let a = m.allocate(req).await.unwrap();
    assert_eq!(a.extents.len(), 6);
    let nodes: Vec<&str> = a.extents.iter().map(|e| e.node.as_str()).collect();
    assert_eq!(nodes, ["a", "b", "a", "b", "a", "b"]);
    // a: 3 pages; b: 2 pages + 10 bytes -> 3 pages.
    assert_eq!(m.nodes().iter().map(|n| n.used).sum::<u64>(), 6 * 4096);
    m.free(&by_id(a.id), "", None, false).await.unwrap();
    assert!(m.nodes().iter().all(|n| n.used == 0));
}

#[tokio::test]
async fn failed_reserve_rolls_back() {
    let link = FakeLink {
        fail_on: Some("b:1"),
        ..FakeLink::default()
    };
    let m = master(link.clone()).await;
    let err = m
        .allocate(remote(10_000, &["a", "b"], None))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("agent b failed"), "{err}");
    // Both released: a failed reserve may have happened (a timeout).
    assert_eq!(link.released.load(Ordering::SeqCst), 2);
    assert!(m.allocations().is_empty());
    assert!(m.nodes().iter().all(|n| n.used == 0));
}

/// Device memory is counted per GPU, never against the host pool, and
/// a reservation still in flight already takes its room.
#[tokio::test]
async fn gpu_memory_is_counted_per_device_including_reservations_in_flight() {
    let m = master(FakeLink::default()).await;
    let mut g = join("g", 1 << 20);
    {
        g.node.gpu_devices = vec![GpuDevice {
            index: 0,
            name: "test GPU".into(),
            total: 1 << 20,
            free: 1 << 20,
        }];
    }
    m.register(g).await.unwrap();
    let gpu = |size: u64| {
        let mut s = spec(size, &[]);
        s.kind = Kind::RemoteGpu;
        AllocateRequest {
            spec: s,
            origin_node: String::new(),
            requester: None,
        }
    };
    // Two at once: the second sees the first's reservation.
    let (first, second) = tokio::join!(m.allocate(gpu(600 << 10)), m.allocate(gpu(600 << 10)));
    let first = first.unwrap();
    let err = second.unwrap_err();
    assert!(err.to_string().contains("g GPU 0"), "{err}");
    assert!(first
        .extents
        .iter()
        .all(|e| e.node == "g" && e.gpu == Some(0)));
    assert!(
        m.nodes().iter().all(|n| n.used == 0),
        "GPU bytes are not host pool bytes"
    );
    m.free(&by_id(first.id), "", None, false).await.unwrap();
    m.allocate(gpu(600 << 10)).await.unwrap();
    let err = m.allocate(gpu(600 << 10)).await.unwrap_err();
    assert!(matches!(err, CoreError::CapacityExhausted { .. }), "{err}");
}

#[tokio::test]
async fn sessions_own_their_allocations() {
    let m = master(FakeLink::default()).await;
    let mine = m.allocate(remote(100, &[], owner("s1"))).await.unwrap();
    let _other = m.allocate(remote(100, &[], owner("s2"))).await.unwrap();
    let persistent = m.allocate(remote(100, &[], None)).await.unwrap();
    let refused = m
        .free(&by_id(mine.id), "s2", None, false)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, CoreError::PermissionDenied(_)),
        "{refused}"
    );
    assert!(
        !refused.to_string().contains("s1"),
        "the owner's session id is not told: {refused}"
    );
    assert_eq!(m.end_session("s1").await, 1);
    let left: Vec<u64> = m.allocations().iter().map(|a| a.id).collect();
    assert_eq!(left.len(), 2);
    assert!(left.contains(&persistent.id));
}

#[tokio::test]
async fn frees_and_ended_sessions_keep_owners_and_attachments_exact() {
    let m = master(FakeLink::default()).await;
    let freed = m.allocate(remote(100, &[], owner("s1"))).await.unwrap();
    let kept = m.allocate(remote(100, &[], owner("s1"))).await.unwrap();
    let (p, q) = (
        m.allocate(remote(100, &[], None)).await.unwrap(),
        m.allocate(remote(100, &[], None)).await.unwrap(),
    );
    for (id, s) in [(p.id, "s2"), (q.id, "s2"), (p.id, "s3")] {
        m.attach(&by_id(id), owner(s).unwrap()).unwrap();
    }
    let attached = |id| -> Vec<String> {
        let a = m.allocation(&by_id(id)).unwrap();
        a.attached.iter().map(|o| o.session_id.clone()).collect()
    };
    assert_eq!(attached(p.id), ["s2", "s3"]);
    m.free(&by_id(freed.id), "s1", None, false).await.unwrap();
    // s2 ends: both its attachments go, s3's stays.
    assert_eq!(m.end_session("s2").await, 0);
    assert_eq!(attached(p.id), ["s3"]);
    assert!(attached(q.id).is_empty());
    // A forced free takes s3 off; its end then frees nothing.
    m.free(&by_id(p.id), "", None, true).await.unwrap();
    assert_eq!(m.end_session("s3").await, 0);
    // s1 owns only what it did not free.
    assert_eq!(m.end_session("s1").await, 1);
    assert!(m.allocation(&by_id(kept.id)).is_err());
    assert_eq!(m.end_session("s1").await, 0);
    assert_eq!(m.allocations().len(), 1);
}

#[tokio::test]
async fn named_allocations_attach_and_refuse_free_while_attached() {
    let m = master(FakeLink::default()).await;
    let mut s = spec(100, &[]);
    s.name = "table".into();
    let req = AllocateRequest {
        spec: s.clone(),
        origin_node: "a".into(),
        requester: owner("s1"),
    };
    let a = m.allocate(req.clone()).await.unwrap();
    assert!(a.owner.is_none(), "named allocations are persistent");
    assert_eq!(a.attached.len(), 1);
    assert!(matches!(
        m.allocate(req).await,
        Err(CoreError::NameTaken(_, id)) if id == a.id
    ));
    let who = owner("s2").unwrap();
    let b = m.attach(&by_name("table"), who).unwrap();
    assert_eq!(b.id, a.id);
    assert_eq!(b.attached.len(), 2);
    // s1 cannot free it while s2 is attached; force can.
    let err = m
        .free(&by_name("table"), "s1", None, false)
        .await
        .unwrap_err();
    assert!(matches!(err, CoreError::InUse { .. }), "{err}");
    m.detach(a.id, "s2").unwrap();
    assert_eq!(
        m.end_session("s1").await,
        0,
        "the creator leaving frees nothing"
    );
    assert!(m.allocation(&by_name("table")).unwrap().attached.is_empty());
    m.attach(&by_id(a.id), owner("s3").unwrap()).unwrap();
    m.free(&by_name("table"), "", None, true).await.unwrap();
    assert!(matches!(
        m.allocation(&by_name("table")),
        Err(CoreError::NoSuchName(_))
    ));
    // The name is free again.
    s.name = "table".into();
    let again = AllocateRequest {
        spec: s.clone(),
        origin_node: String::new(),
        requester: None,
    };
    assert!(m.allocate(again).await.is_ok());
    // A bad name never reaches the master: the request cannot be built.
    let bad = AllocSpec::new(
        s.size,
        s.kind,
        s.placement.clone(),
        "9lives".into(),
        false,
        Fabric::Auto,
    );
    assert!(matches!(bad, Err(Invalid::Name(_))));
}

#[tokio::test]
async fn session_allocations_cannot_be_attached() {
    let m = master(FakeLink::default()).await;
    let mine = m.allocate(remote(100, &[], owner("s1"))).await.unwrap();
    let err = m.attach(&by_id(mine.id), owner("s2").unwrap()).unwrap_err();
    assert!(err.to_string().contains("only persistent"), "{err}");
}

#[tokio::test]
async fn lookup_answers_only_sessions_that_hold_the_allocation() {
    let m = master(FakeLink::default()).await;
    let mine = m.allocate(remote(100, &[], owner("s1"))).await.unwrap();
    let s1 = owner("s1").unwrap();
    let s2 = owner("s2").unwrap();
    assert_eq!(m.lookup(mine.id, &s1).unwrap().id, mine.id);
    let err = m.lookup(mine.id, &s2).unwrap_err();
    assert!(matches!(err, CoreError::PermissionDenied(_)), "{err}");
    // A persistent allocation: its maker (attached at creation) and any
    // session attached to it, no other; and not after detaching.
    let mut named = spec(100, &[]);
    named.name = "shared-table".into();
    let table = m
        .allocate(AllocateRequest {
            spec: named,
            origin_node: "a".into(),
            requester: owner("s1"),
        })
        .await
        .unwrap();
    assert!(m.lookup(table.id, &s1).is_ok());
    assert!(m.lookup(table.id, &s2).is_err());
    m.attach(&by_id(table.id), s2.clone()).unwrap();
    assert_eq!(m.lookup(table.id, &s2).unwrap().id, table.id);
    m.detach(table.id, "s2").unwrap();
    assert!(m.lookup(table.id, &s2).is_err());
    m.free(&by_id(mine.id), "s1", None, false).await.unwrap();
    let err = m.lookup(mine.id, &s1).unwrap_err();
    assert!(matches!(err, CoreError::NoSuchAllocation(_)), "{err}");
}

#[tokio::test]
async fn shm_preference_is_refused_for_other_nodes() {
    let m = master(FakeLink::default()).await;
    let mut s = spec(100, &["b"]);
    s.fabric = Fabric::Shm;
    let req = AllocateRequest {
        spec: s,
        origin_node: "a".into(),
        requester: owner("s1"),
    };
    let err = m.allocate(req).await.unwrap_err();
    assert!(err.to_string().contains("fabric shm reaches only"), "{err}");
    let mut s = spec(100, &["a"]);
    s.fabric = Fabric::Auto;
    let req = AllocateRequest {
        spec: s,
        origin_node: "a".into(),
        requester: owner("s1"),
    };
    let a = m.allocate(req).await.unwrap();
    assert_eq!(a.extents[0].fabric, Fabric::Shm);
}

fn beat(name: &str, held: Vec<u64>, ended: &[&str]) -> Heartbeat {
    Heartbeat {
        name: name.into(),
        incarnation: 1,
        held,
        ended_sessions: ended.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn silent_nodes_go_down_and_their_allocations_degrade() {
    // Thresholds far above a stall of a loaded machine between two lines,
    // sleeps well past them.
    let l = Liveness {
        heartbeat: Duration::from_millis(10),
        suspect_after: Duration::from_millis(200),
        down_after: Duration::from_millis(400),
    };
    let m = bare(FakeLink::default(), l);
    m.register(join("a", 1 << 20)).await.unwrap();
    let a = m.allocate(remote(10, &["a"], None)).await.unwrap();
    assert_eq!(a.health, Health::Healthy);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(m.nodes()[0].state, NodeState::Down);
    let seen = m.allocation(&by_id(a.id)).unwrap();
    assert_eq!(seen.health, Health::Degraded);
    assert!(
        seen.health_notes[0].starts_with("a down since"),
        "{:?}",
        seen.health_notes
    );
    assert!(m.allocate(remote(1, &[], None)).await.is_err());
    // A request the node made itself counts as hearing from it; one from
    // another start of it does not.
    m.heard_from("a", 2);
    assert_eq!(m.nodes()[0].state, NodeState::Down);
    m.heard_from("a", 1);
    assert_eq!(m.nodes()[0].state, NodeState::Up);
    // Heard again through a session's call: its copies may have been
    // dropped while it was down, so its next heartbeat lists everything.
    assert!(m.heartbeat(beat("a", vec![], &[])).await.want_full);
    assert!(!m.heartbeat(beat("a", vec![], &[])).await.want_full);
    std::thread::sleep(Duration::from_millis(600));
    assert!(m.heartbeat(beat("a", vec![a.id], &[])).await.known);
    assert_eq!(m.nodes()[0].state, NodeState::Up);
    assert!(!m.heartbeat(beat("zz", vec![], &[])).await.known);
    let mut other = beat("a", vec![], &[]);
    other.incarnation = 2;
    assert!(
        !m.heartbeat(other).await.known,
        "a restarted agent must register"
    );
}

#[tokio::test]
async fn a_new_master_waits_for_agents_before_changing_the_table() {
    let m = Master::new(
        FakeLink::default(),
        Liveness::from_heartbeat(Duration::from_secs(1)),
    );
    m.register(join("a", 1 << 20)).await.unwrap();
    let err = m.allocate(remote(10, &[], None)).await.unwrap_err();
    assert!(err.to_string().starts_with("master recovering"), "{err}");
    assert!(m.recovering() > Duration::ZERO);
}

#[tokio::test]
async fn heartbeats_free_ended_sessions_and_release_strays() {
    let m = master(FakeLink::default()).await;
    let mine = m.allocate(remote(100, &["a"], owner("s1"))).await.unwrap();
    let kept = m.allocate(remote(100, &["a"], None)).await.unwrap();
    let reply = m
        .heartbeat(beat("a", vec![mine.id, kept.id, 999], &["s1"]))
        .await;
    assert!(reply.known);
    assert_eq!(reply.release, [999]);
    let left: Vec<u64> = m.allocations().iter().map(|a| a.id).collect();
    assert_eq!(left, [kept.id]);
}

/// What agent `node` reports after a master restart: `allocs` as the old
/// master recorded them, cut down to that node's extents.
fn report(
    node_name: &str,
    allocs: &[Allocation],
    sessions: Vec<SessionReport>,
    next_session_seq: u64,
) -> Registration {
    let held = allocs
        .iter()
        .filter(|a| a.extents.iter().any(|e| e.node == node_name))
        .map(|a| {
            let mut r = a.clone();
            r.attached.clear();
            r.extents.retain(|e| e.node == node_name);
            r
        })
        .collect();
    Registration {
        node: node(node_name, 1 << 20),
        incarnation: 1,
        master_incarnation: 77,
        held,
        sessions,
        next_session_seq,
        max_held_id: 0,
        more: false,
        draining: false,
        copies_generation: 0,
    }
}

fn session(id: &str, node: &str, seq: u64) -> Owner {
    Owner {
        session_id: id.into(),
        node: node.into(),
        agent_incarnation: 1,
        session_seq: seq,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_restarted_master_rebuilds_the_table_from_reports() {
    let old = master(FakeLink::default()).await;
    let live = session("a-live", "a", 0);
    let dead = session("a-dead", "a", 1);
    let mut s = spec(10_000, &["a", "b"]);
    s.name = "shared".into();
    let named = old
        .allocate(AllocateRequest {
            spec: s,
            origin_node: "a".into(),
            requester: Some(live.clone()),
        })
        .await
        .unwrap();
    let owned = old
        .allocate(remote(100, &["b"], Some(live.clone())))
        .await
        .unwrap();
    let orphan = old
        .allocate(remote(100, &["b"], Some(dead.clone())))
        .await
        .unwrap();
    let before = old.allocations();

    let m = bare(
        FakeLink::default(),
        Liveness::from_heartbeat(Duration::from_secs(60)),
    );
    // b first: it holds half of `named`, `owned` and the dead session's.
    let b = m.register(report("b", &before, vec![], 0)).await.unwrap();
    assert!(b.release.is_empty());
    let degraded = m.allocation(&by_name("shared")).unwrap();
    assert_eq!(degraded.health, Health::Degraded, "a's half is missing");
    // a reports its live session (attached to `named`); a-dead is gone.
    let sessions = vec![SessionReport {
        who: live.clone(),
        attached: vec![named.id],
    }];
    m.register(report("a", &before, sessions, 2)).await.unwrap();
    let after = m.allocations();
    let ids: Vec<u64> = after.iter().map(|a| a.id).collect();
    assert_eq!(
        ids,
        [named.id, owned.id],
        "the dead session's allocation is freed"
    );
    assert_eq!(after[0], before[0], "rebuilt exactly");
    assert_eq!(after[1], before[1]);
    assert!(after.iter().all(|a| a.health == Health::Healthy));
    assert_eq!(
        m.nodes().iter().map(|n| n.used).sum::<u64>(),
        old.nodes().iter().map(|n| n.used).sum::<u64>() - 4096
    );
    // New ids continue after the adopted ones.
    let next = m.allocate(remote(1, &[], None)).await.unwrap();
    assert!(next.id > orphan.id);
    // Freed while b was away: b's late report is released, not adopted.
    m.free(&by_id(owned.id), "", None, false).await.unwrap();
    let again = m.register(report("b", &before, vec![], 0)).await.unwrap();
    assert!(again.release.contains(&owned.id), "{:?}", again.release);
}

#[tokio::test]
async fn an_agent_that_restarted_loses_its_extents() {
    let m = master(FakeLink::default()).await;
    let a = m.allocate(remote(10_000, &["a", "b"], None)).await.unwrap();
    let mut fresh = join("b", 1 << 20);
    fresh.incarnation = 2;
    m.register(fresh).await.unwrap();
    let seen = m.allocation(&by_id(a.id)).unwrap();
    assert_eq!(seen.health, Health::Lost);
    assert!(
        seen.health_notes[0].starts_with("b restarted"),
        "{:?}",
        seen.health_notes
    );
    let b_used = m.nodes().iter().find(|n| n.info.name == "b").unwrap().used;
    assert_eq!(b_used, 0);
    m.free(&by_id(a.id), "", None, false).await.unwrap();
}

#[tokio::test]
async fn ids_stop_at_the_ceiling_instead_of_wrapping() {
    let m = master(FakeLink::default()).await;
    let first = m.allocate(remote(100, &["a"], None)).await.unwrap();
    // An agent reports an allocation with the highest id there may be
    // (the edge refuses anything above it).
    let mut last = first.clone();
    last.id = MAX_ID;
    last.name.clear();
    let r = report("a", &[last], vec![], 0);
    m.register(r).await.unwrap();
    let err = m.allocate(remote(100, &["a"], None)).await.unwrap_err();
    assert!(
        matches!(err, CoreError::CapacityExhausted { .. }) && err.to_string().contains("ids"),
        "{err}"
    );
    // Nothing was held for the refused allocation: ids already given stay
    // usable and freeable.
    m.free(&by_id(first.id), "", None, false).await.unwrap();
    m.free(&by_id(MAX_ID), "", None, false).await.unwrap();
}

#[tokio::test]
async fn a_live_node_keeps_its_name_and_its_allocations() {
    let link = FakeLink::default();
    let m = master(link.clone()).await;
    let a = m.allocate(remote(10_000, &["a", "b"], None)).await.unwrap();
    // b's agent is alive at its address, with its incarnation.
    link.alive
        .lock()
        .unwrap()
        .insert("b:1".into(), ("b".into(), 1));
    let mut forged = join("b", 1 << 40);
    forged.node.agent_addr = "evil:1".into();
    forged.node.data_addr = "evil:2".into();
    forged.incarnation = 666;
    let err = m.register(forged.clone()).await.unwrap_err();
    assert!(matches!(err, CoreError::PermissionDenied(_)), "{err}");
    assert!(err.to_string().contains("alive"), "{err}");
    let b = m.nodes().into_iter().find(|n| n.info.name == "b").unwrap();
    assert_eq!(
        (b.info.agent_addr.as_str(), b.info.capacity),
        ("b:1", 1 << 20)
    );
    assert_eq!(m.allocation(&by_id(a.id)).unwrap().health, Health::Healthy);

    // Were b's agent silent, a registration under another incarnation
    // takes the name (a restart) and b's extents are lost ...
    link.alive.lock().unwrap().clear();
    m.register(forged).await.unwrap();
    assert_eq!(m.allocation(&by_id(a.id)).unwrap().health, Health::Lost);
    // ... until the agent that really holds them registers again with
    // them: then they are not lost.
    let mut real = report("b", &[m.allocation(&by_id(a.id)).unwrap()], vec![], 0);
    real.master_incarnation = m.incarnation();
    m.register(real).await.unwrap();
    assert_eq!(m.allocation(&by_id(a.id)).unwrap().health, Health::Healthy);
    m.free(&by_id(a.id), "", None, false).await.unwrap();
}

/// An agent registers in parts; ids a part still on its way reports are
/// never handed out meanwhile (that allocation's extents would have been
/// released as "another allocation under a reused id").
#[tokio::test]
async fn ids_of_parts_not_yet_registered_are_never_reused() {
    let m = master(FakeLink::default()).await;
    let mut first_part = join("c", 1 << 20);
    first_part.master_incarnation = 77;
    first_part.max_held_id = 500;
    m.register(first_part).await.unwrap();
    let a = m.allocate(remote(4096, &["a"], None)).await.unwrap();
    assert!(a.id > 500, "id {} reuses one a later part reports", a.id);
}

/// A request that goes away mid-reservation (its future dropped: the
/// client gone, a deadline passed) gives back its name, its room on the
/// nodes and its user's charge, and its id is no longer "reserving" (the
/// agents' heartbeats release what they reserved).
#[tokio::test]
async fn an_allocation_whose_request_goes_away_gives_everything_back() {
    use oncilla_model::quota::{Limits, Quotas};
    let link = FakeLink {
        hang_on: Some("b:1"),
        ..FakeLink::default()
    };
    let m = master(link).await.with_quotas(
        Quotas {
            default: Limits {
                allocations: Some(1),
                ..Limits::NONE
            },
            ..Quotas::default()
        },
        None,
    );
    let named = |nodes: &[&str]| {
        let mut spec = spec(8192, nodes);
        spec.name = "kept".into();
        spec.persistent = true;
        AllocateRequest {
            spec,
            origin_node: String::new(),
            requester: Some(Owner {
                session_id: "s".into(),
                uid: Some(7),
                ..Default::default()
            }),
        }
    };
    let gone = tokio::time::timeout(Duration::from_millis(50), m.allocate(named(&["a", "b"])));
    assert!(gone.await.is_err(), "the reservation on b never answers");
    assert!(m.nodes().iter().all(|n| n.used == 0), "room given back");
    assert!(m.quota_report().users.is_empty(), "charge given back");
    let a = m.allocate(named(&["a"])).await.unwrap();
    assert_eq!(a.name, "kept", "the name is free again");
    let beat = m
        .heartbeat(Heartbeat {
            name: "b".into(),
            incarnation: 1,
            held: vec![a.id - 1],
            ..Default::default()
        })
        .await;
    assert_eq!(beat.release, vec![a.id - 1], "b releases what it reserved");
}
