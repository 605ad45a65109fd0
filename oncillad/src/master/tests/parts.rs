//! A registration in several parts (an agent holding more than one
//! message carries): every part's records are taken and counted as it
//! comes, and the node's accounting is recounted and its sessions' ends
//! judged at the last part only, so a million held costs one pass over the
//! table, not one per part.

use super::*;

#[tokio::test]
async fn a_registration_in_parts_settles_the_node_at_the_last_part() {
    let old = master(FakeLink::default()).await;
    let live = session("b-live", "b", 0);
    let dead = session("b-dead", "b", 1);
    let kept = old
        .allocate(remote(4096, &["b"], Some(live.clone())))
        .await
        .unwrap();
    let orphan = old
        .allocate(remote(4096, &["b"], Some(dead.clone())))
        .await
        .unwrap();
    let before = old.allocations();

    let m = bare(
        FakeLink::default(),
        Liveness::from_heartbeat(Duration::from_secs(60)),
    );
    let sessions = vec![SessionReport {
        who: live.clone(),
        attached: vec![],
    }];
    let whole = report("b", &before, sessions, 2);
    let mut first = whole.clone();
    first.held.truncate(1);
    first.more = true;
    let mut last = whole.clone();
    last.held.drain(..1);
    m.register(first).await.unwrap();
    // Taken and counted at once (placement must not see b emptier than
    // it is while the rest comes), but not settled: no session judged.
    let ids: Vec<u64> = m.allocations().iter().map(|a| a.id).collect();
    assert_eq!(ids, [kept.id]);
    let used_b = |m: &Master<FakeLink>| {
        m.nodes()
            .iter()
            .find(|n| n.info.name == "b")
            .map(|n| n.used)
    };
    assert_eq!(used_b(&m), Some(4096));
    let settled = m.register(last).await.unwrap();
    assert_eq!(
        settled.release,
        [orphan.id],
        "the dead session's is released"
    );
    let ids: Vec<u64> = m.allocations().iter().map(|a| a.id).collect();
    assert_eq!(ids, [kept.id]);
    assert_eq!(used_b(&m), Some(4096), "b counts what it holds");
}
