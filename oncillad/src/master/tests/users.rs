//! The master core and its users: who may attach and free what, and the
//! quotas that bound each user (against the fake agent link of the parent).

use super::*;

/// A process of user `uid` in session `s`.
fn user(s: &str, uid: u32) -> Owner {
    Owner {
        session_id: s.into(),
        uid: Some(uid),
        ..Default::default()
    }
}

#[tokio::test]
async fn named_allocations_belong_to_their_user_unless_shared() {
    let m = master(FakeLink::default()).await;
    let named = |name: &str, shared: bool| {
        let mut s = spec(100, &["a"]);
        s.name = name.into();
        AllocateRequest {
            spec: s.shared(shared),
            origin_node: "a".into(),
            requester: Some(user("alice-1", 1000)),
        }
    };
    let private = m.allocate(named("private", false)).await.unwrap();
    let open = m.allocate(named("open", true)).await.unwrap();
    assert_eq!((private.user, private.shared), (Some(1000), false));
    // Another user may attach only the shared one.
    let err = m
        .attach(&by_name("private"), user("bob-1", 1001))
        .unwrap_err();
    assert!(matches!(err, CoreError::PermissionDenied(_)), "{err}");
    assert!(err.to_string().contains("private to the user"), "{err}");
    m.attach(&by_name("open"), user("bob-1", 1001)).unwrap();
    // The same user, in another session, may attach it.
    m.attach(&by_name("private"), user("alice-2", 1000))
        .unwrap();
    m.detach(private.id, "alice-2").unwrap();
    // Only its user (or an operator) may free it, shared or not.
    for id in [private.id, open.id] {
        let err = m
            .free(&by_id(id), "bob-1", Some(1001), true)
            .await
            .unwrap_err();
        assert!(matches!(err, CoreError::PermissionDenied(_)), "{err}");
    }
    m.free(&by_id(private.id), "alice-2", Some(1000), true)
        .await
        .unwrap();
    m.free(&by_id(open.id), "", None, true).await.unwrap();
    assert!(m.allocations().is_empty());
}

/// Quotas kept in memory, for tests.
struct MemStore(Arc<std::sync::Mutex<Option<oncilla_model::quota::Quotas>>>);

impl crate::master::QuotaStore for MemStore {
    fn save(&self, q: &oncilla_model::quota::Quotas) -> Result<(), String> {
        *self.0.lock().unwrap() = Some(q.clone());
        Ok(())
    }
}

#[tokio::test]
async fn quotas_bound_each_user_and_come_back_on_free_and_rollback() {
    use oncilla_model::quota::{Limits, Quotas, Subject};
    let link = FakeLink {
        fail_on: Some("b:1"),
        ..FakeLink::default()
    };
    let m = master(link).await;
    let limits = Limits {
        bytes: Some(8192),
        allocations: Some(2),
        ..Limits::NONE
    };
    assert!(
        matches!(
            m.set_quota(Subject::User(7), Some(limits)),
            Err(CoreError::QuotaStore(_))
        ),
        "no store, no change"
    );
    let saved = Arc::new(std::sync::Mutex::new(None));
    let m = m.with_quotas(
        Quotas::default(),
        Some(Box::new(MemStore(Arc::clone(&saved)))),
    );
    let report = m.set_quota(Subject::User(7), Some(limits)).unwrap();
    assert_eq!(report.users[0].limits, Some(limits));
    assert_eq!(saved.lock().unwrap().as_ref().unwrap().of(7), &limits);
    let user = |uid| {
        Some(Owner {
            session_id: "s".into(),
            uid: Some(uid),
            ..Default::default()
        })
    };
    let usage = |m: &Master<FakeLink>, uid| {
        m.quota_report()
            .users
            .iter()
            .find(|u| u.uid == uid)
            .map(|u| (u.usage.allocations, u.usage.bytes))
    };
    let first = m.allocate(remote(4096, &["a"], user(7))).await.unwrap();
    // A reservation that fails gives its charge back.
    m.allocate(remote(4096, &["b"], user(7))).await.unwrap_err();
    assert_eq!(usage(&m, 7), Some((1, 4096)));
    m.allocate(remote(4096, &["a"], user(7))).await.unwrap();
    assert_eq!(usage(&m, 7), Some((2, 8192)));
    let e = m.allocate(remote(1, &["a"], user(7))).await.unwrap_err();
    let CoreError::Quota(over) = &e else {
        panic!("{e}")
    };
    assert_eq!(over.what, "allocations");
    assert!(e.to_string().contains("uid 7"), "{e}");
    // Others are not held back: another user, and an operator.
    m.allocate(remote(4096, &["a"], user(8))).await.unwrap();
    m.allocate(remote(4096, &["a"], None)).await.unwrap();
    // Freeing gives room back.
    m.free(&by_id(first.id), "", None, false).await.unwrap();
    assert_eq!(usage(&m, 7), Some((1, 4096)));
    let e = m.allocate(remote(8192, &["a"], user(7))).await.unwrap_err();
    assert!(
        matches!(&e, CoreError::Quota(o) if o.what == "bytes"),
        "{e}"
    );
    m.allocate(remote(4096, &["a"], user(7))).await.unwrap();
    // Clearing the user's own quota lets the (unlimited) default apply.
    m.set_quota(Subject::User(7), None).unwrap();
    m.allocate(remote(4096, &["a"], user(7))).await.unwrap();
    assert_eq!(usage(&m, 7), Some((3, 3 * 4096)));
}
