//! Where the replicas of a planned allocation go: for each further copy,
//! each share of the primary goes whole to one other node, so a node that
//! holds the primary of some ranges copies each write of them to one node
//! per replica. Pure, like the rest of placement; it never reserves.
//!
//! Rules, in order: a node never holds two copies of the same bytes, nor
//! (in a new allocation) two shares of one copy; a node that is down gets nothing; where nodes declare zones, a copy goes
//! to a zone that holds no other copy of those bytes when one has room;
//! then the node with the most room.

use std::collections::BTreeMap;

use oncilla_model::size::{round_up, HumanBytes};

use super::{Candidate, Planned};
use crate::error::CoreError;

/// The node for one more copy of the share `share`, when a copy of it was
/// lost or leaves a drained node: any node but `barred` (those holding a
/// copy of these bytes, or that may not take one now), ranked as
/// [`replicas`] ranks them, with each node's room as it is. Unlike a new
/// allocation's replicas, it may go to a node that holds another share
/// of the same copy (a small cluster has no other).
pub fn refill<'a>(
    share: &Planned,
    barred: &[&str],
    nodes: &'a [Candidate],
) -> Option<&'a Candidate> {
    ranked(share.bytes(), barred, nodes, Candidate::room)
        .into_iter()
        .next()
}

/// The nodes that may take a copy of `bytes` held on `held` already, best
/// first: placeable, holding none of it, `room` for it, a zone that holds
/// none of it first, then the most room, then by name.
fn ranked<'a>(
    bytes: u64,
    held: &[&str],
    nodes: &'a [Candidate],
    room: impl Fn(&Candidate) -> u64,
) -> Vec<&'a Candidate> {
    let zones: Vec<&str> = nodes
        .iter()
        .filter(|n| held.contains(&n.name.as_str()) && !n.zone.is_empty())
        .map(|n| n.zone.as_str())
        .collect();
    let new_zone = |n: &Candidate| !n.zone.is_empty() && !zones.contains(&n.zone.as_str());
    let mut order: Vec<&Candidate> = nodes
        .iter()
        .filter(|n| {
            n.placeable()
                && !held.contains(&n.name.as_str())
                && round_up(bytes, n.page.max(1)) <= room(n)
        })
        .collect();
    order.sort_by(|a, b| {
        new_zone(b)
            .cmp(&new_zone(a))
            .then_with(|| room(b).cmp(&room(a)))
            .then_with(|| a.name.cmp(&b.name))
    });
    order
}

/// The shares of copies 1 to `copies - 1` (each as `primary` is laid out,
/// share by share), with room counted after the primary's shares.
///
/// Each copy's shares go to distinct nodes (a node holds one share of a
/// copy), found as a matching: a share whose nodes are all taken by the
/// copy's earlier shares moves one of them to another node (with shares
/// on every node, only a rotation fits, which taking nodes in order can
/// miss).
///
/// # Errors
/// [`CoreError::CapacityExhausted`] when some share has no node left that
/// holds no copy of it and has room, said with the nodes' free room.
pub fn replicas(
    primary: &[Planned],
    copies: u32,
    nodes: &[Candidate],
) -> Result<Vec<Vec<Planned>>, CoreError> {
    let by_name: BTreeMap<&str, &Candidate> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    // Room left on each node once what is already planned is taken.
    let mut free: BTreeMap<&str, u64> = nodes.iter().map(|n| (n.name.as_str(), n.room())).collect();
    for p in primary {
        if let (Some(f), Some(n)) = (free.get_mut(p.node.as_str()), by_name.get(p.node.as_str())) {
            *f = f.saturating_sub(round_up(p.bytes(), n.page.max(1)));
        }
    }
    // For each primary share, the nodes holding a copy of it so far.
    let mut holders: Vec<Vec<&str>> = primary.iter().map(|p| vec![p.node.as_str()]).collect();
    let mut out = Vec::new();
    for _ in 1..copies {
        let mut m = Matching {
            shares: primary,
            held: &holders,
            nodes,
            free,
            owner: BTreeMap::new(),
        };
        for i in 0..primary.len() {
            if !m.place(i, &mut Vec::new()) {
                return Err(no_room(&primary[i], &holders[i], nodes, &m.free));
            }
        }
        let Matching {
            owner, free: left, ..
        } = m;
        free = left;
        let mut copy: Vec<Planned> = primary
            .iter()
            .map(|p| Planned {
                node: String::new(),
                ranges: p.ranges.clone(),
                gpu: None,
            })
            .collect();
        for (node, i) in owner {
            copy[i].node = node.to_string();
            holders[i].push(node);
        }
        out.push(copy);
    }
    Ok(out)
}

/// One copy's shares being given distinct nodes.
struct Matching<'a, 'h> {
    shares: &'a [Planned],
    /// Per share, the nodes holding a copy of it already.
    held: &'h [Vec<&'a str>],
    nodes: &'a [Candidate],
    free: BTreeMap<&'a str, u64>,
    /// Node -> the share of this copy it takes.
    owner: BTreeMap<&'a str, usize>,
}

impl<'a> Matching<'a, '_> {
    /// Gives share `i` a node (the rules' best first), moving the share
    /// that has it to another node where needed, through nodes not in
    /// `seen`; whether it found one.
    fn place(&mut self, i: usize, seen: &mut Vec<&'a str>) -> bool {
        let bytes = self.shares[i].bytes();
        let need = |n: &Candidate| round_up(bytes, n.page.max(1));
        // Room on `n` were its share of this copy (if any) elsewhere.
        let room = |n: &Candidate| {
            let back = self
                .owner
                .get(n.name.as_str())
                .map_or(0, |&j| round_up(self.shares[j].bytes(), n.page.max(1)));
            self.free.get(n.name.as_str()).copied().unwrap_or(0) + back
        };
        let order = ranked(bytes, &self.held[i], self.nodes, room);
        for n in order {
            let name = n.name.as_str();
            if seen.contains(&name) {
                continue;
            }
            seen.push(name);
            let before = self.owner.get(name).copied();
            if let Some(j) = before {
                if !self.place(j, seen) {
                    continue;
                }
                let back = round_up(self.shares[j].bytes(), n.page.max(1));
                if let Some(f) = self.free.get_mut(name) {
                    *f += back;
                }
            }
            if let Some(f) = self.free.get_mut(name) {
                *f = f.saturating_sub(need(n));
            }
            self.owner.insert(name, i);
            return true;
        }
        false
    }
}

fn no_room(
    p: &Planned,
    held: &[&str],
    nodes: &[Candidate],
    free: &BTreeMap<&str, u64>,
) -> CoreError {
    let others: Vec<String> = nodes
        .iter()
        .filter(|n| !held.contains(&n.name.as_str()))
        .map(|n| {
            let down = n.condition();
            format!("{} {}{down}", n.name, HumanBytes(free[n.name.as_str()]))
        })
        .collect();
    CoreError::CapacityExhausted {
        requested: p.bytes(),
        detail: format!(
            "a replica of the {} on {} needs another node with room, apart from {} (which hold copies of it): {}",
            HumanBytes(p.bytes()),
            p.node,
            held.join(", "),
            if others.is_empty() {
                "there is none".to_string()
            } else {
                others.join(", ")
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, zone: &str, free: u64) -> Candidate {
        Candidate {
            name: name.into(),
            free,
            up: true,
            draining: false,
            page: 4096,
            gpus: Vec::new(),
            gpu_note: String::new(),
            zone: zone.into(),
        }
    }

    fn share(node: &str, ranges: &[(u64, u64)]) -> Planned {
        Planned {
            node: node.into(),
            ranges: ranges.to_vec(),
            gpu: None,
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn every_copy_of_a_range_is_on_another_node() {
        let nodes = [
            node("a", "", 64 * MIB),
            node("b", "", 64 * MIB),
            node("c", "", 64 * MIB),
        ];
        let primary = [
            share("a", &[(0, 8 * MIB)]),
            share("b", &[(8 * MIB, 8 * MIB)]),
        ];
        let copies = replicas(&primary, 3, &nodes).unwrap();
        assert_eq!(copies.len(), 2);
        for (i, p) in primary.iter().enumerate() {
            let mut on = vec![p.node.clone()];
            for c in &copies {
                assert_eq!(c[i].ranges, p.ranges);
                assert!(!on.contains(&c[i].node), "{on:?} {}", c[i].node);
                on.push(c[i].node.clone());
            }
        }
    }

    #[test]
    fn a_replica_goes_to_another_zone_before_a_roomier_node() {
        let nodes = [
            node("a1", "rack-a", 64 * MIB),
            node("a2", "rack-a", 512 * MIB),
            node("b1", "rack-b", 32 * MIB),
        ];
        let copies = replicas(&[share("a1", &[(0, 16 * MIB)])], 2, &nodes).unwrap();
        assert_eq!(copies[0][0].node, "b1");
    }

    #[test]
    fn room_counts_what_the_primary_and_earlier_copies_took() {
        // b has room for one 16 MiB share, not two.
        let nodes = [
            node("a", "", 64 * MIB),
            node("b", "", 20 * MIB),
            node("c", "", 16 * MIB),
        ];
        let primary = [share("a", &[(0, 16 * MIB)])];
        let copies = replicas(&primary, 3, &nodes).unwrap();
        let mut on: Vec<&str> = copies.iter().map(|c| c[0].node.as_str()).collect();
        on.sort_unstable();
        assert_eq!(on, ["b", "c"]);
        let two = [
            share("a", &[(0, 16 * MIB)]),
            share("c", &[(16 * MIB, 16 * MIB)]),
        ];
        // a's replica takes b (c is full); c's goes to a, which has room
        // and holds no copy of c's range.
        let copies = replicas(&two, 2, &nodes).unwrap();
        assert_eq!(copies[0][0].node, "b");
        assert_eq!(copies[0][1].node, "a");
    }

    #[test]
    fn shares_on_every_node_take_each_other_in_a_rotation() {
        // Taking the roomiest node share by share gives a's replica b and
        // b's a, and leaves c's nowhere: the matching moves one along.
        for n in 3..=5 {
            let nodes: Vec<Candidate> = (0..n)
                .map(|i| node(&format!("n{i}"), "", 64 * MIB))
                .collect();
            let primary: Vec<Planned> = (0..n)
                .map(|i| share(&format!("n{i}"), &[(i as u64 * MIB, MIB)]))
                .collect();
            for copies in 2..=n.min(3) {
                let out = replicas(&primary, copies as u32, &nodes).unwrap();
                for (c, copy) in out.iter().enumerate() {
                    let mut on: Vec<&str> = copy.iter().map(|p| p.node.as_str()).collect();
                    on.sort_unstable();
                    on.dedup();
                    assert_eq!(on.len(), n, "copy {}: one share per node: {copy:?}", c + 1);
                }
                for (i, p) in primary.iter().enumerate() {
                    let mut of: Vec<&str> = out.iter().map(|c| c[i].node.as_str()).collect();
                    of.push(p.node.as_str());
                    of.sort_unstable();
                    of.dedup();
                    assert_eq!(of.len(), copies, "share {i}: {out:?}");
                }
            }
        }
    }

    #[test]
    fn too_few_nodes_is_refused_with_the_reason() {
        let mut down = node("c", "", 64 * MIB);
        down.up = false;
        let nodes = [node("a", "", 64 * MIB), node("b", "", 64 * MIB), down];
        let err = replicas(&[share("a", &[(0, MIB)])], 3, &nodes).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("needs another node"), "{msg}");
        assert!(msg.contains("(down)"), "{msg}");
    }
}
