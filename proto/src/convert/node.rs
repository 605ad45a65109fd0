//! Nodes, their pools and states: wire <-> domain.

use oncilla_model::node::{GpuDevice, NodeInfo, NodeState, NodeStatus, PoolUsage, RdmaPort};

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
        }
    }
}
