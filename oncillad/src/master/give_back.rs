//! Bytes a node must let go of while it keeps other bytes of the same
//! allocation: a new copy given up (a re-creation or a move that failed,
//! or one a move's switch could not keep), or copies a registration
//! reported that the table does not take. A heartbeat releases only
//! whole allocations (those the record lists nothing of on that node and
//! the node does not owe back), so these are owed from the moment they
//! are decided: asked at once where a fill was given up, at a tick where
//! a registration reported them (once the allocation's live primaries
//! were told their replicas), and, when that fails, again at every tick
//! until the agent confirms (an agent that does not hold them confirms
//! at once, also after a restart); the node leaving ends them. While a
//! node owes an allocation bytes, no new copy of it goes there
//! ([`barred`]), and no heartbeat's reply confirms them whole.
//!
//! Never holds the lock across a call to an agent.

use std::collections::BTreeSet;

use oncilla_model::alloc::Allocation;
use oncilla_model::cluster::Release;
use oncilla_model::node::NodeState;

use super::ranges::{overlaps, subtract};
use super::state::State;
use super::{AgentLink, Master};

impl<L: AgentLink> Master<L> {
    /// Has `node` (its agent at `agent`) let go of `ranges` of `alloc_id`
    /// and keep the rest; owed until it confirms.
    pub(super) async fn give_back(
        &self,
        node: &str,
        agent: &str,
        alloc_id: u64,
        ranges: &[(u64, u64)],
    ) {
        if ranges.is_empty() {
            return;
        }
        // Owed from now on, not from a failure on: meanwhile no new copy
        // goes there, and no heartbeat's reply confirms these bytes whole.
        owe(&mut self.lock(), node, alloc_id, ranges);
        match self
            .link
            .release(agent, Release::part(alloc_id, ranges))
            .await
        {
            Ok(_) => paid(&mut self.lock(), node, alloc_id, ranges),
            Err(e) => {
                tracing::warn!(alloc_id, %node, error = %e, "could not have a node let go of a copy it keeps no more; asking again next tick");
            }
        }
    }

    /// Asks again for every give-back not yet confirmed.
    pub(super) async fn send_give_backs(&self) {
        let due: Vec<Owed> = {
            let mut st = self.lock();
            let st = &mut *st;
            // A node that left holds nothing any more; one that is not up
            // is asked once it is (its 2 s deadlines would hold up the
            // tick's copy changes).
            let nodes = &st.nodes;
            let up = |node: &str| {
                nodes
                    .get(node)
                    .is_some_and(|n| n.seen.state(&self.liveness).0 == NodeState::Up)
            };
            // An allocation's live primaries are told their copies first:
            // one that still copies writes to these bytes would fail them.
            let telling: BTreeSet<u64> = st
                .copies_due
                .keys()
                .filter(|(_, node)| up(node))
                .map(|(id, _)| *id)
                .collect();
            st.owed.retain(|(_, node), _| nodes.contains_key(node));
            st.owed
                .iter()
                .filter(|((id, _), _)| !telling.contains(id))
                .filter_map(|((id, node), ranges)| {
                    let n = nodes.get(node)?;
                    up(node).then(|| Owed {
                        id: *id,
                        node: node.clone(),
                        agent: n.info.agent_addr.clone(),
                        ranges: ranges.clone(),
                    })
                })
                .collect()
        };
        for o in due {
            match self
                .link
                .release(&o.agent, Release::part(o.id, &o.ranges))
                .await
            {
                Ok(_) => paid(&mut self.lock(), &o.node, o.id, &o.ranges),
                Err(e) => {
                    tracing::warn!(alloc_id = o.id, node = %o.node, error = %e, "a node has not let go of a copy it keeps no more; asking again next tick");
                }
            }
        }
    }
}

/// A give-back to ask for again.
struct Owed {
    id: u64,
    node: String,
    agent: String,
    ranges: Vec<(u64, u64)>,
}

/// Notes that `node` owes `alloc_id` the bytes `ranges`: kept in order,
/// overlapping and adjacent ranges one (as a release must name them).
pub(super) fn owe(st: &mut State, node: &str, alloc_id: u64, ranges: &[(u64, u64)]) {
    let owed = st.owed.entry((alloc_id, node.to_string())).or_default();
    owed.extend_from_slice(ranges);
    owed.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(owed.len());
    for &(o, l) in owed.iter() {
        match out.last_mut() {
            Some(last) if o <= last.0 + last.1 => {
                last.1 = (o + l).max(last.0 + last.1) - last.0;
            }
            _ => out.push((o, l)),
        }
    }
    *owed = out;
}

/// Notes that `node` let go of `ranges` of `alloc_id`: what was owed
/// meanwhile besides stays owed.
fn paid(st: &mut State, node: &str, alloc_id: u64, ranges: &[(u64, u64)]) {
    let key = (alloc_id, node.to_string());
    let Some(owed) = st.owed.get_mut(&key) else {
        return;
    };
    let mut given = ranges.to_vec();
    given.sort_unstable();
    *owed = subtract(owed, &given);
    if owed.is_empty() {
        st.owed.remove(&key);
    }
}

/// The nodes that may not take a new copy of `ranges` of `a`: those that
/// hold any of these bytes (in any copy), receive a copy of any of them,
/// or still owe the allocation a give-back (a late give-back would take
/// the new copy with it).
pub(super) fn barred(st: &State, a: &Allocation, ranges: &[(u64, u64)]) -> Vec<String> {
    let mut nodes: Vec<String> = a
        .all_extents()
        .filter(|e| overlaps(e, ranges))
        .map(|e| e.node.clone())
        .collect();
    nodes.extend(
        st.fills(a.id)
            .filter(|f| subtract(&f.ranges, ranges) != f.ranges)
            .map(|f| f.node.clone()),
    );
    nodes.extend(st.owing(a.id).map(str::to_string));
    nodes.sort_unstable();
    nodes.dedup();
    nodes
}
