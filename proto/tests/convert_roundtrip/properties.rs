//! The properties: each conversion round-trips, and refuses what it must.

use super::strategies::*;
use super::*;

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

    /// A registration whose zone is not a label (too long, a bad first
    /// character, a space or a control character) is refused by name.
    #[test]
    fn registrations_with_a_bad_zone_are_refused(
        r in registrations(),
        zone in prop_oneof![
            "[a-z0-9]{64,80}",
            "[._-][a-z0-9]{0,8}",
            "[a-z][a-z0-9]{0,8}[ \n\t/:][a-z0-9]{0,8}",
        ],
    ) {
        let mut w = pb::RegisterRequest::from(r);
        w.node.as_mut().unwrap().zone = zone.clone();
        prop_assert_eq!(
            Registration::try_from(w),
            Err(WireError::Invalid(Invalid::Zone(oncilla_model::echo::echo(&zone))))
        );
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

    /// Batches of reservations and their replies survive the wire, in
    /// order; an empty batch or one past MAX_BATCH is refused.
    #[test]
    fn reservation_batches_round_trip(
        rs in proptest::collection::vec(reservations(), 1..4),
        replies in proptest::collection::vec(reserveds(), 0..4),
    ) {
        let w = wire(&pb::ReserveBatch::from(rs.clone()));
        prop_assert_eq!(Vec::<Reservation>::try_from(w.clone()), Ok(rs));
        let empty = pb::ReserveBatch { reservations: Vec::new() };
        prop_assert!(Vec::<Reservation>::try_from(empty).is_err());
        let one = w.reservations[0].clone();
        let many = pb::ReserveBatch {
            reservations: vec![one; MAX_BATCH as usize + 1],
        };
        prop_assert!(Vec::<Reservation>::try_from(many).is_err());
        let back = Vec::<Reserved>::from(wire(&pb::ReserveBatchReply::from(replies.clone())));
        prop_assert_eq!(back, replies);
    }

    /// Copy changes survive the wire; a replica named twice, an empty
    /// address, a replica of no bytes, ranges out of order or
    /// overlapping, more ranges than an allocation has extents, or a fill
    /// of a stranger is refused.
    #[test]
    fn copy_changes_round_trip(c in set_copies()) {
        let w = wire(&pb::SetCopiesRequest::from(c.clone()));
        prop_assert_eq!(SetCopies::try_from(w.clone()), Ok(c));
        let share = |addr: &str, ranges: &[(u64, u64)]| pb::ReplicaShare {
            data_addr: addr.into(),
            ranges: ranges
                .iter()
                .map(|&(alloc_offset, len)| pb::Range { alloc_offset, len })
                .collect(),
        };
        let refused = |replicas: Vec<pb::ReplicaShare>| {
            let mut bad = w.clone();
            bad.fill.clear();
            bad.replicas = replicas;
            SetCopies::try_from(bad).is_err()
        };
        prop_assert!(refused(vec![share("n:1", &[(0, 1)]), share("n:1", &[(5, 1)])]));
        prop_assert!(refused(vec![share("", &[(0, 1)])]));
        prop_assert!(refused(vec![share("n:1", &[])]));
        prop_assert!(refused(vec![share("n:1", &[(0, 0)])]));
        prop_assert!(refused(vec![share("n:1", &[(10, 5), (0, 5)])]));
        prop_assert!(refused(vec![share("n:1", &[(0, 10), (5, 10)])]));
        prop_assert!(refused(vec![share("n:1", &[(u64::MAX, 2)])]));
        let lots: Vec<(u64, u64)> = (0..=oncilla_model::alloc::MAX_EXTENTS as u64).map(|i| (i * 2, 1)).collect();
        prop_assert!(refused(vec![share("n:1", &lots)]));
        let crowd: Vec<pb::ReplicaShare> = (0..=4096).map(|i| share(&format!("n{i}:1"), &[(0, 1)])).collect();
        prop_assert!(refused(crowd));
        let mut stranger = w;
        stranger.fill = vec!["not-a-replica:1".into()];
        prop_assert!(SetCopies::try_from(stranger).is_err());
    }

    /// Releases survive the wire; ranges empty, out of order, overlapping,
    /// past 2^64 or more than an allocation has extents are refused.
    #[test]
    fn releases_round_trip(r in releases()) {
        let w = wire(&pb::ReleaseRequest::from(r.clone()));
        prop_assert_eq!(Release::try_from(w.clone()), Ok(r));
        let refused = |ranges: &[(u64, u64)]| {
            let mut bad = w.clone();
            bad.ranges = ranges
                .iter()
                .map(|&(alloc_offset, len)| pb::Range { alloc_offset, len })
                .collect();
            Release::try_from(bad).is_err()
        };
        prop_assert!(refused(&[(0, 0)]));
        prop_assert!(refused(&[(10, 5), (0, 5)]));
        prop_assert!(refused(&[(0, 10), (5, 10)]));
        prop_assert!(refused(&[(u64::MAX, 2)]));
        let lots: Vec<(u64, u64)> = (0..=oncilla_model::alloc::MAX_EXTENTS as u64).map(|i| (i * 2, 1)).collect();
        prop_assert!(refused(&lots));
        prop_assert!(!refused(&[(0, 5), (5, 5)]));
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
        let bad = pb::NodeStatus { state: v, ..w.clone() };
        prop_assert_eq!(NodeStatus::try_from(bad).err(), unknown("node state", v));
        let long = "x".repeat(oncilla_model::node::MAX_DRAIN_NOTE + 1);
        let bad = pb::NodeStatus { draining: true, drain_note: long, ..w };
        prop_assert!(matches!(NodeStatus::try_from(bad), Err(WireError::TooLong("drain note", ..))));
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
