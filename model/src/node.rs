//! Nodes as the master knows them: what an agent offers (`NodeInfo`), how
//! full its pool is (`PoolUsage`) and whether it is alive (`NodeState`).
//! Plain data: liveness rules live in the master, discovery in the agent.

/// A GPU of a node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuDevice {
    pub index: u32,
    pub name: String,
    pub total: u64,
    pub free: u64,
}

/// An RDMA port of a node, as discovered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RdmaPort {
    pub device: String,
    pub port: u32,
    pub link_layer: String,
    pub state: String,
    pub active_mtu: u32,
    pub gids: u32,
    pub numa_node: i32,
    pub lid: u32,
    pub rate: String,
}

/// Most bytes of a zone label.
pub const MAX_ZONE: usize = 63;

/// Checks a zone label (a failure domain an agent declares: a rack, a
/// power feed, a host of VMs): empty for none, else a letter or digit
/// first, then letters, digits, '.', '_' and '-', at most [`MAX_ZONE`]
/// bytes, so that it prints in a table cell and a metric label as it is.
///
/// # Errors
/// [`crate::alloc::Invalid::Zone`] (quoting a bounded prefix).
pub fn check_zone(zone: &str) -> Result<(), crate::alloc::Invalid> {
    let ok = zone.is_empty()
        || (zone.len() <= MAX_ZONE
            && zone.starts_with(|c: char| c.is_ascii_alphanumeric())
            && zone
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')));
    if ok {
        Ok(())
    } else {
        Err(crate::alloc::Invalid::Zone(crate::echo::echo(zone)))
    }
}

/// What an agent offers the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInfo {
    pub name: String,
    /// The failure domain it declared ([`check_zone`]; empty: none).
    pub zone: String,
    /// gRPC `host:port` of the agent service.
    pub agent_addr: String,
    /// TCP data `host:port`.
    pub data_addr: String,
    /// Bytes of host memory in its pool.
    pub capacity: u64,
    /// Fabrics it serves ("tcp", "shm", "verbs").
    pub fabrics: Vec<String>,
    /// Its pool's page size (0: the default page).
    pub page_size: u64,
    pub pool_note: String,
    pub rdma: Vec<RdmaPort>,
    pub rdma_note: String,
    pub gpu_devices: Vec<GpuDevice>,
    pub gpu_note: String,
    /// How device memory is registered for RDMA (empty: it is not).
    pub gpu_rdma: String,
    pub gpu_rdma_note: String,
}

impl NodeInfo {
    /// Its pool's page size.
    pub fn page(&self) -> u64 {
        match self.page_size {
            0 => crate::PAGE,
            p => p,
        }
    }

    /// Whether it serves the verbs fabric.
    pub fn has_verbs(&self) -> bool {
        self.fabrics.iter().any(|f| f == "verbs")
    }
}

/// A node's pool, as the agent reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolUsage {
    pub used: u64,
    pub scrubbing: u64,
    pub free: u64,
    pub largest_free: u64,
}

/// Whether a node is alive, as its heartbeats say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Up,
    /// Silent past the suspect threshold: gets no new memory.
    Suspect,
    /// Silent past the down threshold: its allocations are degraded.
    Down,
}

impl NodeState {
    /// "up", "suspect", "down".
    pub fn name(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Suspect => "suspect",
            NodeState::Down => "down",
        }
    }
}

/// A node as the master shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub info: NodeInfo,
    /// Bytes reserved on it by allocations.
    pub used: u64,
    pub state: NodeState,
    pub last_heartbeat_ms_ago: u64,
    pub pool: PoolUsage,
    pub state_since_unix_ms: u64,
    pub incarnation: u64,
    /// Set while the node is being drained (`ocmctl drain`).
    pub drain: Option<Drain>,
}

/// A node being drained: nothing new is placed on it, and what it holds
/// moves to other nodes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Drain {
    /// Allocations it still holds bytes of (0: it may be stopped with
    /// nothing lost).
    pub left: u64,
    /// Why the last move off it could not be made (empty: none failed).
    pub note: String,
}

/// Longest [`Drain::note`] shown (a longer one is cut).
pub const MAX_DRAIN_NOTE: usize = 1024;

/// Every node the master knows, and how long a master that just started
/// still waits for agents to re-register before it changes its table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeList {
    pub nodes: Vec<NodeStatus>,
    pub recovering_ms: u64,
}

/// An agent's own account of itself (`Agent.Status`): what it offers, its
/// pool, what it holds and the CPU time it has used.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AgentStatus {
    pub node: NodeInfo,
    pub pool: PoolUsage,
    pub allocations: u32,
    pub sessions: u32,
    /// Local processes holding a mapping of memory held here.
    pub mappings: u32,
    pub incarnation: u64,
    /// CPU time the agent process has used (user + system), nanoseconds.
    pub cpu_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones_are_labels_or_nothing() {
        for ok in [
            "",
            "a",
            "rack-1",
            "eu-west.2b",
            "0_power-feed",
            &"z".repeat(MAX_ZONE),
        ] {
            assert!(check_zone(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "-a",
            ".a",
            "rack 1",
            "rack/1",
            "r\nack",
            "räck",
            &"z".repeat(MAX_ZONE + 1),
        ] {
            assert!(check_zone(bad).is_err(), "{bad:?}");
        }
    }
}
