//! Nodes, their pools and states: wire <-> domain.

use oncilla_model::node::{
    AgentStatus, Drain, GpuDevice, NodeInfo, NodeList, NodeState, NodeStatus, PoolUsage, RdmaPort,
    MAX_DRAIN_NOTE,
};

use super::WireError;
use crate::pb;

impl From<pb::GpuDevice> for GpuDevice {
    fn from(g: pb::GpuDevice) -> Self {
        Self {
            index: g.index,
            name: g.name,
            total: g.total,
            free: g.free,
        }
    }
}

impl From<GpuDevice> for pb::GpuDevice {
    fn from(g: GpuDevice) -> Self {
        Self {
            index: g.index,
            name: g.name,
            total: g.total,
            free: g.free,
        }
    }
}

impl From<pb::RdmaPort> for RdmaPort {
    fn from(p: pb::RdmaPort) -> Self {
        Self {
            device: p.device,
            port: p.port,
            link_layer: p.link_layer,
            state: p.state,
            active_mtu: p.active_mtu,
            gids: p.gids,
            numa_node: p.numa_node,
            lid: p.lid,
            rate: p.rate,
        }
    }
}

impl From<RdmaPort> for pb::RdmaPort {
    fn from(p: RdmaPort) -> Self {
        Self {
            device: p.device,
            port: p.port,
            link_layer: p.link_layer,
            state: p.state,
            active_mtu: p.active_mtu,
            gids: p.gids,
            numa_node: p.numa_node,
            lid: p.lid,
            rate: p.rate,
        }
    }
}

impl From<pb::NodeInfo> for NodeInfo {
    fn from(n: pb::NodeInfo) -> Self {
        Self {
            name: n.name,
            zone: n.zone,
            agent_addr: n.agent_addr,
            data_addr: n.data_addr,
            capacity: n.capacity,
            fabrics: n.fabrics,
            page_size: n.page_size,
            pool_note: n.pool_note,
            rdma: n.rdma.into_iter().map(Into::into).collect(),
            rdma_note: n.rdma_note,
            gpu_devices: n.gpu_devices.into_iter().map(Into::into).collect(),
            gpu_note: n.gpu_note,
            gpu_rdma: n.gpu_rdma,
            gpu_rdma_note: n.gpu_rdma_note,
        }
    }
}

impl From<NodeInfo> for pb::NodeInfo {
    fn from(n: NodeInfo) -> Self {
        Self {
            name: n.name,
            zone: n.zone,
            agent_addr: n.agent_addr,
            data_addr: n.data_addr,
            capacity: n.capacity,
            fabrics: n.fabrics,
            page_size: n.page_size,
            pool_note: n.pool_note,
            rdma: n.rdma.into_iter().map(Into::into).collect(),
            rdma_note: n.rdma_note,
            gpu_devices: n.gpu_devices.into_iter().map(Into::into).collect(),
            gpu_note: n.gpu_note,
            gpu_rdma: n.gpu_rdma,
            gpu_rdma_note: n.gpu_rdma_note,
        }
    }
}

impl From<pb::PoolUsage> for PoolUsage {
    fn from(p: pb::PoolUsage) -> Self {
        Self {
            used: p.used,
            scrubbing: p.scrubbing,
            free: p.free,
            largest_free: p.largest_free,
        }
    }
}

impl From<PoolUsage> for pb::PoolUsage {
    fn from(p: PoolUsage) -> Self {
        Self {
            used: p.used,
            scrubbing: p.scrubbing,
            free: p.free,
            largest_free: p.largest_free,
        }
    }
}

impl TryFrom<pb::AgentStatus> for AgentStatus {
    type Error = WireError;
    fn try_from(s: pb::AgentStatus) -> Result<Self, WireError> {
        Ok(Self {
            node: s
                .node
                .ok_or(WireError::Missing("agent's node info"))?
                .into(),
            pool: s
                .pool
                .ok_or(WireError::Missing("agent's pool usage"))?
                .into(),
            allocations: s.allocations,
            sessions: s.sessions,
            mappings: s.mappings,
            incarnation: s.incarnation,
            cpu_ns: s.cpu_ns,
        })
    }
}

impl From<AgentStatus> for pb::AgentStatus {
    fn from(s: AgentStatus) -> Self {
        Self {
            node: Some(s.node.into()),
            pool: Some(s.pool.into()),
            allocations: s.allocations,
            sessions: s.sessions,
            mappings: s.mappings,
            incarnation: s.incarnation,
            cpu_ns: s.cpu_ns,
        }
    }
}

/// The node state a wire integer names.
///
/// # Errors
/// [`WireError::UnknownEnum`], also for unspecified.
pub fn node_state(value: i32) -> Result<NodeState, WireError> {
    match super::known::<pb::NodeState>("node state", value)? {
        pb::NodeState::Up => Ok(NodeState::Up),
        pb::NodeState::Suspect => Ok(NodeState::Suspect),
        pb::NodeState::Down => Ok(NodeState::Down),
        pb::NodeState::Unspecified => Err(WireError::UnknownEnum {
            what: "node state",
            value,
        }),
    }
}

/// The wire integer of a node state.
pub fn node_state_wire(s: NodeState) -> i32 {
    (match s {
        NodeState::Up => pb::NodeState::Up,
        NodeState::Suspect => pb::NodeState::Suspect,
        NodeState::Down => pb::NodeState::Down,
    }) as i32
}

impl TryFrom<pb::NodeStatus> for NodeStatus {
    type Error = WireError;
    fn try_from(n: pb::NodeStatus) -> Result<Self, WireError> {
        Ok(Self {
            info: n.info.ok_or(WireError::Missing("node info"))?.into(),
            used: n.used,
            state: node_state(n.state)?,
            last_heartbeat_ms_ago: n.last_heartbeat_ms_ago,
            pool: n.pool.map(Into::into).unwrap_or_default(),
            state_since_unix_ms: n.state_since_unix_ms,
            incarnation: n.incarnation,
            drain: drain(n.draining, n.drain_left, n.drain_note)?,
        })
    }
}

/// A node's drain from its wire fields: none unless `draining`.
fn drain(draining: bool, left: u64, note: String) -> Result<Option<Drain>, WireError> {
    if note.len() > MAX_DRAIN_NOTE {
        return Err(WireError::TooLong("drain note", note.len(), MAX_DRAIN_NOTE));
    }
    Ok(draining.then_some(Drain { left, note }))
}

impl TryFrom<pb::NodeList> for NodeList {
    type Error = WireError;
    fn try_from(l: pb::NodeList) -> Result<Self, WireError> {
        Ok(Self {
            nodes: l
                .nodes
                .into_iter()
                .map(NodeStatus::try_from)
                .collect::<Result<_, _>>()?,
            recovering_ms: l.recovering_ms,
        })
    }
}

impl From<NodeList> for pb::NodeList {
    fn from(l: NodeList) -> Self {
        Self {
            nodes: l.nodes.into_iter().map(Into::into).collect(),
            recovering_ms: l.recovering_ms,
        }
    }
}

impl From<NodeStatus> for pb::NodeStatus {
    fn from(n: NodeStatus) -> Self {
        Self {
            info: Some(n.info.into()),
            used: n.used,
            state: node_state_wire(n.state),
            last_heartbeat_ms_ago: n.last_heartbeat_ms_ago,
            pool: Some(n.pool.into()),
            state_since_unix_ms: n.state_since_unix_ms,
            incarnation: n.incarnation,
            draining: n.drain.is_some(),
            drain_left: n.drain.as_ref().map_or(0, |d| d.left),
            drain_note: n.drain.map(|d| d.note).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_round_trip_and_need_their_info() {
        let list = NodeList {
            nodes: vec![NodeStatus {
                info: NodeInfo {
                    name: "n1".into(),
                    capacity: 1 << 30,
                    rdma: vec![RdmaPort {
                        device: "rxe0".into(),
                        port: 1,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                used: 4096,
                state: NodeState::Suspect,
                last_heartbeat_ms_ago: 7,
                pool: PoolUsage {
                    used: 4096,
                    scrubbing: 1,
                    free: 2,
                    largest_free: 3,
                },
                state_since_unix_ms: 9,
                incarnation: 11,
                drain: Some(Drain {
                    left: 2,
                    note: "no room".into(),
                }),
            }],
            recovering_ms: 5,
        };
        let wire = pb::NodeList::from(list.clone());
        assert_eq!(NodeList::try_from(wire.clone()), Ok(list));
        let mut no_info = wire;
        no_info.nodes[0].info = None;
        assert!(matches!(
            NodeList::try_from(no_info),
            Err(WireError::Missing("node info"))
        ));
    }
}
