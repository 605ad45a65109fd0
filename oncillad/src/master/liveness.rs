//! Whether an agent is alive, from the master's point of view: `up` while
//! it heartbeats, `suspect` after `suspect_after` of silence, `down` after
//! `down_after`, and since when, and logging each node's changes once
//! ([`Master::tick`]). The thresholds are pure time arithmetic; this module
//! never changes the allocation table or reaches the network.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use oncilla_model::node::NodeState;

use super::state::State;
use super::{AgentLink, Master};

/// The master's thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// How often agents heartbeat.
    pub heartbeat: Duration,
    /// Silence after which a node is `suspect` (gets no new memory).
    pub suspect_after: Duration,
    /// Silence after which a node is `down` (its allocations are degraded).
    pub down_after: Duration,
}

impl Liveness {
    /// Thresholds of three and five heartbeats.
    pub fn from_heartbeat(heartbeat: Duration) -> Self {
        Self {
            heartbeat,
            suspect_after: heartbeat * 3,
            down_after: heartbeat * 5,
        }
    }

    /// How long a restarted master waits for agents to re-register before
    /// it changes the table: every live agent heartbeats (and learns it
    /// must register) well within this.
    pub fn recovery(&self) -> Duration {
        self.suspect_after
    }
}

/// When a node was last heard from and when it last came up.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    pub last: Instant,
    /// Unix ms at which the node (re)registered or came back from silence.
    pub up_since_ms: u64,
}

impl Seen {
    pub fn now() -> Self {
        Self {
            last: Instant::now(),
            up_since_ms: unix_ms(),
        }
    }

    /// The node's state and the unix ms at which it entered it.
    pub fn state(&self, l: &Liveness) -> (NodeState, u64) {
        let silent = self.last.elapsed();
        let at = |threshold: Duration| {
            let ago = silent.saturating_sub(threshold);
            unix_ms().saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX))
        };
        if silent > l.down_after {
            (NodeState::Down, at(l.down_after))
        } else if silent > l.suspect_after {
            (NodeState::Suspect, at(l.suspect_after))
        } else {
            (NodeState::Up, self.up_since_ms)
        }
    }

    /// Records a heartbeat; returns the state the node was in before it.
    pub fn heard(&mut self, l: &Liveness) -> NodeState {
        let (before, _) = self.state(l);
        if before != NodeState::Up {
            self.up_since_ms = unix_ms();
        }
        self.last = Instant::now();
        before
    }
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl<L: AgentLink> Master<L> {
    /// Counts a request that start `incarnation` of node `node` made
    /// itself (authenticated as that node) as hearing from it, as a
    /// heartbeat does: a node that is asking is alive, even when its
    /// heartbeat is late. A start the master does not know changes nothing.
    pub fn heard_from(&self, node: &str, incarnation: u64) {
        let mut st = self.lock();
        if let Some(n) = st.nodes.get_mut(node) {
            if n.incarnation == incarnation {
                n.seen.heard(&self.liveness);
            }
        }
    }

    /// Logs every node whose state changed since the last call (call it
    /// about once per heartbeat interval).
    pub fn tick(&self) {
        let mut st = self.lock();
        let degraded_on = |st: &State, node: &str| {
            st.allocs
                .values()
                .filter(|r| r.alloc.extents.iter().any(|e| e.node == node))
                .count()
        };
        let mut changes = Vec::new();
        for n in st.nodes.values_mut() {
            let (state, _) = n.seen.state(&self.liveness);
            if state != n.logged {
                changes.push((n.info.name.clone(), n.logged, state));
                n.logged = state;
            }
        }
        for (node, from, to) in changes {
            let allocations = degraded_on(&st, &node);
            // A tick that came late saw an up node already down: it was
            // suspect on the way, and the log says so in order.
            if (from, to) == (NodeState::Up, NodeState::Down) {
                tracing::warn!(%node, to = NodeState::Suspect.name(), "node missed heartbeats");
            }
            match to {
                NodeState::Up => {
                    tracing::info!(%node, from = from.name(), "node up again");
                }
                NodeState::Down => tracing::warn!(
                    %node,
                    silent_ms = self.liveness.down_after.as_millis(),
                    degraded_allocations = allocations,
                    "node down: missed its heartbeats"
                ),
                NodeState::Suspect => {
                    tracing::warn!(%node, to = to.name(), "node missed heartbeats");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_turns_suspect_then_down_and_a_heartbeat_brings_it_back() {
        // Thresholds far above a stall of a loaded machine between two
        // lines.
        let l = Liveness {
            heartbeat: Duration::from_millis(10),
            suspect_after: Duration::from_millis(200),
            down_after: Duration::from_millis(600),
        };
        let mut s = Seen::now();
        let registered = s.up_since_ms;
        assert_eq!(s.state(&l), (NodeState::Up, registered));
        s.last = Instant::now() - Duration::from_millis(300);
        let (state, since) = s.state(&l);
        assert_eq!(state, NodeState::Suspect);
        // Suspect since about 100 ms ago.
        assert!((unix_ms() - since).abs_diff(100) < 250, "{since}");
        s.last = Instant::now() - Duration::from_millis(1000);
        assert_eq!(s.state(&l).0, NodeState::Down);
        assert_eq!(s.heard(&l), NodeState::Down);
        assert_eq!(s.state(&l).0, NodeState::Up);
        assert!(s.up_since_ms >= registered);
        assert_eq!(
            Liveness::from_heartbeat(l.heartbeat).down_after,
            l.heartbeat * 5
        );
    }
}
