//! Batches (`allocate_many`, `free_many`): one call per agent, every
//! allocation whole and distinct, and nothing left behind when any part
//! fails; frees all or none.

use oncilla_model::alloc::MAX_BATCH;
use oncilla_model::cluster::{AllocateBatch, FreeBatch};

use super::*;

fn batch(size: u64, nodes: &[&str], count: u64) -> AllocateBatch {
    AllocateBatch::new(remote(size, nodes, owner("s")), count).unwrap()
}

#[tokio::test]
async fn a_batch_is_reserved_in_one_call_per_agent() {
    let link = FakeLink::default();
    let m = master(link.clone()).await;
    let made = m.allocate_many(batch(4096, &[], 200)).await.unwrap();
    assert_eq!(made.len(), 200);
    // Distinct ids in order, each with its own key, each whole.
    assert!(made.windows(2).all(|w| w[0].id < w[1].id));
    let keys: std::collections::BTreeSet<_> = made.iter().map(|a| a.access_key.clone()).collect();
    assert_eq!(keys.len(), 200);
    for a in &made {
        assert_eq!(a.access_key.len(), KEY_LEN);
        assert_eq!(a.extents.iter().map(|e| e.len).sum::<u64>(), 4096);
        assert_eq!(a.owner.as_ref().map(|o| o.session_id.as_str()), Some("s"));
    }
    // Placed across both nodes as their room changed, one call to each.
    let on_a = made.iter().filter(|a| a.extents[0].node == "a").count();
    assert!(on_a > 0 && on_a < 200, "{on_a} of 200 on a");
    assert_eq!(link.calls.load(Ordering::SeqCst), 2);
    assert_eq!(link.reserved.load(Ordering::SeqCst), 200);
    assert_eq!(m.allocations().len(), 200);
    assert_eq!(m.nodes().iter().map(|n| n.used).sum::<u64>(), 200 * 4096);
    // Each is freed on its own, as any allocation.
    for a in &made {
        m.free(&by_id(a.id), "s", None, false).await.unwrap();
    }
    assert!(m.nodes().iter().all(|n| n.used == 0));
}

#[tokio::test]
async fn a_batch_that_fails_on_one_agent_leaves_nothing() {
    let link = FakeLink {
        fail_on: Some("b:1"),
        ..FakeLink::default()
    };
    let m = master(link.clone()).await;
    let err = m
        .allocate_many(batch(10_000, &["a", "b"], 50))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("agent b failed"), "{err}");
    // Every target of every allocation released, the failed ones too.
    assert_eq!(link.released.load(Ordering::SeqCst), 100);
    assert!(m.allocations().is_empty());
    assert!(m.nodes().iter().all(|n| n.used == 0));
    // The room came back: the same batch fits once the agent answers.
    let m2 = master(FakeLink::default()).await;
    assert_eq!(
        m2.allocate_many(batch(10_000, &["a", "b"], 50))
            .await
            .unwrap()
            .len(),
        50
    );
}

#[tokio::test]
async fn a_batch_past_the_cluster_is_refused_before_any_reservation() {
    let link = FakeLink::default();
    let m = master(link.clone()).await;
    // Two nodes of 1 MiB: 512 pages in all, 3 x 256 asked.
    let err = m
        .allocate_many(batch(3 * 4096, &[], 256))
        .await
        .unwrap_err();
    assert!(matches!(err, CoreError::CapacityExhausted { .. }), "{err}");
    assert_eq!(link.calls.load(Ordering::SeqCst), 0);
    assert!(m.allocations().is_empty());
    assert!(m.nodes().iter().all(|n| n.used == 0));
    // Nothing was held back: the whole cluster is still there to take.
    assert_eq!(
        m.allocate_many(batch(2 * 4096, &[], 256))
            .await
            .unwrap()
            .len(),
        256
    );
}

#[test]
fn a_batch_is_a_sessions_own_and_bounded() {
    let req = || remote(4096, &[], owner("s"));
    assert_eq!(
        AllocateBatch::new(req(), 0).unwrap_err(),
        Invalid::BatchCount(0)
    );
    assert_eq!(
        AllocateBatch::new(req(), u64::from(MAX_BATCH) + 1).unwrap_err(),
        Invalid::BatchCount(u64::from(MAX_BATCH) + 1)
    );
    assert!(AllocateBatch::new(req(), u64::from(MAX_BATCH)).is_ok());
    // Outliving the caller: named, persistent, or an operator's.
    let mut named = req();
    named.spec.name = "n".into();
    assert_eq!(
        AllocateBatch::new(named, 2).unwrap_err(),
        Invalid::BatchPersistent
    );
    assert_eq!(
        AllocateBatch::new(remote(4096, &[], None), 2).unwrap_err(),
        Invalid::BatchPersistent
    );
}

#[tokio::test]
async fn a_batch_is_freed_in_one_call_per_agent_all_or_none() {
    let link = FakeLink::default();
    let m = master(link.clone()).await;
    let made = m.allocate_many(batch(4096, &[], 100)).await.unwrap();
    let theirs = m.allocate(remote(4096, &["a"], owner("t"))).await.unwrap();
    let ids: Vec<u64> = made.iter().map(|a| a.id).collect();
    // Another session's allocation in the batch: nothing is freed.
    let mut with_theirs = ids.clone();
    with_theirs.push(theirs.id);
    let err = m
        .free_many(&FreeBatch::new(with_theirs).unwrap(), "s", None)
        .await
        .unwrap_err();
    assert!(matches!(err, CoreError::PermissionDenied(_)), "{err}");
    assert_eq!(m.allocations().len(), 101);
    assert_eq!(link.release_calls.load(Ordering::SeqCst), 0);
    // Its own: one call to each agent holding some.
    m.free_many(&FreeBatch::new(ids).unwrap(), "s", None)
        .await
        .unwrap();
    assert_eq!(m.allocations().len(), 1);
    assert_eq!(link.released.load(Ordering::SeqCst), 100);
    assert_eq!(link.release_calls.load(Ordering::SeqCst), 2);
    let used: u64 = m.nodes().iter().map(|n| n.used).sum();
    assert_eq!(used, 4096, "only the other session's page is held");
    // A bad batch never reaches the master.
    assert!(FreeBatch::new(Vec::new()).is_err());
    assert!(FreeBatch::new(vec![1; 2]).is_err());
    assert!(FreeBatch::new((1..=u64::from(MAX_BATCH) + 1).collect()).is_err());
    assert!(FreeBatch::new(vec![0]).is_err());
}
