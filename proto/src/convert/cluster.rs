//! Master <-> agent messages (membership and reservation): wire <-> domain.

use oncilla_model::alloc::{Allocation, Invalid, MAX_BATCH, MAX_REPLICAS};
use oncilla_model::cluster::{
    Heartbeat, HeartbeatReply, Listed, Piece, Range, Registered, Registration, Release,
    ReplicaShare, Reservation, Reserved, SessionReport, SetCopies,
};

use super::{fabric, fabric_wire, WireError};
use crate::pb;

/// Longest data address a reservation may name (`host:port`; a DNS name is
/// at most 253 bytes).
const MAX_ADDR: usize = 261;

/// Most replica nodes a copy change names for one primary (each holds
/// some of its bytes; far past any cluster's node count here).
const MAX_REPLICA_NODES: usize = 4096;

impl TryFrom<pb::RegisterRequest> for Registration {
    type Error = WireError;
    fn try_from(r: pb::RegisterRequest) -> Result<Self, WireError> {
        let node: oncilla_model::node::NodeInfo =
            r.node.ok_or(WireError::Missing("the node"))?.into();
        oncilla_model::node::check_zone(&node.zone)?;
        Ok(Self {
            node,
            incarnation: r.incarnation,
            master_incarnation: r.master_incarnation,
            held: r
                .held
                .into_iter()
                .map(Allocation::try_from)
                .collect::<Result<_, _>>()?,
            sessions: r
                .sessions
                .into_iter()
                .map(|s| {
                    Ok(SessionReport {
                        who: s.who.ok_or(WireError::Missing("a session's owner"))?.into(),
                        attached: s.attached,
                    })
                })
                .collect::<Result<_, WireError>>()?,
            next_session_seq: r.next_session_seq,
            max_held_id: match r.max_held_id {
                id if id > oncilla_model::alloc::MAX_ID => {
                    return Err(oncilla_model::alloc::Invalid::Id(id).into())
                }
                id => id,
            },
            more: r.more,
            draining: r.draining,
            copies_generation: r.copies_generation,
        })
    }
}

impl From<Registration> for pb::RegisterRequest {
    fn from(r: Registration) -> Self {
        Self {
            node: Some(r.node.into()),
            incarnation: r.incarnation,
            master_incarnation: r.master_incarnation,
            held: r.held.into_iter().map(Into::into).collect(),
            sessions: r
                .sessions
                .into_iter()
                .map(|s| pb::SessionReport {
                    who: Some(s.who.into()),
                    attached: s.attached,
                })
                .collect(),
            next_session_seq: r.next_session_seq,
            max_held_id: r.max_held_id,
            more: r.more,
            draining: r.draining,
            copies_generation: r.copies_generation,
        }
    }
}

impl From<pb::RegisterReply> for Registered {
    fn from(r: pb::RegisterReply) -> Self {
        Self {
            heartbeat_interval_ms: r.heartbeat_interval_ms,
            master_incarnation: r.master_incarnation,
            release: r.release,
            peers: r.peers,
            peers_version: r.peers_version,
            term: r.term,
        }
    }
}

impl From<Registered> for pb::RegisterReply {
    fn from(r: Registered) -> Self {
        Self {
            heartbeat_interval_ms: r.heartbeat_interval_ms,
            master_incarnation: r.master_incarnation,
            release: r.release,
            peers: r.peers,
            peers_version: r.peers_version,
            term: r.term,
        }
    }
}

impl From<pb::HeartbeatRequest> for Heartbeat {
    fn from(h: pb::HeartbeatRequest) -> Self {
        Self {
            name: h.name,
            pool: h.pool.map(Into::into),
            incarnation: h.incarnation,
            held: h.held,
            ended_sessions: h.ended_sessions,
            peers_version: h.peers_version,
            filling: h.filling,
        }
    }
}

impl From<Heartbeat> for pb::HeartbeatRequest {
    fn from(h: Heartbeat) -> Self {
        Self {
            name: h.name,
            pool: h.pool.map(Into::into),
            incarnation: h.incarnation,
            held: h.held,
            ended_sessions: h.ended_sessions,
            peers_version: h.peers_version,
            filling: h.filling,
        }
    }
}

impl From<pb::HeartbeatReply> for HeartbeatReply {
    fn from(h: pb::HeartbeatReply) -> Self {
        Self {
            known: h.known,
            release: h.release,
            peers: h.peers,
            peers_version: h.peers_version,
            want_full: h.want_full,
            draining: h.draining,
            whole: h.whole.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<HeartbeatReply> for pb::HeartbeatReply {
    fn from(h: HeartbeatReply) -> Self {
        Self {
            known: h.known,
            release: h.release,
            peers: h.peers,
            peers_version: h.peers_version,
            want_full: h.want_full,
            draining: h.draining,
            whole: h.whole.into_iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<pb::ReserveRequest> for Reservation {
    type Error = WireError;
    fn try_from(r: pb::ReserveRequest) -> Result<Self, WireError> {
        let copies = u32::try_from(r.replicas.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1);
        if r.copy >= MAX_REPLICAS || copies > MAX_REPLICAS {
            return Err(Invalid::Replicas(r.copy.max(copies)).into());
        }
        if r.copy > 0 && !r.replicas.is_empty()
            || r.replicas
                .iter()
                .any(|a| a.is_empty() || a.len() > MAX_ADDR)
        {
            return Err(Invalid::Copies.into());
        }
        Ok(Self {
            alloc_id: r.alloc_id,
            access_key: r.access_key,
            ranges: r.ranges.into_iter().map(Into::into).collect(),
            record: r
                .record
                .ok_or(WireError::Missing("the allocation record"))?
                .try_into()?,
            fabric: fabric(r.fabric)?,
            gpu: r.gpu,
            copy: r.copy,
            replicas: r.replicas,
            fill: r.fill,
        })
    }
}

impl From<Reservation> for pb::ReserveRequest {
    fn from(r: Reservation) -> Self {
        Self {
            alloc_id: r.alloc_id,
            access_key: r.access_key,
            ranges: r.ranges.into_iter().map(Into::into).collect(),
            record: Some(r.record.into()),
            fabric: fabric_wire(r.fabric),
            gpu: r.gpu,
            copy: r.copy,
            replicas: r.replicas,
            fill: r.fill,
        }
    }
}

impl TryFrom<pb::ReserveBatch> for Vec<Reservation> {
    type Error = WireError;
    fn try_from(b: pb::ReserveBatch) -> Result<Self, WireError> {
        let n = b.reservations.len();
        if n == 0 || n > MAX_BATCH as usize {
            return Err(Invalid::BatchCount(n as u64).into());
        }
        b.reservations.into_iter().map(TryInto::try_into).collect()
    }
}

impl From<Vec<Reservation>> for pb::ReserveBatch {
    fn from(b: Vec<Reservation>) -> Self {
        Self {
            reservations: b.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<pb::ReserveBatchReply> for Vec<Reserved> {
    fn from(r: pb::ReserveBatchReply) -> Self {
        r.reserved.into_iter().map(Into::into).collect()
    }
}

impl From<Vec<Reserved>> for pb::ReserveBatchReply {
    fn from(r: Vec<Reserved>) -> Self {
        Self {
            reserved: r.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<Vec<Allocation>> for pb::AllocationBatch {
    fn from(all: Vec<Allocation>) -> Self {
        Self {
            allocations: all.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<pb::Piece> for Piece {
    fn from(p: pb::Piece) -> Self {
        Self {
            alloc_offset: p.alloc_offset,
            len: p.len,
            pool_offset: p.pool_offset,
            rdma: p.rdma.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<Piece> for pb::Piece {
    fn from(p: Piece) -> Self {
        Self {
            alloc_offset: p.alloc_offset,
            len: p.len,
            pool_offset: p.pool_offset,
            rdma: p.rdma.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<pb::ReserveReply> for Reserved {
    fn from(r: pb::ReserveReply) -> Self {
        Self {
            pieces: r.pieces.into_iter().map(Into::into).collect(),
            pool: r.pool.map(Into::into),
        }
    }
}

impl From<Reserved> for pb::ReserveReply {
    fn from(r: Reserved) -> Self {
        Self {
            pieces: r.pieces.into_iter().map(Into::into).collect(),
            pool: r.pool.map(Into::into),
        }
    }
}

impl TryFrom<pb::SetCopiesRequest> for SetCopies {
    type Error = WireError;
    fn try_from(r: pb::SetCopiesRequest) -> Result<Self, WireError> {
        let ranges: usize = r.replicas.iter().map(|s| s.ranges.len()).sum();
        if ranges > oncilla_model::alloc::MAX_EXTENTS
            || r.promote.len() > oncilla_model::alloc::MAX_EXTENTS
        {
            return Err(Invalid::Extents(ranges.max(r.promote.len())).into());
        }
        if r.replicas.len() > MAX_REPLICA_NODES {
            return Err(Invalid::Copies.into());
        }
        if r.fill.len() > MAX_REPLICA_NODES
            || r.replicas.iter().any(|s| s.data_addr.len() > MAX_ADDR)
        {
            return Err(Invalid::Copies.into());
        }
        let c = Self {
            alloc_id: r.alloc_id,
            promote: r.promote.into_iter().map(Into::into).collect(),
            replicas: r
                .replicas
                .into_iter()
                .map(|s| ReplicaShare {
                    data_addr: s.data_addr,
                    ranges: s.ranges.into_iter().map(Into::into).collect(),
                })
                .collect(),
            fill: r.fill,
            generation: r.generation,
        };
        if !c.well_formed() {
            return Err(Invalid::Copies.into());
        }
        Ok(c)
    }
}

impl TryFrom<pb::ReleaseRequest> for Release {
    type Error = WireError;
    fn try_from(r: pb::ReleaseRequest) -> Result<Self, WireError> {
        if r.ranges.len() > oncilla_model::alloc::MAX_EXTENTS {
            return Err(Invalid::Extents(r.ranges.len()).into());
        }
        let ranges: Vec<Range> = r.ranges.into_iter().map(Into::into).collect();
        if !Range::in_order(&ranges) {
            return Err(Invalid::Ranges.into());
        }
        Ok(Self {
            alloc_id: r.alloc_id,
            ranges,
        })
    }
}

impl From<Release> for pb::ReleaseRequest {
    fn from(r: Release) -> Self {
        Self {
            alloc_id: r.alloc_id,
            ranges: r.ranges.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<pb::Range> for Range {
    fn from(g: pb::Range) -> Self {
        Self {
            alloc_offset: g.alloc_offset,
            len: g.len,
        }
    }
}

impl From<Range> for pb::Range {
    fn from(g: Range) -> Self {
        Self {
            alloc_offset: g.alloc_offset,
            len: g.len,
        }
    }
}

impl From<SetCopies> for pb::SetCopiesRequest {
    fn from(s: SetCopies) -> Self {
        Self {
            alloc_id: s.alloc_id,
            promote: s.promote.into_iter().map(Into::into).collect(),
            replicas: s
                .replicas
                .into_iter()
                .map(|r| pb::ReplicaShare {
                    data_addr: r.data_addr,
                    ranges: r.ranges.into_iter().map(Into::into).collect(),
                })
                .collect(),
            fill: s.fill,
            generation: s.generation,
        }
    }
}

impl From<pb::Listed> for Listed {
    fn from(l: pb::Listed) -> Self {
        Self {
            alloc_id: l.alloc_id,
            ranges: l.ranges.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<Listed> for pb::Listed {
    fn from(l: Listed) -> Self {
        Self {
            alloc_id: l.alloc_id,
            ranges: l.ranges.into_iter().map(Into::into).collect(),
        }
    }
}
