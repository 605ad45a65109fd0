//! A node leaving: its agent (its own start only) at any time, an operator
//! only once it is down; what was on it is lost, and it is no longer
//! listed.

use super::*;

#[tokio::test]
async fn a_node_leaves_as_itself_or_is_removed_once_down() {
    let m = master(FakeLink::default()).await;
    let on_b = m.allocate(remote(4096, &["b"], None)).await.unwrap();
    // A process on b owns memory on a: it goes with b's sessions.
    let mut from_b = remote(4096, &["a"], Some(session("b-s", "b", 0)));
    from_b.origin_node = "b".into();
    let owned = m.allocate(from_b).await.unwrap();
    let err = m.leave("b", Some(2)).await.unwrap_err();
    assert!(matches!(err, CoreError::PermissionDenied(_)), "{err}");
    let err = m.leave("b", None).await.unwrap_err();
    assert!(matches!(err, CoreError::NodeUp(..)), "{err}");
    assert!(err.to_string().contains("node b is up, not down"), "{err}");
    let err = m.leave("zz", Some(1)).await.unwrap_err();
    assert!(matches!(err, CoreError::UnknownNode { .. }), "{err}");

    assert_eq!(m.leave("b", Some(1)).await.unwrap(), 1);
    let names: Vec<String> = m.nodes().into_iter().map(|n| n.info.name).collect();
    assert_eq!(names, ["a"]);
    assert_eq!(m.allocation(&by_id(on_b.id)).unwrap().health, Health::Lost);
    assert!(
        m.allocation(&by_id(owned.id)).is_err(),
        "what b's session owned on a is freed"
    );
    // Nothing is placed there any more.
    let err = m.allocate(remote(4096, &["b"], None)).await.unwrap_err();
    assert!(matches!(err, CoreError::UnknownNode { .. }), "{err}");
}
