//! Whether an agent is alive, from the master's point of view: hearing
//! from a node ([`Master::heard_from`]) and logging each node's changes
//! of state once ([`Master::tick`]), which also hands a node that went
//! down to `copies.rs` (replicated allocations drop its copies) and sends
//! what that decided; the states themselves (`up`, `suspect`, `down` and
//! since when) are pure time arithmetic in `node.rs`. This module changes
//! no record itself.

use oncilla_model::node::NodeState;

use super::state::State;
use super::{AgentLink, Master};

impl<L: AgentLink> Master<L> {
    /// Counts a request that start `incarnation` of node `node` made
    /// itself (authenticated as that node) as hearing from it, as a
    /// heartbeat does: a node that is asking is alive, even when its
    /// heartbeat is late. A start the master does not know changes nothing.
    pub fn heard_from(&self, node: &str, incarnation: u64) {
        let mut st = self.lock();
        if let Some(n) = st.nodes.get_mut(node) {
            if n.incarnation == incarnation && n.seen.heard(&self.liveness) != NodeState::Up {
                n.full_due = true;
            }
        }
    }

    /// Logs every node whose state changed since the last call, drops the
    /// copies of replicated allocations on nodes that went down, and tells
    /// agents the copy changes they still miss and the bytes they must
    /// still let go of (call it about once per heartbeat interval).
    pub async fn tick(&self) {
        self.log_states();
        self.send_copies().await;
        self.send_give_backs().await;
    }

    fn log_states(&self) {
        let mut st = self.lock();
        let degraded_on =
            |st: &State, node: &str| st.allocs.values().filter(|r| r.alloc.held_on(node)).count();
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
                NodeState::Down => {
                    tracing::warn!(
                        %node,
                        silent_ms = self.liveness.down_after.as_millis(),
                        degraded_allocations = allocations,
                        "node down: missed its heartbeats"
                    );
                    Self::drop_copies(&mut st, &node);
                }
                NodeState::Suspect => {
                    tracing::warn!(%node, to = to.name(), "node missed heartbeats");
                }
            }
        }
    }
}
