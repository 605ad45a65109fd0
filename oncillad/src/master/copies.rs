//! A replicated allocation that lost a copy's node: the copies there leave
//! the record, a replica of the same bytes takes the place of a lost
//! primary share (promotion), and the agent of each primary share is told
//! its replicas (`AgentLink::set_copies`), so writes go on with the copies
//! that are left. Decided under the lock from the table alone; the agents
//! are told after, and again at every tick until they answered
//! (`State::copies_due`).
//!
//! A dropped copy is never taken back: its node may have missed writes.
//! Its agent releases the allocation when its next heartbeat is answered
//! (`recovery.rs`). This module never reserves memory.

use oncilla_model::alloc::{Allocation, Extent};
use oncilla_model::cluster::{Range, SetCopies};

use super::state::{charge_of, State};
use super::{AgentLink, Master};

impl<L: AgentLink> Master<L> {
    /// Takes every copy `node` holds out of the replicated allocations,
    /// promoting a replica where it held a primary share, and queues what
    /// their primaries' agents must be told. Allocations whose every copy
    /// of some bytes was on `node` keep those extents (degraded or lost,
    /// as with one copy).
    pub(super) fn drop_copies(st: &mut State, node: &str) {
        let mut due = Vec::new();
        let mut charges = Vec::new();
        for (id, rec) in &mut st.allocs {
            let a = &mut rec.alloc;
            if a.placement.copies() <= 1 || !a.held_on(node) {
                continue;
            }
            let before = charge_of(a);
            a.replicas.retain(|e| e.node != node);
            let promoted = promote(a, node);
            let after = charge_of(a);
            charges.push((before, after));
            tracing::warn!(alloc_id = id, %node, promoted = promoted.is_some(), "a copy's node is lost: its copies leave the allocation");
            for (primary, ranges) in shares(a) {
                let promote = match &promoted {
                    Some((to, r)) if *to == primary => r.clone(),
                    _ => Vec::new(),
                };
                due.push((
                    *id,
                    primary.clone(),
                    promote,
                    replicas_of(a, &primary, &ranges),
                ));
            }
        }
        for (before, after) in charges {
            for (charge, add) in [(before, false), (after, true)] {
                if let Some((uid, c)) = charge {
                    st.charge(uid, &c, add);
                }
            }
        }
        for (id, primary, promote, replicas) in due {
            let Some(agent) = st.nodes.get(&primary).map(|n| n.info.agent_addr.clone()) else {
                continue;
            };
            let entry = st
                .copies_due
                .entry((id, primary))
                .or_insert_with(|| (agent.clone(), SetCopies::default()));
            // A promotion not yet delivered stays in the change.
            let mut all = std::mem::take(&mut entry.1.promote);
            all.extend(promote);
            *entry = (
                agent,
                SetCopies {
                    alloc_id: id,
                    promote: all,
                    replicas,
                },
            );
        }
    }

    /// Tells agents the copy changes they have not acknowledged; a failure
    /// is logged and asked again at the next call.
    pub(super) async fn send_copies(&self) {
        let due: Vec<((u64, String), (String, SetCopies))> = {
            let st = self.lock();
            st.copies_due
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        for (key, (addr, change)) in due {
            match self.link.set_copies(&addr, change.clone()).await {
                Ok(()) => {
                    let mut st = self.lock();
                    // Unless it changed meanwhile (then that goes next).
                    if st.copies_due.get(&key).is_some_and(|(_, c)| *c == change) {
                        st.copies_due.remove(&key);
                    }
                }
                Err(e) => {
                    tracing::warn!(alloc_id = key.0, node = %key.1, error = %e, "could not tell an agent its allocation's copies; asking again next tick");
                }
            }
        }
    }
}

/// Replaces the primary extents on `node` with the replica extents of the
/// lowest copy that holds exactly those bytes, as copy 0; returns the node
/// promoted and its ranges, or `None` (nothing on `node`, or no copy left).
fn promote(a: &mut Allocation, node: &str) -> Option<(String, Vec<Range>)> {
    let lost: Vec<(u64, u64)> = merged(a.extents.iter().filter(|e| e.node == node));
    if lost.is_empty() {
        return None;
    }
    let inside = |e: &Extent| {
        lost.iter()
            .any(|&(o, l)| e.alloc_offset >= o && e.alloc_offset + e.len <= o + l)
    };
    let copy = a.replica_copies().into_iter().find(|&c| {
        let held: Vec<&Extent> = a.copy_extents(c).filter(|e| inside(e)).collect();
        let one_node = held.windows(2).all(|w| w[0].node == w[1].node);
        one_node && merged(held.into_iter()) == lost
    })?;
    let (mut up, rest): (Vec<Extent>, Vec<Extent>) = std::mem::take(&mut a.replicas)
        .into_iter()
        .partition(|e| e.copy == copy && inside(e));
    a.replicas = rest;
    for e in &mut up {
        e.copy = 0;
    }
    let to = up.first().map(|e| e.node.clone())?;
    a.extents.retain(|e| e.node != node);
    a.extents.extend(up);
    a.extents.sort_by_key(|e| e.alloc_offset);
    let ranges = lost
        .into_iter()
        .map(|(alloc_offset, len)| Range { alloc_offset, len })
        .collect();
    Some((to, ranges))
}

/// Each primary node with its ranges (merged).
fn shares(a: &Allocation) -> Vec<(String, Vec<(u64, u64)>)> {
    let mut nodes: Vec<String> = a.extents.iter().map(|e| e.node.clone()).collect();
    nodes.sort();
    nodes.dedup();
    nodes
        .into_iter()
        .map(|n| {
            let ranges = merged(a.extents.iter().filter(|e| e.node == n));
            (n, ranges)
        })
        .collect()
}

/// The data addresses of the nodes that hold a copy of any of `ranges`,
/// other than `primary`.
fn replicas_of(a: &Allocation, primary: &str, ranges: &[(u64, u64)]) -> Vec<String> {
    let mut out: Vec<String> = a
        .replicas
        .iter()
        .filter(|e| e.node != primary)
        .filter(|e| {
            ranges
                .iter()
                .any(|&(o, l)| e.alloc_offset < o + l && o < e.alloc_offset + e.len)
        })
        .map(|e| e.data_addr.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Extents' ranges, adjacent ones merged, in order.
fn merged<'a>(extents: impl Iterator<Item = &'a Extent>) -> Vec<(u64, u64)> {
    let mut r: Vec<(u64, u64)> = extents.map(|e| (e.alloc_offset, e.len)).collect();
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (o, l) in r {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == o => last.1 += l,
            _ => out.push((o, l)),
        }
    }
    out
}
