//! Batches through liboncilla against real daemons: `alloc_many` makes
//! whole, distinct allocations in one call and `free_many` frees them in
//! one, each all or none; neither reaches another session's allocations.

#![allow(clippy::unwrap_used)]

mod support;

use liboncilla::{AllocSpec, Error, Kind};
use support::{bytes, Cluster};

/// `alloc_many` makes whole, distinct allocations in one call, and is all
/// or none: a batch the cluster cannot hold leaves nothing behind, and a
/// bad batch is refused before anything is made.
#[test]
fn batches_of_allocations_are_whole_distinct_and_all_or_none() {
    let c = Cluster::start(2, "8MiB");
    let ocm = c.client(0);
    // On the other node: each allocation on this one would be mapped here
    // through a connection of its own. Few, small ones: every allocation
    // is registered with each RDMA port, slow under emulation.
    let spec = AllocSpec::new(4096, Kind::RemoteHost).on_nodes(["node-1"]);
    let made = ocm.alloc_many(&spec, 64).unwrap();
    assert_eq!(made.len(), 64);
    let mut ids: Vec<u64> = made.iter().map(|a| a.id()).collect();
    ids.dedup();
    assert_eq!(ids.len(), 64, "ids repeat");
    assert_eq!(c.allocation_count(), 64);
    // Each holds its own bytes.
    for (i, a) in made.iter().enumerate() {
        a.copy_in(0, &bytes(4096, i as u8)).unwrap();
    }
    for (i, a) in made.iter().enumerate() {
        let mut back = vec![0u8; 4096];
        a.copy_out(0, &mut back).unwrap();
        assert!(
            back == bytes(4096, i as u8),
            "allocation {i} lost its bytes"
        );
    }
    // Two of 4 MiB, past what the 8 MiB pool has left: refused whole,
    // nothing made.
    let half = AllocSpec::new(4 << 20, Kind::RemoteHost).on_nodes(["node-1"]);
    let err = ocm.alloc_many(&half, 2).unwrap_err();
    assert!(matches!(err, Error::CapacityExhausted(_)), "{err}");
    assert_eq!(c.allocation_count(), 64);
    // Refused before anything is asked: no count, too many, a name.
    for (spec, count) in [
        (spec.clone(), 0),
        (spec.clone(), 257),
        (spec.clone().named("batch"), 2),
        (spec.clone().persistent(), 2),
    ] {
        let err = ocm.alloc_many(&spec, count).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    }
    // Each is freed on its own, as any allocation; then the whole pool is
    // there again for one batch.
    drop(made);
    assert_eq!(c.allocation_count(), 0);
    assert_eq!(ocm.alloc_many(&half, 2).unwrap().len(), 2);
}

/// `Session.FreeMany` straight on the wire, acting for `session` on agent
/// 0 (with the cluster token, which may act for any session): what a
/// client that skips liboncilla's checks can ask.
fn free_many_raw(c: &Cluster, session: &str, ids: Vec<u64>) -> Result<(), String> {
    use oncilla_net::credential::{AttachCredential, Credential};
    use oncilla_proto::{client, pb};
    use tonic::service::interceptor::InterceptedService;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = client::unix(&c.socket(0)).await.unwrap();
        let as_member = AttachCredential::new(&Credential::member(&c.token));
        let mut s = client::session(InterceptedService::new(channel, as_member));
        let req = pb::FreeManyRequest {
            session_id: session.to_string(),
            ids,
            requester: None,
        };
        s.free_many(req)
            .await
            .map(|_| ())
            .map_err(|e| e.message().to_string())
    })
}

/// `free_many` frees a batch in one call, all or none: a batch naming an
/// allocation another process is attached to frees nothing and leaves
/// every handle usable; a session naming another session's allocations
/// among its own (ids it could guess; liboncilla takes only its own
/// handles, so the call is made on the wire) is refused and frees
/// nothing; a bad batch is refused before anything is asked.
#[test]
fn batches_of_frees_are_all_or_none_and_reach_only_what_is_ours() {
    let c = Cluster::start(2, "8MiB");
    let ocm = c.client(0);
    let spec = AllocSpec::new(4096, Kind::RemoteHost).on_nodes(["node-1"]);
    let mut made = ocm.alloc_many(&spec, 32).unwrap();
    // A named one another process attached to: busy.
    let shared = ocm
        .alloc_with(&AllocSpec::new(4096, Kind::RemoteHost).named("held-by-two"))
        .unwrap();
    let other = c.client(1);
    let theirs = other.attach("held-by-two").unwrap();
    made.push(shared);
    let err = ocm.free_many(&mut made).unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err}");
    assert_eq!(c.allocation_count(), 33, "a refused batch freed something");
    for (i, a) in made.iter().enumerate() {
        a.copy_in(0, &bytes(4096, i as u8))
            .unwrap_or_else(|e| panic!("handle {i} unusable after a refused batch: {e}"));
    }
    let shared = made.pop().unwrap();

    // Another session's allocations by id, straight on the wire.
    let mine: Vec<u64> = made.iter().map(|a| a.id()).collect();
    let stolen: Vec<u64> = other
        .alloc_many(&spec, 2)
        .unwrap()
        .into_iter()
        .map(|a| {
            let id = a.id();
            std::mem::forget(a);
            id
        })
        .collect();
    let mut ids = mine[..4].to_vec();
    ids.extend(&stolen);
    let refused = free_many_raw(&c, ocm.session_id(), ids).unwrap_err();
    assert!(refused.contains("another session"), "{refused}");
    let twice = free_many_raw(&c, ocm.session_id(), vec![mine[0], mine[0]]).unwrap_err();
    assert!(twice.contains("twice"), "{twice}");
    assert_eq!(c.allocation_count(), 35, "an attack freed something");

    // Bad batches, refused before anything is asked.
    let err = ocm.free_many(&mut []).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let too_many = free_many_raw(&c, ocm.session_id(), (1..=257).collect()).unwrap_err();
    assert!(too_many.contains("1 to 256"), "{too_many}");
    let mut foreign = vec![other.alloc_with(&spec).unwrap()];
    let err = ocm.free_many(&mut foreign).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    drop(foreign);
    assert_eq!(c.allocation_count(), 35);

    // Ours alone: all go in one call, and the handles are inert.
    ocm.free_many(&mut made).unwrap();
    let err = made[0].copy_in(0, b"x").unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err}");
    drop(made);
    drop(theirs);
    shared.free().unwrap();
    assert_eq!(c.allocation_count(), 2, "only the other session's are left");
}
