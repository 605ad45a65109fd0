//! Round trips (proptest, a bounded number of cases) of every conversion in
//! `oncilla_proto::convert`: an arbitrary valid domain value (built through
//! the model's own constructors and checks where it has them) goes to its
//! protobuf message, through encoded bytes, and back to an equal value.
//! Where a conversion is lossy by design (an unspecified enum, an absent
//! message read as its default), what the code documents is checked
//! instead. Every enum-like integer field refuses an unknown value with
//! `WireError::UnknownEnum`, and every required sub-message its absence
//! with `WireError::Missing`, never defaulting silently.

#![allow(clippy::unwrap_used)]

use oncilla_model::alloc::{
    program_name, session_id, AllocRef, AllocSpec, Allocation, Extent, Health, Invalid, NodeShare,
    Owner, Placement, RdmaRegion, KEY_LEN, MAX_ALLOCATION, MAX_ID,
};
use oncilla_model::cluster::{
    Heartbeat, HeartbeatReply, Piece, Range, Registered, Registration, Reservation, Reserved,
    SessionReport,
};
use oncilla_model::node::{
    AgentStatus, GpuDevice, NodeInfo, NodeList, NodeState, NodeStatus, PoolUsage, RdmaPort,
};
use oncilla_model::quota::{Limits, Report, Subject, Summary, UserReport};
use oncilla_model::{Fabric, Kind, Policy, PAGE};
use oncilla_proto::convert::rdma::EndpointError;
use oncilla_proto::convert::{self, WireError};
use oncilla_proto::pb;
use oncilla_rdma::qp::Endpoint;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use prost::Message;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

/// A message as the peer reads it: encoded to bytes and decoded again.
fn wire<M: Message + Default>(m: &M) -> M {
    M::decode(m.encode_to_vec().as_slice()).unwrap()
}

/// The refusal of an unknown wire value of the enum `what`.
fn unknown(what: &'static str, value: i32) -> Option<WireError> {
    Some(WireError::UnknownEnum { what, value })
}

// ---- Strategies: valid domain values ----

fn fabrics() -> impl Strategy<Value = Fabric> {
    prop::sample::select(vec![Fabric::Auto, Fabric::Tcp, Fabric::Shm, Fabric::Verbs])
}

fn kinds() -> impl Strategy<Value = Kind> {
    prop::sample::select(Kind::ALL.to_vec())
}

fn policies() -> impl Strategy<Value = Policy> {
    prop::sample::select(Policy::ALL.to_vec())
}

fn healths() -> impl Strategy<Value = Health> {
    prop::sample::select(vec![Health::Healthy, Health::Degraded, Health::Lost])
}

fn node_states() -> impl Strategy<Value = NodeState> {
    prop::sample::select(vec![NodeState::Up, NodeState::Suspect, NodeState::Down])
}

/// Any `i32` outside `lo..=hi` (the values a wire enum names).
fn outside(lo: i32, hi: i32) -> impl Strategy<Value = i32> {
    prop_oneof![i32::MIN..lo, (hi + 1)..=i32::MAX]
}

/// Free text (notes, addresses, device names): any short string.
fn text() -> impl Strategy<Value = String> {
    ".{0,8}"
}

fn node_names() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,10}"
}

/// A name `check_name` accepts.
fn alloc_names() -> impl Strategy<Value = String> {
    "[A-Za-z][A-Za-z0-9._-]{0,15}"
}

/// Unnamed (empty) or a valid name.
fn maybe_names() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), alloc_names()]
}

fn node_shares() -> impl Strategy<Value = NodeShare> {
    (node_names(), any::<u32>()).prop_map(|(node, weight)| NodeShare { node, weight })
}

fn placements() -> impl Strategy<Value = Placement> {
    (
        policies(),
        vec(node_shares(), 0..4),
        (0u64..=1024).prop_map(|n| n * PAGE),
        option::of(any::<u32>()),
    )
        .prop_map(|(policy, nodes, stripe, gpu)| Placement {
            policy,
            nodes,
            stripe,
            gpu,
        })
}

fn alloc_specs() -> impl Strategy<Value = AllocSpec> {
    (
        0..=MAX_ALLOCATION,
        kinds(),
        placements(),
        maybe_names(),
        any::<bool>(),
        fabrics(),
        any::<bool>(),
    )
        .prop_map(
            |(size, kind, placement, name, persistent, fabric, shared)| {
                AllocSpec::new(size, kind, placement, name, persistent, fabric)
                    .unwrap()
                    .shared(shared)
            },
        )
}

/// Built by `AllocRef::new` from an id (0: none) and a name.
fn alloc_refs() -> impl Strategy<Value = AllocRef> {
    prop_oneof![
        (1..=MAX_ID).prop_map(|id| AllocRef::new(id, String::new()).unwrap()),
        alloc_names().prop_map(|name| AllocRef::new(0, name).unwrap()),
    ]
}

/// A session as an agent opens it: its id made by `session_id` for its
/// node and user, its program name by `program_name`.
fn owners() -> impl Strategy<Value = Owner> {
    (
        node_names(),
        option::of(any::<u32>()),
        any::<u64>(),
        any::<u32>(),
        ".{0,16}",
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(node, uid, nonce, pid, raw, agent_incarnation, session_seq)| Owner {
                session_id: session_id(&node, uid, nonce),
                node,
                pid,
                program: program_name(&raw),
                agent_incarnation,
                session_seq,
                uid,
            },
        )
}

fn rdma_regions() -> impl Strategy<Value = RdmaRegion> {
    (
        text(),
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(|(device, port, addr, rkey, incarnation)| RdmaRegion {
            device,
            port,
            addr,
            rkey,
            incarnation,
        })
}

fn extents() -> impl Strategy<Value = Extent> {
    (
        node_names(),
        0..=MAX_ALLOCATION,
        0..=MAX_ALLOCATION,
        any::<u64>(),
        text(),
        fabrics(),
        text(),
        option::of(any::<u32>()),
        vec(rdma_regions(), 0..3),
    )
        .prop_map(
            |(node, alloc_offset, len, pool_offset, data_addr, fabric, agent_addr, gpu, rdma)| {
                Extent {
                    node,
                    alloc_offset,
                    len,
                    pool_offset,
                    data_addr,
                    fabric,
                    agent_addr,
                    gpu,
                    rdma,
                }
            },
        )
}

/// Empty (an agent's record) or `KEY_LEN` bytes.
fn access_keys() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![Just(Vec::new()), vec(any::<u8>(), KEY_LEN)]
}

/// Built from `Allocation::new`, then filled in.
fn allocations() -> impl Strategy<Value = Allocation> {
    (
        (0..=MAX_ID, 0..=MAX_ALLOCATION, kinds()),
        vec(extents(), 0..3),
        access_keys(),
        option::of(owners()),
        any::<u64>(),
        maybe_names(),
        vec(owners(), 0..3),
        placements(),
        node_names(),
        (healths(), vec(text(), 0..3)),
        option::of(any::<u32>()),
        any::<bool>(),
    )
        .prop_map(
            |(
                (id, size, kind),
                extents,
                access_key,
                owner,
                created_unix_ms,
                name,
                attached,
                placement,
                origin_node,
                (health, health_notes),
                user,
                shared,
            )| {
                let mut a = Allocation::new(id, size, kind);
                a.extents = extents;
                a.access_key = access_key;
                a.owner = owner;
                a.created_unix_ms = created_unix_ms;
                a.name = name;
                a.attached = attached;
                a.placement = placement;
                a.origin_node = origin_node;
                a.health = health;
                a.health_notes = health_notes;
                a.user = user;
                a.shared = shared;
                a
            },
        )
}

fn gpu_devices() -> impl Strategy<Value = GpuDevice> {
    (any::<u32>(), text(), any::<u64>(), any::<u64>()).prop_map(|(index, name, total, free)| {
        GpuDevice {
            index,
            name,
            total,
            free,
        }
    })
}

fn rdma_ports() -> impl Strategy<Value = RdmaPort> {
    (
        text(),
        any::<u32>(),
        prop::sample::select(vec!["InfiniBand".to_string(), "Ethernet".to_string()]),
        text(),
        any::<u32>(),
        any::<u32>(),
        any::<i32>(),
        any::<u32>(),
        text(),
    )
        .prop_map(
            |(device, port, link_layer, state, active_mtu, gids, numa_node, lid, rate)| RdmaPort {
                device,
                port,
                link_layer,
                state,
                active_mtu,
                gids,
                numa_node,
                lid,
                rate,
            },
        )
}

fn node_infos() -> impl Strategy<Value = NodeInfo> {
    (
        (node_names(), text(), text(), any::<u64>()),
        vec(
            prop::sample::select(vec!["tcp".to_string(), "shm".into(), "verbs".into()]),
            0..3,
        ),
        (prop_oneof![Just(0u64), Just(PAGE), Just(2 << 20)], text()),
        (vec(rdma_ports(), 0..3), text()),
        (vec(gpu_devices(), 0..3), text()),
        (text(), text()),
    )
        .prop_map(
            |(
                (name, agent_addr, data_addr, capacity),
                fabrics,
                (page_size, pool_note),
                (rdma, rdma_note),
                (gpu_devices, gpu_note),
                (gpu_rdma, gpu_rdma_note),
            )| NodeInfo {
                name,
                agent_addr,
                data_addr,
                capacity,
                fabrics,
                page_size,
                pool_note,
                rdma,
                rdma_note,
                gpu_devices,
                gpu_note,
                gpu_rdma,
                gpu_rdma_note,
            },
        )
}

fn pool_usages() -> impl Strategy<Value = PoolUsage> {
    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(used, scrubbing, free, largest_free)| PoolUsage {
            used,
            scrubbing,
            free,
            largest_free,
        },
    )
}

fn agent_statuses() -> impl Strategy<Value = AgentStatus> {
    (
        node_infos(),
        pool_usages(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(node, pool, allocations, sessions, mappings, incarnation, cpu_ns)| AgentStatus {
                node,
                pool,
                allocations,
                sessions,
                mappings,
                incarnation,
                cpu_ns,
            },
        )
}

fn node_statuses() -> impl Strategy<Value = NodeStatus> {
    (
        node_infos(),
        any::<u64>(),
        node_states(),
        any::<u64>(),
        pool_usages(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(info, used, state, last_heartbeat_ms_ago, pool, state_since_unix_ms, incarnation)| {
                NodeStatus {
                    info,
                    used,
                    state,
                    last_heartbeat_ms_ago,
                    pool,
                    state_since_unix_ms,
                    incarnation,
                }
            },
        )
}

fn node_lists() -> impl Strategy<Value = NodeList> {
    (vec(node_statuses(), 0..3), any::<u64>()).prop_map(|(nodes, recovering_ms)| NodeList {
        nodes,
        recovering_ms,
    })
}

fn session_reports() -> impl Strategy<Value = SessionReport> {
    (owners(), vec(1..=MAX_ID, 0..4)).prop_map(|(who, attached)| SessionReport { who, attached })
}

fn registrations() -> impl Strategy<Value = Registration> {
    (
        node_infos(),
        1..=u64::MAX,
        any::<u64>(),
        vec(allocations(), 0..3),
        vec(session_reports(), 0..3),
        any::<u64>(),
        0..=MAX_ID,
    )
        .prop_map(
            |(
                node,
                incarnation,
                master_incarnation,
                held,
                sessions,
                next_session_seq,
                max_held_id,
            )| Registration {
                node,
                incarnation,
                master_incarnation,
                held,
                sessions,
                next_session_seq,
                max_held_id,
            },
        )
}

fn registereds() -> impl Strategy<Value = Registered> {
    (
        any::<u64>(),
        any::<u64>(),
        vec(1..=MAX_ID, 0..4),
        vec(text(), 0..4),
        any::<u64>(),
    )
        .prop_map(
            |(heartbeat_interval_ms, master_incarnation, release, peers, peers_version)| {
                Registered {
                    heartbeat_interval_ms,
                    master_incarnation,
                    release,
                    peers,
                    peers_version,
                }
            },
        )
}

fn heartbeats() -> impl Strategy<Value = Heartbeat> {
    (
        node_names(),
        option::of(pool_usages()),
        any::<u64>(),
        vec(1..=MAX_ID, 0..4),
        vec(text(), 0..3),
        any::<u64>(),
    )
        .prop_map(
            |(name, pool, incarnation, held, ended_sessions, peers_version)| Heartbeat {
                name,
                pool,
                incarnation,
                held,
                ended_sessions,
                peers_version,
            },
        )
}

fn heartbeat_replies() -> impl Strategy<Value = HeartbeatReply> {
    (
        any::<bool>(),
        vec(1..=MAX_ID, 0..4),
        vec(text(), 0..4),
        any::<u64>(),
    )
        .prop_map(|(known, release, peers, peers_version)| HeartbeatReply {
            known,
            release,
            peers,
            peers_version,
        })
}

fn ranges() -> impl Strategy<Value = Range> {
    (0..=MAX_ALLOCATION, 0..=MAX_ALLOCATION)
        .prop_map(|(alloc_offset, len)| Range { alloc_offset, len })
}

/// The master's reservation of an allocation it recorded: its id and key.
fn reservations() -> impl Strategy<Value = Reservation> {
    (
        allocations(),
        vec(any::<u8>(), KEY_LEN),
        vec(ranges(), 0..4),
        fabrics(),
        option::of(any::<u32>()),
    )
        .prop_map(|(record, access_key, ranges, fabric, gpu)| Reservation {
            alloc_id: record.id,
            access_key,
            ranges,
            record,
            fabric,
            gpu,
        })
}

fn pieces() -> impl Strategy<Value = Piece> {
    (
        0..=MAX_ALLOCATION,
        0..=MAX_ALLOCATION,
        any::<u64>(),
        vec(rdma_regions(), 0..3),
    )
        .prop_map(|(alloc_offset, len, pool_offset, rdma)| Piece {
            alloc_offset,
            len,
            pool_offset,
            rdma,
        })
}

fn reserveds() -> impl Strategy<Value = Reserved> {
    (vec(pieces(), 0..4), option::of(pool_usages()))
        .prop_map(|(pieces, pool)| Reserved { pieces, pool })
}

fn limits() -> impl Strategy<Value = Limits> {
    (
        option::of(any::<u64>()),
        option::of(any::<u64>()),
        option::of(any::<u64>()),
        option::of(any::<u64>()),
    )
        .prop_map(|(bytes, node_bytes, allocations, persistent)| Limits {
            bytes,
            node_bytes,
            allocations,
            persistent,
        })
}

fn summaries() -> impl Strategy<Value = Summary> {
    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(bytes, node_bytes, allocations, persistent)| Summary {
            bytes,
            node_bytes,
            allocations,
            persistent,
        },
    )
}

fn reports() -> impl Strategy<Value = Report> {
    (
        limits(),
        vec(
            (any::<u32>(), option::of(limits()), summaries())
                .prop_map(|(uid, limits, usage)| UserReport { uid, limits, usage }),
            0..4,
        ),
        any::<bool>(),
    )
        .prop_map(|(default, users, persistent)| Report {
            default,
            users,
            persistent,
        })
}

fn subjects() -> impl Strategy<Value = Subject> {
    prop_oneof![Just(Subject::Default), any::<u32>().prop_map(Subject::User)]
}

/// An endpoint as a port gives it: 24-bit QP number and PSN, an IB MTU.
fn endpoints() -> impl Strategy<Value = Endpoint> {
    (
        0u32..1 << 24,
        any::<u16>(),
        any::<[u8; 16]>(),
        0u32..1 << 24,
        prop::sample::select(vec![256u32, 512, 1024, 2048, 4096]),
        any::<bool>(),
    )
        .prop_map(|(qp_num, lid, gid, psn, mtu, roce)| Endpoint {
            qp_num,
            lid,
            gid,
            psn,
            mtu,
            roce,
        })
}

proptest! {
    #![proptest_config(config())]

    // ---- convert (mod.rs): fabric, kind, policy ----

    /// Every fabric survives its wire integer and its generated enum.
    #[test]
    fn fabrics_round_trip(f in fabrics()) {
        prop_assert_eq!(convert::fabric(convert::fabric_wire(f)), Ok(f));
        prop_assert_eq!(Fabric::from(pb::Fabric::from(f)), f);
    }

    /// A fabric integer no enum value has is refused, not taken for auto.
    #[test]
    fn unknown_fabrics_are_refused(v in outside(0, 3)) {
        prop_assert_eq!(convert::fabric(v).err(), unknown("fabric", v));
    }

    /// Every memory kind, and none (unspecified), survives its integer.
    #[test]
    fn kinds_round_trip(k in option::of(kinds())) {
        prop_assert_eq!(convert::kind(convert::kind_wire(k)), Ok(k));
    }

    /// A memory kind integer no enum value has is refused.
    #[test]
    fn unknown_kinds_are_refused(v in outside(0, 4)) {
        prop_assert_eq!(convert::kind(v).err(), unknown("memory kind", v));
    }

    /// Every policy survives its integer.
    #[test]
    fn policies_round_trip(p in policies()) {
        prop_assert_eq!(convert::policy(convert::policy_wire(p)), Ok(p));
        // Lossy by design: unspecified (0) reads as the default policy.
        prop_assert_eq!(convert::policy(0), Ok(Policy::default()));
    }

    /// A policy integer no enum value has is refused.
    #[test]
    fn unknown_policies_are_refused(v in outside(0, 3)) {
        prop_assert_eq!(convert::policy(v).err(), unknown("placement policy", v));
    }

    // ---- node.rs: node states ----

    /// Every node state survives its integer.
    #[test]
    fn node_states_round_trip(s in node_states()) {
        prop_assert_eq!(convert::node_state(convert::node_state_wire(s)), Ok(s));
    }

    /// A node state integer no enum value has, and unspecified (0), is refused.
    #[test]
    fn unknown_node_states_are_refused(v in prop_oneof![i32::MIN..=0, 4..=i32::MAX]) {
        prop_assert_eq!(convert::node_state(v).err(), unknown("node state", v));
    }

    // ---- alloc.rs ----

    /// Placements (with their node shares) survive the wire.
    #[test]
    fn placements_round_trip(p in placements()) {
        let w = wire(&pb::Placement::from(p.clone()));
        for (s, ws) in p.nodes.iter().zip(&w.nodes) {
            prop_assert_eq!(&pb::NodeShare::from(s.clone()), ws);
        }
        prop_assert_eq!(Placement::try_from(w), Ok(p));
    }

    /// Requests survive the wire; one without a placement gets the default.
    #[test]
    fn alloc_specs_round_trip(s in alloc_specs()) {
        let w = wire(&pb::AllocSpec::from(s.clone()));
        prop_assert_eq!(AllocSpec::try_from(w.clone()), Ok(s.clone()));
        // Lossy by design: an absent placement reads as the default one.
        let bare = pb::AllocSpec { placement: None, ..w };
        let expected = AllocSpec { placement: Placement::default(), ..s };
        prop_assert_eq!(AllocSpec::try_from(bare), Ok(expected));
    }

    /// A request with an unknown kind, fabric or policy is refused, and
    /// one with no kind (unspecified) is invalid.
    #[test]
    fn alloc_specs_refuse_unknown_enums(s in alloc_specs(), k in outside(0, 4), f in outside(0, 3), p in outside(0, 3)) {
        let w = pb::AllocSpec::from(s);
        let bad = pb::AllocSpec { kind: k, ..w.clone() };
        prop_assert_eq!(AllocSpec::try_from(bad).err(), unknown("memory kind", k));
        let bad = pb::AllocSpec { fabric: f, ..w.clone() };
        prop_assert_eq!(AllocSpec::try_from(bad).err(), unknown("fabric", f));
        let mut bad = w.clone();
        bad.placement.as_mut().unwrap().policy = p;
        prop_assert_eq!(AllocSpec::try_from(bad).err(), unknown("placement policy", p));
        let bad = pb::AllocSpec { kind: 0, ..w };
        prop_assert_eq!(AllocSpec::try_from(bad), Err(WireError::Invalid(Invalid::NoKind)));
    }

    /// References survive the wire, through `alloc_ref` too; none given is
    /// missing.
    #[test]
    fn alloc_refs_round_trip(r in alloc_refs(), name in alloc_names()) {
        let w = wire(&pb::AllocRef::from(r.clone()));
        prop_assert_eq!(AllocRef::try_from(w.clone()), Ok(r.clone()));
        prop_assert_eq!(convert::alloc_ref(Some(w.clone())), Ok(r.clone()));
        prop_assert_eq!(
            convert::alloc_ref(None),
            Err(WireError::Missing("the allocation (id or name)"))
        );
        // Lossy by design: an id, when given, wins over a name beside it.
        if let AllocRef::Id(id) = r {
            let both = pb::AllocRef { id, name };
            prop_assert_eq!(convert::alloc_ref(Some(both)), Ok(AllocRef::Id(id)));
        }
    }

    /// Owners survive the wire.
    #[test]
    fn owners_round_trip(o in owners()) {
        prop_assert_eq!(Owner::from(wire(&pb::Owner::from(o.clone()))), o);
    }

    /// RDMA registrations survive the wire.
    #[test]
    fn rdma_regions_round_trip(r in rdma_regions()) {
        prop_assert_eq!(RdmaRegion::from(wire(&pb::RdmaRegion::from(r.clone()))), r);
    }

    /// Extents survive the wire; an unknown fabric is refused.
    #[test]
    fn extents_round_trip(e in extents(), f in outside(0, 3)) {
        let w = wire(&pb::Extent::from(e.clone()));
        prop_assert_eq!(Extent::try_from(w.clone()), Ok(e));
        let bad = pb::Extent { fabric: f, ..w };
        prop_assert_eq!(Extent::try_from(bad).err(), unknown("fabric", f));
    }

    /// Allocation records survive the wire; one without a placement gets
    /// the default.
    #[test]
    fn allocations_round_trip(a in allocations()) {
        let w = wire(&pb::Allocation::from(a.clone()));
        prop_assert_eq!(Allocation::try_from(w.clone()), Ok(a.clone()));
        // Lossy by design: an absent placement reads as the default one.
        let bare = pb::Allocation { placement: None, ..w };
        let expected = Allocation { placement: Placement::default(), ..a };
        prop_assert_eq!(Allocation::try_from(bare), Ok(expected));
    }

    /// A record with an unknown kind, health, policy or extent fabric is
    /// refused, and one with no kind is invalid.
    #[test]
    fn allocations_refuse_unknown_enums(
        a in allocations(),
        e in extents(),
        k in outside(0, 4),
        h in outside(0, 2),
        p in outside(0, 3),
        f in outside(0, 3),
    ) {
        let mut a = a;
        a.extents.push(e);
        let w = pb::Allocation::from(a);
        let bad = pb::Allocation { kind: k, ..w.clone() };
        prop_assert_eq!(Allocation::try_from(bad).err(), unknown("memory kind", k));
        let bad = pb::Allocation { health: h, ..w.clone() };
        prop_assert_eq!(Allocation::try_from(bad).err(), unknown("health", h));
        let mut bad = w.clone();
        bad.placement.as_mut().unwrap().policy = p;
        prop_assert_eq!(Allocation::try_from(bad).err(), unknown("placement policy", p));
        let mut bad = w.clone();
        bad.extents.last_mut().unwrap().fabric = f;
        prop_assert_eq!(Allocation::try_from(bad).err(), unknown("fabric", f));
        let bad = pb::Allocation { kind: 0, ..w };
        prop_assert_eq!(Allocation::try_from(bad), Err(WireError::Invalid(Invalid::NoKind)));
    }

    /// What the model refuses is refused at the edge too: a request above
    /// the size limit or badly named, a reference past `MAX_ID` or to a
    /// name no allocation can have, a record past `MAX_ID` or with a key
    /// of the wrong length.
    #[test]
    fn values_the_model_refuses_are_refused(
        s in alloc_specs(),
        a in allocations(),
        size in (MAX_ALLOCATION + 1)..=u64::MAX,
        id in (MAX_ID + 1)..=u64::MAX,
        bad_name in "[0-9_.-][A-Za-z0-9._-]{0,8}",
        key_len in (1usize..40).prop_filter("not a key", |n| *n != KEY_LEN),
    ) {
        let w = pb::AllocSpec::from(s);
        let big = pb::AllocSpec { size, ..w.clone() };
        prop_assert_eq!(AllocSpec::try_from(big), Err(WireError::Invalid(Invalid::TooLarge(size))));
        let misnamed = pb::AllocSpec { name: bad_name.clone(), ..w };
        prop_assert!(matches!(AllocSpec::try_from(misnamed), Err(WireError::Invalid(Invalid::Name(_)))));
        let far = pb::AllocRef { id, name: String::new() };
        prop_assert_eq!(AllocRef::try_from(far), Err(WireError::Invalid(Invalid::Id(id))));
        let misnamed = pb::AllocRef { id: 0, name: bad_name };
        prop_assert!(matches!(AllocRef::try_from(misnamed), Err(WireError::Invalid(Invalid::Name(_)))));
        prop_assert_eq!(
            AllocRef::try_from(pb::AllocRef::default()),
            Err(WireError::Invalid(Invalid::NoRef))
        );
        let w = pb::Allocation::from(a);
        let far = pb::Allocation { id, ..w.clone() };
        prop_assert_eq!(Allocation::try_from(far), Err(WireError::Invalid(Invalid::Id(id))));
        let keyed = pb::Allocation { access_key: vec![7; key_len], ..w };
        prop_assert_eq!(
            Allocation::try_from(keyed),
            Err(WireError::Invalid(Invalid::KeyLength(key_len)))
        );
    }

    // ---- cluster.rs ----

    /// Registrations survive the wire.
    #[test]
    fn registrations_round_trip(r in registrations()) {
        let w = wire(&pb::RegisterRequest::from(r.clone()));
        prop_assert_eq!(Registration::try_from(w), Ok(r));
    }

    /// A registration without its node, or with a session without its
    /// owner, is refused; so is a largest held id past `MAX_ID`.
    #[test]
    fn registrations_need_their_node_and_owners(
        r in registrations(),
        s in session_reports(),
        id in (MAX_ID + 1)..=u64::MAX,
    ) {
        let mut r = r;
        r.sessions.push(s);
        let w = pb::RegisterRequest::from(r);
        let bad = pb::RegisterRequest { node: None, ..w.clone() };
        prop_assert_eq!(Registration::try_from(bad), Err(WireError::Missing("the node")));
        let mut bad = w.clone();
        bad.sessions.last_mut().unwrap().who = None;
        prop_assert_eq!(Registration::try_from(bad), Err(WireError::Missing("a session's owner")));
        let bad = pb::RegisterRequest { max_held_id: id, ..w };
        prop_assert_eq!(Registration::try_from(bad), Err(WireError::Invalid(Invalid::Id(id))));
    }

    /// Registration replies survive the wire.
    #[test]
    fn registereds_round_trip(r in registereds()) {
        prop_assert_eq!(Registered::from(wire(&pb::RegisterReply::from(r.clone()))), r);
    }

    /// Heartbeats (with or without a pool) survive the wire.
    #[test]
    fn heartbeats_round_trip(h in heartbeats()) {
        prop_assert_eq!(Heartbeat::from(wire(&pb::HeartbeatRequest::from(h.clone()))), h);
    }

    /// Heartbeat replies survive the wire.
    #[test]
    fn heartbeat_replies_round_trip(h in heartbeat_replies()) {
        prop_assert_eq!(HeartbeatReply::from(wire(&pb::HeartbeatReply::from(h.clone()))), h);
    }

    /// Reservations survive the wire.
    #[test]
    fn reservations_round_trip(r in reservations()) {
        let w = wire(&pb::ReserveRequest::from(r.clone()));
        prop_assert_eq!(Reservation::try_from(w), Ok(r));
    }

    /// A reservation without its record, or with an unknown fabric, is
    /// refused.
    #[test]
    fn reservations_need_their_record(r in reservations(), f in outside(0, 3)) {
        let w = pb::ReserveRequest::from(r);
        let bad = pb::ReserveRequest { record: None, ..w.clone() };
        prop_assert_eq!(
            Reservation::try_from(bad),
            Err(WireError::Missing("the allocation record"))
        );
        let bad = pb::ReserveRequest { fabric: f, ..w };
        prop_assert_eq!(Reservation::try_from(bad).err(), unknown("fabric", f));
    }

    /// Pieces and reservation replies (with or without a pool) survive the
    /// wire.
    #[test]
    fn reserveds_round_trip(r in reserveds()) {
        for p in &r.pieces {
            prop_assert_eq!(&Piece::from(wire(&pb::Piece::from(p.clone()))), p);
        }
        prop_assert_eq!(Reserved::from(wire(&pb::ReserveReply::from(r.clone()))), r);
    }

    // ---- node.rs ----

    /// Node infos, with their GPUs and RDMA ports, survive the wire.
    #[test]
    fn node_infos_round_trip(n in node_infos()) {
        for g in &n.gpu_devices {
            prop_assert_eq!(&GpuDevice::from(wire(&pb::GpuDevice::from(g.clone()))), g);
        }
        for p in &n.rdma {
            prop_assert_eq!(&RdmaPort::from(wire(&pb::RdmaPort::from(p.clone()))), p);
        }
        prop_assert_eq!(NodeInfo::from(wire(&pb::NodeInfo::from(n.clone()))), n);
    }

    /// Pool usages survive the wire.
    #[test]
    fn pool_usages_round_trip(p in pool_usages()) {
        prop_assert_eq!(PoolUsage::from(wire(&pb::PoolUsage::from(p))), p);
    }

    /// Agent statuses survive the wire; one without its node or pool is
    /// refused.
    #[test]
    fn agent_statuses_round_trip(s in agent_statuses()) {
        let w = wire(&pb::AgentStatus::from(s.clone()));
        prop_assert_eq!(AgentStatus::try_from(w.clone()), Ok(s));
        let bad = pb::AgentStatus { node: None, ..w.clone() };
        prop_assert_eq!(AgentStatus::try_from(bad), Err(WireError::Missing("agent's node info")));
        let bad = pb::AgentStatus { pool: None, ..w };
        prop_assert_eq!(AgentStatus::try_from(bad), Err(WireError::Missing("agent's pool usage")));
    }

    /// Node statuses survive the wire; one without its info or with an
    /// unknown state is refused, one without a pool gets an empty one.
    #[test]
    fn node_statuses_round_trip(n in node_statuses(), v in prop_oneof![i32::MIN..=0, 4..=i32::MAX]) {
        let w = wire(&pb::NodeStatus::from(n.clone()));
        prop_assert_eq!(NodeStatus::try_from(w.clone()), Ok(n.clone()));
        // Lossy by design: an absent pool reads as an empty one.
        let bare = pb::NodeStatus { pool: None, ..w.clone() };
        let expected = NodeStatus { pool: PoolUsage::default(), ..n };
        prop_assert_eq!(NodeStatus::try_from(bare), Ok(expected));
        let bad = pb::NodeStatus { info: None, ..w.clone() };
        prop_assert_eq!(NodeStatus::try_from(bad), Err(WireError::Missing("node info")));
        let bad = pb::NodeStatus { state: v, ..w };
        prop_assert_eq!(NodeStatus::try_from(bad).err(), unknown("node state", v));
    }

    /// Node lists survive the wire; one node without its info spoils the
    /// list.
    #[test]
    fn node_lists_round_trip(l in node_lists(), i in any::<prop::sample::Index>()) {
        let w = wire(&pb::NodeList::from(l.clone()));
        prop_assert_eq!(NodeList::try_from(w.clone()), Ok(l));
        if !w.nodes.is_empty() {
            let mut bad = w;
            let at = i.index(bad.nodes.len());
            bad.nodes[at].info = None;
            prop_assert_eq!(NodeList::try_from(bad), Err(WireError::Missing("node info")));
        }
    }

    // ---- quota.rs ----

    /// Limits and usage summaries survive the wire.
    #[test]
    fn limits_and_summaries_round_trip(l in limits(), s in summaries()) {
        prop_assert_eq!(Limits::from(wire(&pb::QuotaLimits::from(l))), l);
        prop_assert_eq!(Summary::from(wire(&pb::QuotaUsage::from(s))), s);
    }

    /// Quota reports survive the wire; absent default limits or usage read
    /// as their defaults.
    #[test]
    fn reports_round_trip(r in reports()) {
        let w = wire(&pb::QuotaList::from(r.clone()));
        prop_assert_eq!(Report::from(w.clone()), r.clone());
        // Lossy by design: absent limits mean none, absent usage nothing held.
        let mut bare = w;
        bare.default_limits = None;
        for u in &mut bare.users {
            u.usage = None;
        }
        let mut expected = r;
        expected.default = Limits::default();
        for u in &mut expected.users {
            u.usage = Summary::default();
        }
        prop_assert_eq!(Report::from(bare), expected);
    }

    /// Setting limits survives the wire (`quota_request`, then
    /// `quota_setting`), and so does clearing a user's own.
    #[test]
    fn quota_settings_round_trip(who in subjects(), l in option::of(limits())) {
        let w = wire(&convert::quota_request(who, l));
        match (who, l) {
            (Subject::Default, None) => prop_assert_eq!(
                convert::quota_setting(w),
                Err(WireError::Missing(
                    "limits (the default cannot be cleared; set it without limits)"
                ))
            ),
            _ => prop_assert_eq!(convert::quota_setting(w), Ok((who, l))),
        }
    }

    /// A setting that neither gives limits nor clears them is refused; a
    /// default's uid and a clearing's limits are ignored.
    #[test]
    fn quota_settings_need_limits(uid in any::<u32>(), is_default in any::<bool>(), l in limits()) {
        let none = pb::SetQuotaRequest { is_default, uid, limits: None, clear: false };
        prop_assert_eq!(convert::quota_setting(none), Err(WireError::Missing("limits")));
        // Lossy by design: the default has no uid; any sent is dropped.
        let default = pb::SetQuotaRequest { is_default: true, uid, limits: Some(l.into()), clear: false };
        prop_assert_eq!(convert::quota_setting(default), Ok((Subject::Default, Some(l))));
        // Lossy by design: clearing a user's own limits ignores any sent.
        let clear = pb::SetQuotaRequest { is_default: false, uid, limits: Some(l.into()), clear: true };
        prop_assert_eq!(convert::quota_setting(clear), Ok((Subject::User(uid), None)));
    }

    // ---- rdma.rs ----

    /// Queue-pair endpoints survive the wire.
    #[test]
    fn endpoints_round_trip(e in endpoints()) {
        let w = wire(&pb::QpEndpoint::from(&e));
        prop_assert_eq!(Endpoint::try_from(&w), Ok(e));
    }

    /// An empty GID reads as all zero and any link layer but "Ethernet" as
    /// InfiniBand; a GID of another length or a LID above 16 bits is
    /// refused.
    #[test]
    fn endpoints_refuse_bad_gids_and_lids(
        e in endpoints(),
        layer in ".{0,10}",
        gid_len in (1usize..40).prop_filter("not a GID", |n| *n != 16),
        lid in (1u32 << 16)..=u32::MAX,
    ) {
        let w = pb::QpEndpoint::from(&e);
        // Lossy by design: no GID means LID routing, the all-zero GID.
        let bare = pb::QpEndpoint { gid: Vec::new(), ..w.clone() };
        prop_assert_eq!(Endpoint::try_from(&bare), Ok(Endpoint { gid: [0; 16], ..e.clone() }));
        // Lossy by design: the link layer only tells RoCE ("Ethernet") apart.
        let other = pb::QpEndpoint { link_layer: layer.clone(), ..w.clone() };
        let roce = layer == "Ethernet";
        prop_assert_eq!(Endpoint::try_from(&other), Ok(Endpoint { roce, ..e }));
        let bad = pb::QpEndpoint { gid: vec![1; gid_len], ..w.clone() };
        prop_assert_eq!(Endpoint::try_from(&bad), Err(EndpointError::GidLength(gid_len)));
        let bad = pb::QpEndpoint { lid, ..w };
        prop_assert_eq!(Endpoint::try_from(&bad), Err(EndpointError::Lid(lid)));
    }
}
