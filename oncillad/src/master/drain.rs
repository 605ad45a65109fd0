//! Draining a node (`ocmctl drain`): nothing new is placed on it, and
//! every allocation it holds moves to other nodes, one allocation at a
//! time, agent to agent, while clients go on copying.
//!
//! A move is made before anything is broken. For each share the drained
//! node holds (its primary share of the allocation, or a replica share of
//! another node's), a node that holds none of those bytes (it may hold
//! others of the allocation) is reserved as one more replica and filled
//! by the share's primary, as a lost copy
//! is re-created (`copies.rs`): from then on every write reaches it too
//! (an allocation with one copy gains its first replica; its agent stops
//! its RDMA keys and refuses to move it while a process there maps it).
//! Only once every share is filled does the drained node let go of the
//! allocation: its clients' next copy fails and they look the allocation
//! up again. Then the record lists the new nodes in its place (a primary
//! share's new node is promoted, as a replica is for a lost primary), and
//! the primaries are told. Anything that fails before the drained node
//! let go undoes the move: the new copies are released and the primaries
//! told the record's replicas again; the reason is shown beside the node.
//!
//! It never moves GPU memory; it decides from the table under the lock
//! and talks to agents only through [`AgentLink`], never holding the lock
//! across a call.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use oncilla_model::alloc::{Allocation, Extent};
use oncilla_model::cluster::{Piece, Range, Release, ReplicaShare, Reservation, SetCopies};
use oncilla_model::node::{Drain, NodeState, NodeStatus, MAX_DRAIN_NOTE};
use oncilla_model::size::{round_up, HumanBytes};
use oncilla_model::Fabric;

use super::allocate::check_pieces;
use super::copies::{add_filling, add_replica, copy_reservation, replica_share, replicas_of};
use super::give_back::{barred, owe};
use super::placement::{self, Candidate, Planned};
use super::ranges::{merged, overlaps};
use super::state::{charge_of, Filling, State};
use super::{AgentLink, Master};
use crate::error::{CoreError, LinkError};

/// Shown beside a drained node that is not up.
const NOT_UP: &str = "the node is not up: what it holds moves once it is back (replicated allocations go on with their other copies meanwhile)";

/// How long an allocation whose move failed waits before another try.
const MOVE_PAUSE: Duration = Duration::from_secs(5);
/// How many times the drained node is asked to let go of a moved
/// allocation, and the pause between.
const RELEASE_TRIES: u32 = 3;
const RELEASE_PAUSE: Duration = Duration::from_millis(200);

/// One allocation leaving the drained node.
struct Move {
    alloc_id: u64,
    /// The drained node and its agent.
    from: String,
    from_agent: String,
    /// Where every copy was when the move was planned (see [`layout`]):
    /// it takes over only if that is still so.
    layout: Vec<(String, u64, u64, u32, u64)>,
    shares: Vec<Share>,
    /// The drained node may have revoked its RDMA keys (an allocation
    /// with one copy does as it takes a new replica).
    revoked: bool,
}

/// One share of the drained node's, and where it goes.
struct Share {
    /// Which copy of these bytes the drained node holds (0: the primary).
    copy: u32,
    ranges: Vec<(u64, u64)>,
    fabric: Fabric,
    /// The share's primary (the drained node for copy 0) and its agent.
    primary: String,
    primary_agent: String,
    /// The primary's replicas, the new node's among them.
    replicas: Vec<ReplicaShare>,
    /// The new node: name, agent and data addresses, and the start of
    /// its agent it was reserved on.
    target: (String, String, String),
    incarnation: u64,
    reservation: Reservation,
    /// Where the new node put it (once reserved).
    pieces: Vec<Piece>,
    /// When the change that has its primary fill it was decided (with
    /// the move).
    generation: u64,
}

impl<L: AgentLink> Master<L> {
    /// Starts (`on`) or ends draining node `name`; the node as shown.
    ///
    /// # Errors
    /// [`CoreError::UnknownNode`].
    pub fn drain(&self, name: &str, on: bool) -> Result<NodeStatus, CoreError> {
        let mut st = self.lock();
        let Some(n) = st.nodes.get_mut(name) else {
            return Err(st.unknown_node(name));
        };
        if n.draining != on {
            tracing::warn!(node = %name, draining = on, "drain changed by an operator");
        }
        n.draining = on;
        n.drain_note.clear();
        let left = drain_left(&st);
        st.nodes
            .get(name)
            .map(|n| self.node_status(n, &left))
            .ok_or_else(|| CoreError::Internal(format!("node {name} went while it was shown")))
    }

    /// Moves one allocation off a node being drained, if one can move now;
    /// whether one was tried.
    pub async fn move_one(&self) -> bool {
        let Some(mut mv) = self.next_move() else {
            return false;
        };
        let started = Instant::now();
        let ready = match self.fill_targets(&mut mv).await {
            Ok(()) => self.ready_to_switch(&mv),
            Err(why) => Err(why),
        };
        let promoted = match ready {
            Ok(()) => self.promote_targets(&mv).await,
            Err(why) => Err(why),
        };
        if let Err(why) = promoted {
            self.undo_move(&mv, why).await;
            return true;
        }
        // From here the new copies take over: the drained node lets go
        // (its clients fail over), and the record must list them.
        self.let_go(&mv).await;
        let dropped = {
            let mut st = self.lock();
            // Ended first: the primaries are told the record's replicas,
            // no longer the copies in flight (`copies::queue`).
            end_move(&mut st, &mv);
            let dropped = self.switch(&mut st, &mv);
            if let Some(n) = st.nodes.get_mut(&mv.from) {
                n.drain_note.clear();
            }
            dropped
        };
        let bytes: u64 = mv.shares.iter().map(Share::bytes).sum();
        let to: Vec<&str> = mv.shares.iter().map(|s| s.target.0.as_str()).collect();
        tracing::info!(alloc_id = mv.alloc_id, from = %mv.from, ?to, bytes, dropped = dropped.len(), secs = started.elapsed().as_secs_f64(), "allocation moved off a drained node");
        self.send_copies().await;
        for s in dropped {
            self.give_back_share(&mv, s).await;
        }
        true
    }

    /// Picks the next allocation to move and holds room for it on the
    /// nodes it goes to.
    fn next_move(&self) -> Option<Move> {
        if self.check_serving().is_err() {
            return None;
        }
        let mut st = self.lock();
        let now = Instant::now();
        st.move_after.retain(|_, until| *until > now);
        let candidates = self.candidates(&st);
        let up = |name: &str| candidates.iter().any(|c| c.name == name && c.up);
        for n in st.nodes.values_mut().filter(|n| n.draining) {
            match (up(&n.info.name), n.drain_note == NOT_UP) {
                (false, false) => n.drain_note = NOT_UP.to_string(),
                (true, true) => n.drain_note.clear(),
                _ => {}
            }
        }
        let draining: Vec<(String, String)> = st
            .nodes
            .values()
            .filter(|n| n.draining && up(&n.info.name))
            .map(|n| (n.info.name.clone(), n.info.agent_addr.clone()))
            .collect();
        for (from, from_agent) in draining {
            let mut refused: Vec<(u64, String)> = Vec::new();
            let mut found = None;
            // From where the last move off this node was found, round to
            // it again: a drain walks the table about once, not once per
            // move (a node among a million allocations).
            let start = st.drain_cursor.get(&from).copied().unwrap_or(0);
            for (id, rec) in st.allocs.range(start..).chain(st.allocs.range(..start)) {
                if !rec.alloc.held_on(&from)
                    || st.move_after.contains_key(id)
                    || st.reserving.contains(id)
                    || st.copies_due_for(*id)
                    || st.moving.contains(id)
                    || st.filling(*id).next().is_some()
                {
                    continue;
                }
                if !rec.lost.is_empty() {
                    refused.push((
                        *id,
                        format!("allocation {id} lost bytes on a restarted node"),
                    ));
                    continue;
                }
                match plan(&st, &rec.alloc, &from, &candidates) {
                    Ok(shares) => {
                        found = Some(Move {
                            alloc_id: *id,
                            from: from.clone(),
                            from_agent: from_agent.clone(),
                            layout: layout(&rec.alloc),
                            shares,
                            revoked: false,
                        });
                        break;
                    }
                    Err(why) => refused.push((*id, why)),
                }
            }
            for (id, why) in refused {
                pause(&mut st, id, &from, why);
            }
            let Some(mut mv) = found else { continue };
            st.drain_cursor
                .insert(from.clone(), mv.alloc_id.saturating_add(1));
            for s in &mut mv.shares {
                s.generation = st.next_copies_generation();
            }
            st.moving.insert(mv.alloc_id);
            for s in &mv.shares {
                if let Some(n) = st.nodes.get_mut(&s.target.0) {
                    n.reserved += n.footprint(s.bytes());
                }
                st.refilling
                    .entry((mv.alloc_id, s.primary.clone()))
                    .or_default()
                    .push(Filling {
                        node: s.target.0.clone(),
                        ranges: s.ranges.clone(),
                    });
            }
            tracing::info!(alloc_id = mv.alloc_id, from = %mv.from, shares = mv.shares.len(), "moving an allocation off a drained node");
            return Some(mv);
        }
        None
    }

    /// Reserves every share on its new node and has its primary fill it.
    async fn fill_targets(&self, mv: &mut Move) -> Result<(), String> {
        for s in &mut mv.shares {
            let planned = Planned {
                node: s.target.0.clone(),
                ranges: s.ranges.clone(),
                gpu: None,
            };
            let reserved = self
                .link
                .reserve(&s.target.1, vec![s.reservation.clone()])
                .await
                .and_then(|r| {
                    let r = r.into_iter().next().ok_or_else(|| {
                        LinkError::BadReply("no answer to the reservation".into())
                    })?;
                    check_pieces(&planned, r.pieces)
                });
            s.pieces = reserved.map_err(|e| {
                format!(
                    "could not reserve allocation {}'s new copy on {}: {e}",
                    mv.alloc_id, s.target.0
                )
            })?;
        }
        for s in &mv.shares {
            let change = SetCopies {
                alloc_id: mv.alloc_id,
                promote: Vec::new(),
                replicas: s.replicas.clone(),
                fill: vec![s.target.2.clone()],
                generation: s.generation,
            };
            // A single copy's agent revokes its RDMA keys as it takes
            // the new replica, unless it refuses the move outright.
            mv.revoked |= s.copy == 0;
            let filled = self.link.set_copies(&s.primary_agent, change).await;
            if let Err(e) = filled {
                mv.revoked &= !(s.copy == 0 && matches!(e, LinkError::CannotMove(_)));
                return Err(format!(
                    "{} could not copy allocation {} to {}: {e}",
                    s.primary, mv.alloc_id, s.target.0
                ));
            }
        }
        Ok(())
    }

    /// Whether the move may take over: the allocation's copies are as
    /// planned (none changed, none to be told), and every new node is up
    /// in the start it was reserved on.
    fn ready_to_switch(&self, mv: &Move) -> Result<(), String> {
        let st = self.lock();
        let Some(rec) = st.allocs.get(&mv.alloc_id) else {
            return Err(format!("allocation {} was freed as it moved", mv.alloc_id));
        };
        if layout(&rec.alloc) != mv.layout || st.copies_due_for(mv.alloc_id) {
            return Err(format!(
                "allocation {}'s copies changed as it moved (a node went down or came back)",
                mv.alloc_id
            ));
        }
        for s in &mv.shares {
            if self.target_state(&st, s) != Some(NodeState::Up) {
                return Err(format!(
                    "{}, the new node for allocation {}, went down as it moved",
                    s.target.0, mv.alloc_id
                ));
            }
        }
        Ok(())
    }

    /// Makes each new node of a primary share its primary, with the
    /// share's other replicas. The drained node's writes fail from here
    /// (its copy to the new node is refused), so nothing is acknowledged
    /// that the new primary lacks; its clients wait out the rest.
    async fn promote_targets(&self, mv: &Move) -> Result<(), String> {
        for s in mv.shares.iter().filter(|s| s.copy == 0) {
            let others = s
                .replicas
                .iter()
                .filter(|r| r.data_addr != s.target.2)
                .cloned();
            // The new node may be the primary of other bytes already: it
            // keeps copying those to their replicas, the new copies of
            // them this move is making among them.
            let (own, generation) = {
                let mut st = self.lock();
                let mut own = st
                    .allocs
                    .get(&mv.alloc_id)
                    .map(|r| replicas_of(&r.alloc, &s.target.0))
                    .unwrap_or_default();
                add_filling(&st, mv.alloc_id, &s.target.0, &mut own);
                (own, st.next_copies_generation())
            };
            let change = SetCopies {
                alloc_id: mv.alloc_id,
                promote: s
                    .ranges
                    .iter()
                    .map(|&(alloc_offset, len)| Range { alloc_offset, len })
                    .collect(),
                replicas: joined(own, others),
                fill: Vec::new(),
                generation,
            };
            self.link
                .set_copies(&s.target.1, change)
                .await
                .map_err(|e| {
                    format!(
                        "{} could not take over allocation {} as its primary: {e}",
                        s.target.0, mv.alloc_id
                    )
                })?;
        }
        Ok(())
    }

    /// The drained node releases the allocation, asked a few times; past
    /// that it is taken as gone (its next heartbeat reply, or its
    /// registration, releases it: no record lists it there).
    async fn let_go(&self, mv: &Move) {
        for attempt in 1..=RELEASE_TRIES {
            match self
                .link
                .release(&mv.from_agent, Release::all(mv.alloc_id))
                .await
            {
                Ok(_) => return,
                Err(e) if attempt == RELEASE_TRIES => {
                    tracing::warn!(alloc_id = mv.alloc_id, node = %mv.from, error = %e, "the drained node did not confirm it let go of a moved allocation; its heartbeat will");
                }
                Err(e) => {
                    tracing::debug!(alloc_id = mv.alloc_id, node = %mv.from, error = %e, "asking the drained node to let go again");
                    tokio::time::sleep(RELEASE_PAUSE).await;
                }
            }
        }
    }

    /// Lists the new copies in place of the drained node's, which let go
    /// of everything it held of the allocation, and queues the primaries'
    /// replicas. A new copy is kept only if it got every acknowledged
    /// write: a primary share's (its own primary since `promote_targets`)
    /// while the record still had the drained node as its primary; a
    /// replica share's while its primary is the one that filled it. The
    /// others, returned to be released, leave their bytes under-replicated
    /// (re-created by `refill`) or, for a primary share whose replica was
    /// promoted meanwhile, with that replica. A kept copy whose node
    /// restarted since it was reserved goes as a restarted node's copies
    /// (one that goes down later, as any down node's).
    fn switch<'m>(&self, st: &mut State, mv: &'m Move) -> Vec<&'m Share> {
        let mut dropped = Vec::new();
        let Some(rec) = st.allocs.get_mut(&mv.alloc_id) else {
            for s in &mv.shares {
                unreserve(st, mv.alloc_id, s);
                dropped.push(s);
            }
            return dropped;
        };
        let a = &mut rec.alloc;
        let before = charge_of(a);
        let kept: Vec<bool> = mv.shares.iter().map(|s| kept(a, s, &mv.from)).collect();
        // Its room on the drained node, per copy as it was reserved.
        let mut per_copy: BTreeMap<u32, u64> = BTreeMap::new();
        for e in a.all_extents().filter(|e| e.node == mv.from) {
            *per_copy.entry(e.copy).or_default() += e.len;
        }
        a.extents.retain(|e| e.node != mv.from);
        a.replicas.retain(|e| e.node != mv.from);
        for (s, _) in mv.shares.iter().zip(&kept).filter(|(_, k)| **k) {
            let new = s.pieces.iter().map(|p| Extent {
                node: s.target.0.clone(),
                alloc_offset: p.alloc_offset,
                len: p.len,
                pool_offset: p.pool_offset,
                data_addr: s.target.2.clone(),
                fabric: if p.rdma.is_empty() {
                    Fabric::Tcp
                } else {
                    s.fabric
                },
                agent_addr: s.target.1.clone(),
                gpu: None,
                rdma: p.rdma.clone(),
                copy: s.copy,
                // Filled: the move switches only after its copies are.
                filling: false,
            });
            if s.copy == 0 {
                a.extents.extend(new);
            } else {
                a.replicas.extend(new);
            }
        }
        a.extents.sort_by_key(|e| e.alloc_offset);
        a.replicas.sort_by_key(|e| (e.copy, e.alloc_offset));
        let after = charge_of(a);
        st.recharge(before, after);
        if let Some(n) = st.nodes.get_mut(&mv.from) {
            for len in per_copy.into_values() {
                n.reserved = n.reserved.saturating_sub(n.footprint(len));
            }
        }
        for (s, _) in mv.shares.iter().zip(&kept).filter(|(_, k)| !**k) {
            unreserve(st, mv.alloc_id, s);
            dropped.push(s);
        }
        Self::tell_primaries(st, mv.alloc_id);
        for (s, _) in mv.shares.iter().zip(&kept).filter(|(_, k)| **k) {
            // Restarted (or gone) since it was reserved: its copy is gone.
            if self.target_state(st, s).is_none() {
                Self::drop_copies(st, &s.target.0);
            }
        }
        dropped
    }

    /// The state of share `s`'s new node in the start it was reserved on
    /// (`None`: it restarted since, or left).
    fn target_state(&self, st: &State, s: &Share) -> Option<NodeState> {
        st.nodes
            .get(&s.target.0)
            .filter(|n| n.incarnation == s.incarnation)
            .map(|n| n.seen.state(&self.liveness).0)
    }

    /// Undoes a move that failed before the drained node let go: the
    /// primaries are told the record's replicas again (so the drained node
    /// takes writes alone again), then the new copies are released; the
    /// allocation waits before another try.
    async fn undo_move(&self, mv: &Move, why: String) {
        tracing::warn!(alloc_id = mv.alloc_id, from = %mv.from, %why, "could not move an allocation off a drained node; trying again later");
        {
            let mut st = self.lock();
            for s in &mv.shares {
                unreserve(&mut st, mv.alloc_id, s);
            }
            end_move(&mut st, mv);
            pause(&mut st, mv.alloc_id, &mv.from, why);
            // A single copy whose agent may have revoked its RDMA keys:
            // clients reach it over TCP from now on.
            if let Some(rec) = st
                .allocs
                .get_mut(&mv.alloc_id)
                .filter(|r| mv.revoked && r.alloc.placement.copies() == 1)
            {
                for e in rec.alloc.extents.iter_mut().filter(|e| e.node == mv.from) {
                    e.rdma.clear();
                    e.fabric = Fabric::Tcp;
                }
            }
            Self::tell_primaries(&mut st, mv.alloc_id);
        }
        self.send_copies().await;
        self.release_targets(mv).await;
    }

    async fn release_targets(&self, mv: &Move) {
        for s in &mv.shares {
            self.give_back_share(mv, s).await;
        }
    }

    /// Share `s`'s new node lets go of its copy (and of nothing else it
    /// holds).
    async fn give_back_share(&self, mv: &Move, s: &Share) {
        let (node, agent, _) = &s.target;
        self.give_back(node, agent, mv.alloc_id, &s.ranges).await;
    }

    /// How the node is shown, with what it still holds when it is being
    /// drained (`left`: see [`drain_left`]).
    pub(super) fn node_status(
        &self,
        n: &super::node::Node,
        left: &BTreeMap<&str, u64>,
    ) -> NodeStatus {
        let (state, since) = n.seen.state(&self.liveness);
        NodeStatus {
            info: n.info.clone(),
            used: n.reserved,
            state,
            last_heartbeat_ms_ago: u64::try_from(n.seen.last.elapsed().as_millis())
                .unwrap_or(u64::MAX),
            pool: n.pool,
            state_since_unix_ms: since,
            incarnation: n.incarnation,
            drain: n.draining.then(|| Drain {
                left: left.get(n.info.name.as_str()).copied().unwrap_or(0),
                note: n.drain_note.clone(),
            }),
        }
    }
}

/// Per node being drained, how many allocations it still holds bytes of
/// (one pass over the table, only while some node is drained).
pub(super) fn drain_left(st: &State) -> BTreeMap<&str, u64> {
    let draining: Vec<&str> = st
        .nodes
        .values()
        .filter(|n| n.draining)
        .map(|n| n.info.name.as_str())
        .collect();
    let mut left: BTreeMap<&str, u64> = draining.iter().map(|n| (*n, 0)).collect();
    if draining.is_empty() {
        return left;
    }
    for rec in st.allocs.values() {
        for node in &draining {
            if rec.alloc.held_on(node) {
                *left.entry(node).or_default() += 1;
            }
        }
    }
    left
}

impl Share {
    fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.1).sum()
    }
}

/// Where each share `from` holds of `a` goes: a node that holds none of
/// its bytes (it may hold others of the allocation), placeable, with
/// room, in another zone first; or why it cannot move now.
fn plan(st: &State, a: &Allocation, from: &str, nodes: &[Candidate]) -> Result<Vec<Share>, String> {
    let id = a.id;
    if a.all_extents().any(|e| e.gpu.is_some()) {
        return Err(format!(
            "allocation {id} is GPU memory; only host memory moves to another node"
        ));
    }
    // Room as it is, less what earlier shares of this move take.
    let mut nodes = nodes.to_vec();
    let mut by_copy: BTreeMap<u32, Vec<&Extent>> = BTreeMap::new();
    for e in a.all_extents().filter(|e| e.node == from) {
        by_copy.entry(e.copy).or_default().push(e);
    }
    let mut shares = Vec::new();
    for (copy, extents) in by_copy {
        let ranges = merged(extents.iter().copied());
        let primary = if copy == 0 {
            from.to_string()
        } else {
            let mut of: Vec<&str> = a
                .extents
                .iter()
                .filter(|e| overlaps(e, &ranges))
                .map(|e| e.node.as_str())
                .collect();
            of.dedup();
            match of.as_slice() {
                [one] => (*one).to_string(),
                _ => {
                    return Err(format!(
                        "allocation {id}'s copy on {from} has no single primary to copy it from"
                    ))
                }
            }
        };
        if !nodes.iter().any(|c| c.name == primary && c.up) {
            return Err(format!(
                "the primary of allocation {id}'s bytes on {from}, {primary}, is not up"
            ));
        }
        let share = Planned {
            node: from.to_string(),
            ranges: ranges.clone(),
            gpu: None,
        };
        // Any node but one that holds, gets or owes these bytes (the
        // drained node among them); several shares may go to one node.
        let barred = barred(st, a, &ranges);
        let refs: Vec<&str> = barred.iter().map(String::as_str).collect();
        let Some(to) = placement::refill(&share, &refs, &nodes).map(|c| c.name.clone()) else {
            return Err(format!(
                "no node that holds none of these bytes of allocation {id} has room for {} of them",
                HumanBytes(share.bytes())
            ));
        };
        if let Some(c) = nodes.iter_mut().find(|c| c.name == to) {
            c.free = c
                .free
                .saturating_sub(round_up(share.bytes(), c.page.max(1)));
        }
        let (Some(p), Some(t)) = (st.nodes.get(&primary), st.nodes.get(&to)) else {
            return Err(format!(
                "allocation {id}'s nodes changed while it was planned"
            ));
        };
        let mut replicas = replicas_of(a, &primary);
        add_replica(&mut replicas, replica_share(&t.info.data_addr, &ranges));
        let fabric = extents.first().map_or(Fabric::Tcp, |e| e.fabric);
        shares.push(Share {
            copy,
            fabric,
            primary,
            primary_agent: p.info.agent_addr.clone(),
            replicas,
            target: (
                t.info.name.clone(),
                t.info.agent_addr.clone(),
                t.info.data_addr.clone(),
            ),
            incarnation: t.incarnation,
            // A replica until the switch: a primary share's new node is
            // promoted then (any copy number but 0 will do).
            reservation: copy_reservation(a, &ranges, copy.max(1), fabric),
            ranges,
            pieces: Vec::new(),
            generation: 0,
        });
    }
    // Each share's change names the primary's replicas in full: two
    // shares of one primary (copies of bytes it took over beside its own)
    // must each list both new copies, or the change applied second would
    // drop the first one's.
    let targets: Vec<(String, ReplicaShare)> = shares
        .iter()
        .map(|s| (s.primary.clone(), replica_share(&s.target.2, &s.ranges)))
        .collect();
    for s in &mut shares {
        for (primary, target) in &targets {
            if *primary == s.primary {
                add_replica(&mut s.replicas, target.clone());
            }
        }
    }
    Ok(shares)
}

/// The replicas of a node's own primary bytes, `own`, with those of bytes
/// it takes over, `more`: one entry per replica.
fn joined(own: Vec<ReplicaShare>, more: impl Iterator<Item = ReplicaShare>) -> Vec<ReplicaShare> {
    let mut all = own;
    for r in more {
        add_replica(&mut all, r);
    }
    all
}

/// Ends a move's hold on its shares; the room held on the new nodes goes
/// back unless the record lists them (`listed`).
fn end_move(st: &mut State, mv: &Move) {
    st.moving.remove(&mv.alloc_id);
    for s in &mv.shares {
        st.refilling.remove(&(mv.alloc_id, s.primary.clone()));
    }
}

/// Share `s`'s new copy of allocation `id` is given up: the room held
/// for it on its new node goes back, and its bytes are owed back from
/// now on (no heartbeat's reply confirms them whole; the give-back that
/// follows pays it).
fn unreserve(st: &mut State, id: u64, s: &Share) {
    if let Some(n) = st.nodes.get_mut(&s.target.0) {
        n.reserved = n.reserved.saturating_sub(n.footprint(s.bytes()));
    }
    owe(st, &s.target.0, id, &s.ranges);
}

/// Every extent of `a`, where it is (not how it is reached): what a move
/// checks did not change while it filled.
fn layout(a: &Allocation) -> Vec<(String, u64, u64, u32, u64)> {
    a.all_extents()
        .map(|e| (e.node.clone(), e.alloc_offset, e.len, e.copy, e.pool_offset))
        .collect()
}

/// Whether share `s`'s new copy got every acknowledged write (see
/// [`Master::switch`]): the drained node still holds the share in the
/// record, and a replica share's primary is the one that filled it.
fn kept(a: &Allocation, s: &Share, from: &str) -> bool {
    let there = merged(a.copy_extents(s.copy).filter(|e| e.node == from));
    if there != s.ranges {
        return false;
    }
    s.copy == 0
        || a.extents
            .iter()
            .filter(|e| overlaps(e, &s.ranges))
            .all(|e| e.node == s.primary)
}

/// Notes why allocation `id` could not move off `from`, and waits
/// [`MOVE_PAUSE`] before it is tried again.
fn pause(st: &mut State, id: u64, from: &str, mut why: String) {
    st.move_after.insert(id, Instant::now() + MOVE_PAUSE);
    if let Some(n) = st.nodes.get_mut(from) {
        if why.len() > MAX_DRAIN_NOTE {
            let mut cut = MAX_DRAIN_NOTE;
            while !why.is_char_boundary(cut) {
                cut -= 1;
            }
            why.truncate(cut);
        }
        n.drain_note = why;
    }
}
