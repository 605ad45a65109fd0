//! A new copy a master was filling when it stopped (against the fake
//! agent link): the next master never takes it as a copy, has its node
//! give it back (keeping the node's other bytes) and tells the primary
//! to stop copying to it, whichever of the two registers first; and a
//! copy the table lists is confirmed whole to its agent.

use oncilla_model::alloc::Extent;
use oncilla_model::cluster::{Listed, Release, ReplicaShare};

use super::*;

const SHARE: u64 = 8192;
const ID: u64 = 5;

/// Allocation `ID` with two copies over `[0, 2 * SHARE)`.
fn twice() -> Allocation {
    let mut a = Allocation::new(ID, 2 * SHARE, Kind::RemoteHost);
    a.access_key = vec![3; KEY_LEN];
    a.placement.replicas = 2;
    a
}

/// `name` registering with what it held under a master that stopped.
fn report(name: &str, extents: Vec<Extent>, replicas: Vec<Extent>) -> Registration {
    let mut held = twice();
    held.extents = extents;
    held.replicas = replicas;
    Registration {
        node: node(name, 1 << 20),
        incarnation: 1,
        master_incarnation: 77,
        held: vec![held],
        ..Default::default()
    }
}

fn filling(e: Extent) -> Extent {
    Extent { filling: true, ..e }
}

/// What `p`'s agent was last told its replicas are.
fn last_told(link: &FakeLink, to: &str) -> Option<Vec<ReplicaShare>> {
    let told = link.copies_set.lock().unwrap();
    told.iter()
        .rev()
        .find(|(addr, c)| addr == to && c.alloc_id == ID)
        .map(|(_, c)| c.replicas.clone())
}

fn bare_master(link: &FakeLink) -> Master<FakeLink> {
    bare(
        link.clone(),
        Liveness::from_heartbeat(Duration::from_secs(60)),
    )
}

#[tokio::test]
async fn a_copy_still_filling_is_not_taken_whichever_node_registers_first() {
    for copy_first in [true, false] {
        let link = FakeLink::default();
        let m = bare_master(&link);
        let copy = report("t", vec![], vec![filling(extent("t", 0, 2 * SHARE, 1))]);
        let primary = report("p", vec![extent("p", 0, 2 * SHARE, 0)], vec![]);
        let (first, second) = if copy_first {
            (copy, primary)
        } else {
            (primary, copy)
        };
        let a = m.register(first).await.unwrap();
        let b = m.register(second).await.unwrap();
        assert!(a.release.is_empty() && b.release.is_empty());
        let seen = m.allocation(&by_id(ID)).unwrap();
        assert!(seen.replicas.is_empty(), "taken as a copy: {seen:?}");
        assert_eq!(seen.extents.len(), 1);
        // Nor does a heartbeat have t release it whole at once: p may
        // still copy every write to it until it is told.
        let beat = Heartbeat {
            name: "t".into(),
            incarnation: 1,
            held: vec![ID],
            ..Default::default()
        };
        assert!(m.heartbeat(beat).await.release.is_empty());
        // At the tick p is told its replicas are none (also when it
        // registered after t), then t gives the copy back.
        m.tick().await;
        assert_eq!(
            last_told(&link, "p:1"),
            Some(Vec::new()),
            "copy first: {copy_first}"
        );
        assert_eq!(
            link.releases.lock().unwrap().clone(),
            [("t:1".to_string(), Release::part(ID, &[(0, 2 * SHARE)]))]
        );
        // The copy is made again, to be filled, and listed once filled.
        m.refill().await;
        let fills = link.fills.lock().unwrap().clone();
        assert_eq!(fills.len(), 1, "{fills:?}");
        assert_eq!(fills[0].0, "t:1");
        let seen = m.allocation(&by_id(ID)).unwrap();
        assert!(seen.replicas.iter().all(|e| e.node == "t" && !e.filling));
        assert_eq!(seen.replicas.iter().map(|e| e.len).sum::<u64>(), 2 * SHARE);
    }
}

#[tokio::test]
async fn a_node_gives_back_only_the_copy_not_confirmed() {
    let link = FakeLink::default();
    let m = bare_master(&link);
    // t holds a whole copy of [SHARE, 2 SHARE) and one of [0, SHARE)
    // still filling.
    let replicas = vec![
        filling(extent("t", 0, SHARE, 1)),
        extent("t", SHARE, SHARE, 1),
    ];
    let answer = m.register(report("t", vec![], replicas)).await.unwrap();
    assert!(answer.release.is_empty(), "t keeps its whole copy");
    m.register(report("p", vec![extent("p", 0, 2 * SHARE, 0)], vec![]))
        .await
        .unwrap();
    let seen = m.allocation(&by_id(ID)).unwrap();
    assert_eq!(
        seen.replicas
            .iter()
            .map(|e| (e.node.as_str(), e.alloc_offset, e.len))
            .collect::<Vec<_>>(),
        [("t", SHARE, SHARE)]
    );
    m.tick().await;
    assert_eq!(
        link.releases.lock().unwrap().clone(),
        [("t:1".to_string(), Release::part(ID, &[(0, SHARE)]))]
    );
    // p copies only the bytes t holds whole to it.
    let told = last_told(&link, "p:1").expect("p told its replicas");
    assert_eq!(told.len(), 1);
    assert_eq!(
        told[0].ranges,
        [Range {
            alloc_offset: SHARE,
            len: SHARE
        }]
    );
}

#[tokio::test]
async fn only_a_copy_the_table_lists_with_nothing_in_flux_is_confirmed_whole() {
    let link = FakeLink {
        release_fails_on: Some("t:1"),
        ..FakeLink::default()
    };
    let m = bare_master(&link);
    let replicas = vec![
        filling(extent("t", 0, SHARE, 1)),
        extent("t", SHARE, SHARE, 1),
    ];
    m.register(report("t", vec![], replicas)).await.unwrap();
    m.register(report("p", vec![extent("p", 0, 2 * SHARE, 0)], vec![]))
        .await
        .unwrap();
    let beat = |name: &str| Heartbeat {
        name: name.into(),
        incarnation: 1,
        filling: vec![ID, ID + 1],
        ..Default::default()
    };
    // t still owes the bytes it was filling: nothing of it is whole.
    m.tick().await;
    assert!(m.heartbeat(beat("t")).await.whole.is_empty());
    // Once given back, what t holds is the listed copy: whole. p holds
    // no copy it was filling, and nobody knows ID + 1.
    let link_ok = FakeLink {
        release_fails_on: None,
        ..link.clone()
    };
    let m = Master { link: link_ok, ..m };
    m.tick().await;
    let listed = |from: u64, len: u64| Listed {
        alloc_id: ID,
        ranges: vec![Range {
            alloc_offset: from,
            len,
        }],
    };
    // Only the bytes the record lists there: t's copy of [SHARE, 2 SHARE),
    // not the one of [0, SHARE) it was filling.
    assert_eq!(m.heartbeat(beat("t")).await.whole, [listed(SHARE, SHARE)]);
    assert_eq!(m.heartbeat(beat("p")).await.whole, [listed(0, 2 * SHARE)]);
}
