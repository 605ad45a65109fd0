//! Batches of allocations (`Session.AllocMany`, `Master.AllocateMany`) and
//! of reservations (`Agent.Reserve`) attacked on the wire: each is bounded
//! where it enters, makes only a session's own allocations, for that
//! session only, and a refused batch leaves nothing behind.

use super::*;

fn spec(name: &str, persistent: bool) -> pb::AllocSpec {
    pb::AllocSpec {
        size: 4096,
        kind: pb::MemKind::RemoteHost as i32,
        name: name.into(),
        persistent,
        ..Default::default()
    }
}

#[test]
fn batches_are_bounded_and_act_only_for_their_own_session() {
    let c = Cluster::start(2, "32MiB");
    let victim = c.client(0);
    let me = open_raw(&c);
    let h = c.handle();
    let before = c.allocation_count();
    me.rt.block_on(async {
        let channel = client::unix(&c.socket(0)).await.unwrap();
        let mut s = client::session(InterceptedService::new(
            channel,
            AttachCredential::new(&me.credential),
        ));
        let ask =
            |session_id: &str, spec: Option<pb::AllocSpec>, count: u64| pb::AllocManyRequest {
                session_id: session_id.to_string(),
                spec,
                count,
            };
        // Counts outside 1..=256, however large, and specs that would
        // outlive the caller: refused where they enter, saying why.
        for (count, spec, why) in [
            (0, Some(spec("", false)), "1 to 256"),
            (257, Some(spec("", false)), "1 to 256"),
            (u64::MAX, Some(spec("", false)), "1 to 256"),
            (2, Some(spec("mine", false)), "one at a time"),
            (2, Some(spec("", true)), "one at a time"),
            (2, None, "spec"),
        ] {
            let (code, msg) = refused(s.alloc_many(ask(&me.id, spec, count)).await);
            assert_eq!(code, tonic::Code::InvalidArgument, "{count}: {msg}");
            assert!(msg.contains(why), "{count}: {msg}");
            assert!(msg.len() < 1024, "a {}-byte message", msg.len());
        }
        // For another session: refused.
        let (code, msg) = refused(
            s.alloc_many(ask(victim.session_id(), Some(spec("", false)), 4))
                .await,
        );
        assert_eq!(code, tonic::Code::PermissionDenied, "{msg}");

        // A session's credential reserves nothing on an agent, batch or not.
        let node1 = c.node("node-1").unwrap();
        let agent1 = node1["agent_addr"].as_str().unwrap().to_string();
        let mut a = client::agent(client::lazy_as(&agent1, &me.credential, None).unwrap());
        let one = pb::ReserveRequest {
            alloc_id: 1 << 40,
            access_key: vec![7; 32],
            ranges: vec![pb::Range {
                alloc_offset: 0,
                len: 4096,
            }],
            record: Some(pb::Allocation::default()),
            ..Default::default()
        };
        let (code, msg) = refused(
            a.reserve(pb::ReserveBatch {
                reservations: vec![one.clone()],
            })
            .await,
        );
        assert_eq!(code, tonic::Code::PermissionDenied, "{msg}");
        // Even with the cluster token, a batch past 256 reservations
        // (or none) is refused before any is made.
        let mut op = client::agent(client::lazy(&agent1, &h.token, None).unwrap());
        for n in [0, 257] {
            let (code, msg) = refused(
                op.reserve(pb::ReserveBatch {
                    reservations: vec![one.clone(); n],
                })
                .await,
            );
            assert_eq!(code, tonic::Code::InvalidArgument, "{n}: {msg}");
            assert!(msg.contains("1 to 256"), "{n}: {msg}");
        }
    });

    // node-1's credential allocates a batch only for node-1's sessions.
    let keys = NodeKeys::load(&h.node_keys_file(1)).unwrap();
    let cred = keys.credential().clone();
    let r = me.rt.block_on(async {
        let mut m = client::master(client::lazy_as(&h.master_addr, &cred, None).unwrap());
        m.allocate_many(pb::AllocateManyRequest {
            request: Some(pb::AllocateRequest {
                spec: Some(spec("", false)),
                origin_node: "node-0".into(),
                requester: Some(pb::Owner {
                    session_id: victim.session_id().to_string(),
                    node: "node-0".into(),
                    ..Default::default()
                }),
            }),
            count: 4,
        })
        .await
    });
    let (code, msg) = refused(r);
    assert_eq!(code, tonic::Code::PermissionDenied, "{msg}");
    assert!(msg.contains("node-1"), "{msg}");

    assert_eq!(c.allocation_count(), before, "a refused batch made nothing");
    c.still_serves();
}

/// A batch of same-node allocations past the user's share of map
/// connections (each mapped handle holds one): before, `alloc_many` of
/// 256 while the process held one local allocation failed whole with
/// "too many map connections from this user" (README's own example).
/// Now the handles past the share are not mapped and their bytes go over
/// TCP; every one holds its own bytes.
#[test]
fn a_batch_of_local_allocations_past_the_map_share_goes_over_tcp() {
    let limit = support::raise_nofile(4096);
    if limit < 1024 {
        println!("skipped: {limit} descriptors; the batch maps 256 allocations");
        return;
    }
    let c = Cluster::start(2, "32MiB");
    let ocm = c.client(0);
    let first = ocm.alloc(4096, Kind::RemoteHost).unwrap();
    assert_eq!(first.fabrics(), [Fabric::Shm], "placed here and mapped");
    let made = ocm
        .alloc_many(&AllocSpec::new(4096, Kind::RemoteHost), 256)
        .unwrap();
    assert_eq!(made.len(), 256);
    let over_tcp = made.iter().filter(|a| a.fabrics() == [Fabric::Tcp]).count();
    assert!(over_tcp >= 1, "every handle mapped past the share");
    for (i, a) in made.iter().enumerate() {
        a.copy_in(0, &[i as u8; 4096]).unwrap();
    }
    for (i, a) in made.iter().enumerate() {
        let mut back = [0u8; 4096];
        a.copy_out(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == i as u8), "allocation {i}");
    }
}
