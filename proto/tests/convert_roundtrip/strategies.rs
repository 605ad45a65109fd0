//! Strategies: arbitrary valid domain values, built through the model's
//! own constructors and checks where it has them.

use super::*;

// ---- Strategies: valid domain values ----

pub(super) fn fabrics() -> impl Strategy<Value = Fabric> {
    prop::sample::select(vec![Fabric::Auto, Fabric::Tcp, Fabric::Shm, Fabric::Verbs])
}

pub(super) fn kinds() -> impl Strategy<Value = Kind> {
    prop::sample::select(Kind::ALL.to_vec())
}

pub(super) fn policies() -> impl Strategy<Value = Policy> {
    prop::sample::select(Policy::ALL.to_vec())
}

pub(super) fn healths() -> impl Strategy<Value = Health> {
    prop::sample::select(vec![Health::Healthy, Health::Degraded, Health::Lost])
}

pub(super) fn node_states() -> impl Strategy<Value = NodeState> {
    prop::sample::select(vec![NodeState::Up, NodeState::Suspect, NodeState::Down])
}

/// Any `i32` outside `lo..=hi` (the values a wire enum names).
pub(super) fn outside(lo: i32, hi: i32) -> impl Strategy<Value = i32> {
    prop_oneof![i32::MIN..lo, (hi + 1)..=i32::MAX]
}

/// Free text (notes, addresses, device names): any short string.
pub(super) fn text() -> impl Strategy<Value = String> {
    ".{0,8}"
}

pub(super) fn node_names() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,10}"
}

/// A name `check_name` accepts.
pub(super) fn alloc_names() -> impl Strategy<Value = String> {
    "[A-Za-z][A-Za-z0-9._-]{0,15}"
}

/// Unnamed (empty) or a valid name.
pub(super) fn maybe_names() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), alloc_names()]
}

pub(super) fn node_shares() -> impl Strategy<Value = NodeShare> {
    (node_names(), any::<u32>()).prop_map(|(node, weight)| NodeShare { node, weight })
}

pub(super) fn placements() -> impl Strategy<Value = Placement> {
    (
        (
            policies(),
            vec(node_shares(), 0..4),
            (0u64..=1024).prop_map(|n| n * PAGE),
            option::of(any::<u32>()),
        ),
        0..=MAX_REPLICAS,
    )
        .prop_map(|((policy, nodes, stripe, gpu), replicas)| Placement {
            replicas,
            policy,
            nodes,
            stripe,
            gpu,
        })
}

pub(super) fn alloc_specs() -> impl Strategy<Value = AllocSpec> {
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
            |(size, kind, mut placement, name, persistent, fabric, shared)| {
                // Replicas are for remote host memory over TCP.
                if kind != Kind::RemoteHost || !matches!(fabric, Fabric::Auto | Fabric::Tcp) {
                    placement.replicas = 0;
                }
                AllocSpec::new(size, kind, placement, name, persistent, fabric)
                    .unwrap()
                    .shared(shared)
            },
        )
}

/// Built by `AllocRef::new` from an id (0: none) and a name.
pub(super) fn alloc_refs() -> impl Strategy<Value = AllocRef> {
    prop_oneof![
        (1..=MAX_ID).prop_map(|id| AllocRef::new(id, String::new()).unwrap()),
        alloc_names().prop_map(|name| AllocRef::new(0, name).unwrap()),
    ]
}

/// A session as an agent opens it: its id made by `session_id` for its
/// node and user, its program name by `program_name`.
pub(super) fn owners() -> impl Strategy<Value = Owner> {
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

pub(super) fn rdma_regions() -> impl Strategy<Value = RdmaRegion> {
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

pub(super) fn extents() -> impl Strategy<Value = Extent> {
    (
        node_names(),
        0..=MAX_ALLOCATION,
        0..=MAX_ALLOCATION,
        any::<u64>(),
        text(),
        fabrics(),
        text(),
        option::of(any::<u32>()),
        (vec(rdma_regions(), 0..3), any::<bool>()),
    )
        .prop_map(
            |(
                node,
                alloc_offset,
                len,
                pool_offset,
                data_addr,
                fabric,
                agent_addr,
                gpu,
                (rdma, filling),
            )| {
                Extent {
                    copy: 0,
                    filling,
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
pub(super) fn access_keys() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![Just(Vec::new()), vec(any::<u8>(), KEY_LEN)]
}

/// Built from `Allocation::new`, then filled in.
pub(super) fn allocations() -> impl Strategy<Value = Allocation> {
    (
        (0..=MAX_ID, 0..=MAX_ALLOCATION, kinds()),
        vec(extents(), 0..5),
        access_keys(),
        option::of(owners()),
        any::<u64>(),
        maybe_names(),
        vec(owners(), 0..3),
        placements(),
        node_names(),
        (healths(), vec(text(), 0..3), any::<bool>()),
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
                (health, health_notes, moving),
                user,
                shared,
            )| {
                let mut a = Allocation::new(id, size, kind);
                // The first extents are the primary's, the rest a replica's.
                let (primary, replicas) = extents.split_at(extents.len() / 2);
                a.extents = primary.to_vec();
                a.replicas = replicas
                    .iter()
                    .cloned()
                    .map(|e| Extent { copy: 1, ..e })
                    .collect();
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
                a.moving = moving;
                a
            },
        )
}

pub(super) fn gpu_devices() -> impl Strategy<Value = GpuDevice> {
    (any::<u32>(), text(), any::<u64>(), any::<u64>()).prop_map(|(index, name, total, free)| {
        GpuDevice {
            index,
            name,
            total,
            free,
        }
    })
}

pub(super) fn rdma_ports() -> impl Strategy<Value = RdmaPort> {
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

/// Zone labels as `check_zone` accepts them, none among them.
pub(super) fn zones() -> impl Strategy<Value = String> {
    "([a-zA-Z0-9][a-zA-Z0-9._-]{0,62})?"
}

pub(super) fn node_infos() -> impl Strategy<Value = NodeInfo> {
    (
        (node_names(), zones(), text(), text(), any::<u64>()),
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
                (name, zone, agent_addr, data_addr, capacity),
                fabrics,
                (page_size, pool_note),
                (rdma, rdma_note),
                (gpu_devices, gpu_note),
                (gpu_rdma, gpu_rdma_note),
            )| NodeInfo {
                name,
                zone,
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

pub(super) fn pool_usages() -> impl Strategy<Value = PoolUsage> {
    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(used, scrubbing, free, largest_free)| PoolUsage {
            used,
            scrubbing,
            free,
            largest_free,
        },
    )
}

pub(super) fn agent_statuses() -> impl Strategy<Value = AgentStatus> {
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

pub(super) fn node_statuses() -> impl Strategy<Value = NodeStatus> {
    (
        node_infos(),
        any::<u64>(),
        node_states(),
        any::<u64>(),
        pool_usages(),
        any::<u64>(),
        any::<u64>(),
        option::of((any::<u64>(), ".{0,40}")),
    )
        .prop_map(
            |(
                info,
                used,
                state,
                last_heartbeat_ms_ago,
                pool,
                state_since_unix_ms,
                incarnation,
                drain,
            )| {
                NodeStatus {
                    info,
                    used,
                    state,
                    last_heartbeat_ms_ago,
                    pool,
                    state_since_unix_ms,
                    incarnation,
                    drain: drain.map(|(left, note)| Drain { left, note }),
                }
            },
        )
}

pub(super) fn node_lists() -> impl Strategy<Value = NodeList> {
    (vec(node_statuses(), 0..3), any::<u64>()).prop_map(|(nodes, recovering_ms)| NodeList {
        nodes,
        recovering_ms,
    })
}

pub(super) fn session_reports() -> impl Strategy<Value = SessionReport> {
    (owners(), vec(1..=MAX_ID, 0..4)).prop_map(|(who, attached)| SessionReport { who, attached })
}

pub(super) fn registrations() -> impl Strategy<Value = Registration> {
    (
        node_infos(),
        1..=u64::MAX,
        any::<u64>(),
        vec(allocations(), 0..3),
        vec(session_reports(), 0..3),
        any::<u64>(),
        (0..=MAX_ID, any::<bool>(), any::<bool>(), any::<u64>()),
    )
        .prop_map(
            |(
                node,
                incarnation,
                master_incarnation,
                held,
                sessions,
                next_session_seq,
                (max_held_id, more, draining, copies_generation),
            )| Registration {
                node,
                incarnation,
                master_incarnation,
                held,
                sessions,
                next_session_seq,
                max_held_id,
                more,
                draining,
                copies_generation,
            },
        )
}

pub(super) fn registereds() -> impl Strategy<Value = Registered> {
    (
        any::<u64>(),
        any::<u64>(),
        vec(1..=MAX_ID, 0..4),
        vec(text(), 0..4),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(heartbeat_interval_ms, master_incarnation, release, peers, peers_version, term)| {
                Registered {
                    heartbeat_interval_ms,
                    master_incarnation,
                    release,
                    peers,
                    peers_version,
                    term,
                }
            },
        )
}

pub(super) fn heartbeats() -> impl Strategy<Value = Heartbeat> {
    (
        node_names(),
        option::of(pool_usages()),
        any::<u64>(),
        vec(1..=MAX_ID, 0..4),
        vec(text(), 0..3),
        any::<u64>(),
        vec(1..=MAX_ID, 0..4),
    )
        .prop_map(
            |(name, pool, incarnation, held, ended_sessions, peers_version, filling)| Heartbeat {
                name,
                pool,
                incarnation,
                held,
                ended_sessions,
                peers_version,
                filling,
            },
        )
}

pub(super) fn heartbeat_replies() -> impl Strategy<Value = HeartbeatReply> {
    (
        any::<bool>(),
        vec(1..=MAX_ID, 0..4),
        vec(text(), 0..4),
        any::<u64>(),
        any::<bool>(),
        any::<bool>(),
        vec(
            (1..=MAX_ID, vec(ranges(), 0..4))
                .prop_map(|(alloc_id, ranges)| Listed { alloc_id, ranges }),
            0..4,
        ),
    )
        .prop_map(
            |(known, release, peers, peers_version, want_full, draining, whole)| HeartbeatReply {
                known,
                release,
                peers,
                peers_version,
                want_full,
                draining,
                whole,
            },
        )
}

pub(super) fn ranges() -> impl Strategy<Value = Range> {
    (0..=MAX_ALLOCATION, 0..=MAX_ALLOCATION)
        .prop_map(|(alloc_offset, len)| Range { alloc_offset, len })
}

/// The master's reservation of an allocation it recorded: its id and key.
pub(super) fn reservations() -> impl Strategy<Value = Reservation> {
    (
        allocations(),
        vec(any::<u8>(), KEY_LEN),
        vec(ranges(), 0..4),
        fabrics(),
        option::of(any::<u32>()),
        (
            0..MAX_REPLICAS,
            vec(node_names(), 0..MAX_REPLICAS as usize),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(record, access_key, ranges, fabric, gpu, (copy, replicas, fill))| Reservation {
                fill,
                // A replica's reservation names no replicas.
                replicas: if copy == 0 { replicas } else { Vec::new() },
                copy,
                alloc_id: record.id,
                access_key,
                ranges,
                record,
                fabric,
                gpu,
            },
        )
}

pub(super) fn pieces() -> impl Strategy<Value = Piece> {
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

pub(super) fn reserveds() -> impl Strategy<Value = Reserved> {
    (vec(pieces(), 0..4), option::of(pool_usages()))
        .prop_map(|(pieces, pool)| Reserved { pieces, pool })
}

pub(super) fn limits() -> impl Strategy<Value = Limits> {
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

pub(super) fn summaries() -> impl Strategy<Value = Summary> {
    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(bytes, node_bytes, allocations, persistent)| Summary {
            bytes,
            node_bytes,
            allocations,
            persistent,
        },
    )
}

pub(super) fn reports() -> impl Strategy<Value = Report> {
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

pub(super) fn subjects() -> impl Strategy<Value = Subject> {
    prop_oneof![Just(Subject::Default), any::<u32>().prop_map(Subject::User)]
}

/// An endpoint as a port gives it: 24-bit QP number and PSN, an IB MTU.
pub(super) fn endpoints() -> impl Strategy<Value = Endpoint> {
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

/// A replica of some of a primary's bytes: ranges in order, never
/// overlapping, none empty.
pub(super) fn replica_shares() -> impl Strategy<Value = ReplicaShare> {
    (node_names(), ordered_ranges(1..4)).prop_map(|(addr, ranges)| ReplicaShare {
        data_addr: addr,
        ranges,
    })
}

/// `count` ranges in order, never overlapping, none empty.
fn ordered_ranges(count: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Range>> {
    vec((any::<u32>(), 1..=u32::MAX), count).prop_map(|gaps| {
        let mut at = 0u64;
        gaps.into_iter()
            .map(|(gap, len)| {
                let r = Range {
                    alloc_offset: at + u64::from(gap),
                    len: u64::from(len),
                };
                at = r.alloc_offset + r.len;
                r
            })
            .collect()
    })
}

/// A release of an allocation: all of it, or some of its bytes.
pub(super) fn releases() -> impl Strategy<Value = Release> {
    (0..=MAX_ID, ordered_ranges(0..4)).prop_map(|(alloc_id, ranges)| Release { alloc_id, ranges })
}

/// A copy change: promoted ranges and the replicas left (distinct).
pub(super) fn set_copies() -> impl Strategy<Value = SetCopies> {
    (
        0..=MAX_ID,
        vec(ranges(), 0..3),
        vec(replica_shares(), 0..4),
        any::<u64>(),
    )
        .prop_map(|(alloc_id, promote, mut replicas, generation)| {
            let mut seen = std::collections::BTreeSet::new();
            replicas.retain(|r| seen.insert(r.data_addr.clone()));
            SetCopies {
                alloc_id,
                promote,
                fill: replicas
                    .iter()
                    .take(1)
                    .map(|r| r.data_addr.clone())
                    .collect(),
                replicas,
                generation,
            }
        })
}
