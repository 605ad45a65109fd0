//! Allocations, their requests and their owners: wire <-> domain.

use oncilla_model::alloc::{
    AllocRef, AllocSpec, Allocation, Extent, Health, Invalid, NodeShare, Owner, Placement,
    RdmaRegion, KEY_LEN, MAX_EXTENTS, MAX_ID, MAX_REPLICAS,
};

use super::{fabric, fabric_wire, kind, kind_wire, policy, policy_wire, WireError};
use crate::pb;

impl From<NodeShare> for pb::NodeShare {
    fn from(s: NodeShare) -> Self {
        Self {
            node: s.node,
            weight: s.weight,
        }
    }
}

impl TryFrom<pb::Placement> for Placement {
    type Error = WireError;
    fn try_from(p: pb::Placement) -> Result<Self, WireError> {
        if p.replicas > MAX_REPLICAS {
            return Err(Invalid::Replicas(p.replicas).into());
        }
        Ok(Self {
            policy: policy(p.policy)?,
            nodes: p
                .nodes
                .into_iter()
                .map(|s| NodeShare {
                    node: s.node,
                    weight: s.weight,
                })
                .collect(),
            stripe: p.stripe,
            gpu: p.gpu,
            replicas: p.replicas,
        })
    }
}

impl From<Placement> for pb::Placement {
    fn from(p: Placement) -> Self {
        Self {
            policy: policy_wire(p.policy),
            nodes: p.nodes.into_iter().map(Into::into).collect(),
            stripe: p.stripe,
            gpu: p.gpu,
            replicas: p.replicas,
        }
    }
}

impl TryFrom<pb::AllocSpec> for AllocSpec {
    type Error = WireError;
    fn try_from(s: pb::AllocSpec) -> Result<Self, WireError> {
        Ok(AllocSpec::new(
            s.size,
            kind(s.kind)?.ok_or(Invalid::NoKind)?,
            s.placement
                .map(Placement::try_from)
                .transpose()?
                .unwrap_or_default(),
            s.name,
            s.persistent,
            fabric(s.fabric)?,
        )?
        .shared(s.shared))
    }
}

impl From<AllocSpec> for pb::AllocSpec {
    fn from(s: AllocSpec) -> Self {
        Self {
            size: s.size,
            kind: kind_wire(Some(s.kind)),
            placement: Some(s.placement.into()),
            name: s.name,
            persistent: s.persistent,
            fabric: fabric_wire(s.fabric),
            shared: s.shared,
        }
    }
}

impl TryFrom<pb::AllocRef> for AllocRef {
    type Error = WireError;
    fn try_from(r: pb::AllocRef) -> Result<Self, WireError> {
        Ok(AllocRef::new(r.id, r.name)?)
    }
}

/// The reference a request names; [`WireError::Missing`] when it names none.
///
/// # Errors
/// As said.
pub fn alloc_ref(r: Option<pb::AllocRef>) -> Result<AllocRef, WireError> {
    r.ok_or(WireError::Missing("the allocation (id or name)"))?
        .try_into()
}

impl From<AllocRef> for pb::AllocRef {
    fn from(r: AllocRef) -> Self {
        match r {
            AllocRef::Id(id) => Self {
                id,
                name: String::new(),
            },
            AllocRef::Name(name) => Self { id: 0, name },
        }
    }
}

impl From<pb::Owner> for Owner {
    fn from(o: pb::Owner) -> Self {
        Self {
            session_id: o.session_id,
            node: o.node,
            pid: o.pid,
            program: o.program,
            agent_incarnation: o.agent_incarnation,
            session_seq: o.session_seq,
            uid: o.uid,
        }
    }
}

impl From<Owner> for pb::Owner {
    fn from(o: Owner) -> Self {
        Self {
            session_id: o.session_id,
            node: o.node,
            pid: o.pid,
            program: o.program,
            agent_incarnation: o.agent_incarnation,
            session_seq: o.session_seq,
            uid: o.uid,
        }
    }
}

impl From<pb::RdmaRegion> for RdmaRegion {
    fn from(r: pb::RdmaRegion) -> Self {
        Self {
            device: r.device,
            port: r.port,
            addr: r.addr,
            rkey: r.rkey,
            incarnation: r.incarnation,
        }
    }
}

impl From<RdmaRegion> for pb::RdmaRegion {
    fn from(r: RdmaRegion) -> Self {
        Self {
            device: r.device,
            port: r.port,
            addr: r.addr,
            rkey: r.rkey,
            incarnation: r.incarnation,
        }
    }
}

impl TryFrom<pb::Extent> for Extent {
    type Error = WireError;
    fn try_from(e: pb::Extent) -> Result<Self, WireError> {
        Ok(Self {
            node: e.node,
            alloc_offset: e.alloc_offset,
            len: e.len,
            pool_offset: e.pool_offset,
            data_addr: e.data_addr,
            fabric: fabric(e.fabric)?,
            agent_addr: e.agent_addr,
            gpu: e.gpu,
            rdma: e.rdma.into_iter().map(Into::into).collect(),
            copy: e.copy,
            filling: e.filling,
        })
    }
}

impl From<Extent> for pb::Extent {
    fn from(e: Extent) -> Self {
        Self {
            node: e.node,
            alloc_offset: e.alloc_offset,
            len: e.len,
            pool_offset: e.pool_offset,
            data_addr: e.data_addr,
            fabric: fabric_wire(e.fabric),
            agent_addr: e.agent_addr,
            gpu: e.gpu,
            rdma: e.rdma.into_iter().map(Into::into).collect(),
            copy: e.copy,
            filling: e.filling,
        }
    }
}

fn health(value: i32) -> Result<Health, WireError> {
    Ok(match super::known::<pb::Health>("health", value)? {
        pb::Health::Healthy => Health::Healthy,
        pb::Health::Degraded => Health::Degraded,
        pb::Health::Lost => Health::Lost,
    })
}

fn health_wire(h: Health) -> i32 {
    (match h {
        Health::Healthy => pb::Health::Healthy,
        Health::Degraded => pb::Health::Degraded,
        Health::Lost => pb::Health::Lost,
    }) as i32
}

impl TryFrom<pb::Allocation> for Allocation {
    type Error = WireError;
    fn try_from(a: pb::Allocation) -> Result<Self, WireError> {
        if !a.access_key.is_empty() && a.access_key.len() != KEY_LEN {
            return Err(Invalid::KeyLength(a.access_key.len()).into());
        }
        if a.id > MAX_ID {
            return Err(Invalid::Id(a.id).into());
        }
        if a.extents.len() + a.replicas.len() > MAX_EXTENTS {
            return Err(Invalid::Extents(a.extents.len() + a.replicas.len()).into());
        }
        if a.extents.iter().any(|e| e.copy != 0) || a.replicas.iter().any(|e| e.copy == 0) {
            return Err(Invalid::Copies.into());
        }
        Ok(Self {
            id: a.id,
            size: a.size,
            kind: kind(a.kind)?.ok_or(Invalid::NoKind)?,
            extents: a
                .extents
                .into_iter()
                .map(Extent::try_from)
                .collect::<Result<_, _>>()?,
            replicas: a
                .replicas
                .into_iter()
                .map(Extent::try_from)
                .collect::<Result<_, _>>()?,
            access_key: a.access_key,
            owner: a.owner.map(Into::into),
            created_unix_ms: a.created_unix_ms,
            name: a.name,
            attached: a.attached.into_iter().map(Into::into).collect(),
            placement: a
                .placement
                .map(Placement::try_from)
                .transpose()?
                .unwrap_or_default(),
            origin_node: a.origin_node,
            health: health(a.health)?,
            health_notes: a.health_notes,
            user: a.user,
            shared: a.shared,
            moving: a.moving,
        })
    }
}

impl From<Allocation> for pb::Allocation {
    fn from(a: Allocation) -> Self {
        Self {
            id: a.id,
            size: a.size,
            kind: kind_wire(Some(a.kind)),
            extents: a.extents.into_iter().map(Into::into).collect(),
            replicas: a.replicas.into_iter().map(Into::into).collect(),
            access_key: a.access_key,
            owner: a.owner.map(Into::into),
            created_unix_ms: a.created_unix_ms,
            name: a.name,
            attached: a.attached.into_iter().map(Into::into).collect(),
            placement: Some(a.placement.into()),
            origin_node: a.origin_node,
            health: health_wire(a.health),
            health_notes: a.health_notes,
            user: a.user,
            shared: a.shared,
            moving: a.moving,
        }
    }
}
