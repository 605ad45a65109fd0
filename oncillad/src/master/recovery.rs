//! How agents (re-)join the master, and how the master reconciles its table
//! with what they hold: it adopts allocations reported by agents that knew
//! a previous master (a master restart loses nothing), marks allocations
//! lost on an agent that restarted empty (a replicated one drops that
//! copy instead: `copies.rs`), ends sessions that died while it could not
//! hear of it, and tells agents to release what it has freed and copies it
//! dropped.
//! The agents' reports are the truth about memory; the master's table is
//! the truth about what is still wanted. Never holds the lock across an
//! await.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use oncilla_model::alloc::{Allocation, Extent, Health, Owner};
use oncilla_model::cluster::{Heartbeat, HeartbeatReply, Listed, Range, Registered, Registration};
use oncilla_model::node::{NodeInfo, NodeState, PoolUsage};

use super::give_back::owe;
use super::node::{unix_ms, Node, Seen, SessionsSeen};
use super::ranges::{merged, subtract};
use super::state::{charge_of, Record, State};
use super::{AgentLink, Master};
use crate::error::CoreError;
use oncilla_model::size::round_up;

/// Held ids a heartbeat's check looks up per hold of the master's lock.
const HELD_PER_LOCK: usize = 4096;

impl<L: AgentLink> Master<L> {
    /// Adds a node, or takes it back after a restart (its own or the
    /// master's), and reconciles the table with what it reports.
    ///
    /// # Errors
    /// [`CoreError::InvalidArgument`] for a node without name, endpoints or capacity.
    pub async fn register(&self, req: Registration) -> Result<Registered, CoreError> {
        let info = req.node.clone();
        if info.name.is_empty() || info.agent_addr.is_empty() || info.data_addr.is_empty() {
            return Err(CoreError::InvalidArgument(
                "a node needs a name, an agent address and a data address".into(),
            ));
        }
        if info.capacity == 0 {
            return Err(CoreError::InvalidArgument("a node needs capacity".into()));
        }
        let name = info.name.clone();
        self.check_incumbent(&name, req.incarnation).await?;
        let (release, dead, (peers_version, peers)) = {
            let mut st = self.lock();
            let (release, dead) = self.reconcile(&mut st, info, &req);
            (release, dead, refresh_peers(&mut st).clone())
        };
        for session in &dead {
            self.end_session(session).await;
        }
        Ok(Registered {
            heartbeat_interval_ms: u64::try_from(self.liveness.heartbeat.as_millis())
                .unwrap_or(u64::MAX),
            master_incarnation: self.incarnation,
            release,
            peers,
            peers_version,
            term: self.term,
        })
        .inspect(|r| {
            tracing::info!(node = %name, released = r.release.len(), dead_sessions = dead.len(), "node registered");
        })
    }

    /// Refuses a registration that would take over the name of a node whose
    /// agent is alive: when the name is known under another incarnation,
    /// the address it was registered from is asked who answers there. A
    /// restarted agent (the old one is gone, or the same address now
    /// answers with the new incarnation) passes; a second agent under the
    /// same name, or a forged registration, does not.
    ///
    /// # Errors
    /// [`CoreError::PermissionDenied`], naming the live agent.
    async fn check_incumbent(&self, name: &str, incarnation: u64) -> Result<(), CoreError> {
        let incumbent = {
            let st = self.lock();
            st.nodes
                .get(name)
                .filter(|n| n.incarnation != incarnation)
                .map(|n| (n.info.agent_addr.clone(), n.incarnation))
        };
        let Some((addr, known)) = incumbent else {
            return Ok(());
        };
        match self.link.identify(&addr).await {
            Ok((who, now)) if who == name && now == known => {
                tracing::warn!(node = %name, agent = %addr, "refused a registration for a node whose agent is alive");
                Err(CoreError::PermissionDenied(format!(
                    "node {name} is registered and its agent at {addr} is alive; another agent cannot take its name"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Everything [`Self::register`] decides under the lock; returns what
    /// the agent must release and the sessions to end.
    fn reconcile(
        &self,
        st: &mut State,
        info: NodeInfo,
        req: &Registration,
    ) -> (Vec<u64>, Vec<String>) {
        let name = info.name.clone();
        tracing::info!(node = %name, agent = %info.agent_addr, data = %info.data_addr, capacity = info.capacity, page = info.page_size, held = req.held.len(), "node registering");
        if !info.pool_note.is_empty() {
            tracing::warn!(node = %name, "{}", info.pool_note);
        }
        // A later part of a registration, or the same agent registering
        // again: what the table already counts on it stays counted (the
        // last part recounts it whole).
        let (reserved, pool) = st
            .nodes
            .get(&name)
            .filter(|prev| prev.incarnation == req.incarnation)
            .map_or(
                (
                    0,
                    PoolUsage {
                        free: info.capacity,
                        largest_free: info.capacity,
                        ..PoolUsage::default()
                    },
                ),
                |prev| (prev.reserved, prev.pool),
            );
        if st
            .nodes
            .get(&name)
            .is_some_and(|prev| prev.incarnation != req.incarnation)
        {
            let lost = Self::bytes_gone(st, &name);
            if lost > 0 {
                tracing::warn!(node = %name, allocations = lost, "node restarted with an empty pool: these allocations lost their extents there");
            }
        }
        // A drain outlasts the node's restarts (this master's word) and
        // the master's (a new master takes the agent's).
        let draining = st
            .nodes
            .get(&name)
            .map_or(req.draining, |prev| prev.draining);
        st.nodes.insert(
            name.clone(),
            Node {
                pool,
                info,
                incarnation: req.incarnation,
                reserved,
                seen: Seen::now(),
                logged: NodeState::Up,
                sessions: SessionsSeen {
                    next_seq: req.next_session_seq,
                    live: req
                        .sessions
                        .iter()
                        .map(|s| s.who.session_id.clone())
                        .collect(),
                },
                full_due: false,
                draining,
                drain_note: String::new(),
            },
        );

        // Reports from an agent that knew another master are adopted.
        let adopt = req.master_incarnation != 0 && req.master_incarnation != self.incarnation;
        // Also the ids of parts of this registration still on their way.
        st.next_id = st.next_id.max(req.max_held_id.saturating_add(1));
        // Copy changes decided from now on come after those it applied.
        st.copies_generation = st.copies_generation.max(req.copies_generation);
        let mut release = Vec::new();
        let mut adopted = 0usize;
        let mut primaries = Vec::new();
        for record in &req.held {
            let id = record.id;
            st.next_id = st.next_id.max(id.saturating_add(1));
            if !record.extents.is_empty() {
                primaries.push(id);
            }
            let (kept, give) = without_unconfirmed(st, &name, record);
            let nothing_kept = kept.extents.is_empty() && kept.replicas.is_empty();
            if !give.is_empty() {
                // A new copy a master was filling, or a move off a drained
                // node it had not finished, when it stopped: the copy may
                // lack bytes or later writes. The node keeps the rest; its
                // primaries stop copying writes to it.
                // Given back at a tick, once the primaries known then
                // were told (`send_give_backs`): a write they copy to it
                // meanwhile still lands.
                tracing::warn!(alloc_id = id, %name, ranges = give.len(), "node reports a new copy not confirmed whole; it is not taken, and given back");
                owe(st, &name, id, &give);
                st.retell.insert(id);
                Self::tell_primaries(st, id);
            }
            if nothing_kept {
                continue;
            }
            let record: &Allocation = &kept;
            // This master is making a copy there (a refill, or a move whose
            // new copies may be its primary already): it lists what it
            // keeps when that ends.
            let filled_here = st.filling(id).any(|to| to == name);
            if let Some(rec) = st.allocs.get_mut(&id) {
                if !oncilla_model::secret::ct_eq(&rec.alloc.access_key, &record.access_key) {
                    tracing::error!(alloc_id = id, node = %name, "node holds another allocation under an id this master reused (it came back after the recovery window); releasing the node's copy");
                    release.push(id);
                } else if filled_here && !rec.alloc.held_on(&name) {
                    // Nothing to take or release: the copy is in flight.
                } else if !rec.alloc.held_on(&name)
                    && rec.alloc.placement.copies() > 1
                    && !rec.adopted
                {
                    // A copy this master dropped while the node was away:
                    // it may have missed writes, so it is not taken back.
                    release.push(id);
                } else if !rec.alloc.held_on(&name) && overlaps_primary(&rec.alloc, &record.extents)
                {
                    // Two nodes report the same bytes as their primary: a
                    // move off a drained node was taking over when its
                    // master stopped, and no write went anywhere since (the
                    // old primary's copies were refused). The first report
                    // stays, and its agent is told its replicas; the node
                    // lets go of those bytes and keeps any others it holds.
                    tracing::warn!(alloc_id = id, node = %name, "node reports bytes another node holds as primary (a move cut short); releasing its copy of them");
                    let (twice, rest) = split_primary(&rec.alloc, record);
                    if rest.all_extents().next().is_none() {
                        release.push(id);
                    } else {
                        owe(st, &name, id, &merged(twice.iter()));
                        adopt_extents(st, &name, &rest);
                    }
                    Self::tell_primaries(st, id);
                } else if !rec.alloc.held_on(&name) {
                    adopt_extents(st, &name, record);
                } else if rec
                    .alloc
                    .all_extents()
                    .filter(|e| e.node == name)
                    .eq(record.all_extents())
                {
                    // The node holds these very extents: not lost, whatever
                    // a registration under another incarnation claimed.
                    rec.lost.remove(&name);
                }
                continue;
            }
            let owner_dead = record.owner.as_ref().is_some_and(|o| session_dead(st, o));
            if adopt && !st.freed_adopted.contains(&id) && !owner_dead {
                adopt_record(st, record.clone());
                took_room(st, &name, record);
                adopted += 1;
            } else if !st.reserving.contains(&id) {
                release.push(id);
            }
        }
        for s in &req.sessions {
            for &id in &s.attached {
                st.attach_session(s.who.clone(), id);
            }
        }
        // A primary share taken now of an allocation whose unconfirmed
        // copy was turned down before: its agent may still copy to it.
        for id in primaries {
            if st.retell.contains(&id) {
                Self::tell_primaries(st, id);
            }
        }

        if adopted > 0 {
            tracing::info!(node = %name, adopted, "allocations adopted from the node's report");
        }
        if req.more {
            // The last part settles the node: its accounting counts every
            // part, and its sessions' ends are judged once.
            return (release, Vec::new());
        }
        // Sessions of this node that ended while the master could not hear it.
        let mut dead: BTreeSet<String> = BTreeSet::new();
        let attached = st.sessions.values().map(|s| &s.who);
        for who in st.owners().chain(attached) {
            if who.node == name && session_dead(st, who) {
                dead.insert(who.session_id.clone());
            }
        }
        recount(st, &name);
        (release, dead.into_iter().collect())
    }

    /// Records a heartbeat: pool usage, sessions that ended (their
    /// allocations are freed) and ids the node holds (all, or those it
    /// reserved since its last heartbeat: the reply names those the master
    /// does not know, to release, and asks for all of them from a node it
    /// had not heard for a while). Unknown nodes, and nodes that restarted
    /// without registering, must register.
    pub async fn heartbeat(&self, req: Heartbeat) -> HeartbeatReply {
        let (peers_version, peers, want_full, draining) = {
            let mut st = self.lock();
            let Some(n) = st.nodes.get_mut(&req.name) else {
                return HeartbeatReply::default();
            };
            if n.incarnation != req.incarnation {
                return HeartbeatReply::default();
            }
            let before = n.seen.heard(&self.liveness);
            if before != NodeState::Up {
                tracing::info!(node = %req.name, "heard from node again");
            }
            // Copies may have been dropped while it was silent: its next
            // heartbeat lists everything it holds.
            let want_full = before != NodeState::Up || std::mem::take(&mut n.full_due);
            let draining = n.draining;
            n.pool = req.pool.unwrap_or(n.pool);
            for s in &req.ended_sessions {
                n.sessions.live.remove(s);
            }
            // The list travels only to an agent that lacks this version.
            let (version, peers) = if req.peers_version == st.peers.0 {
                (st.peers.0, Vec::new())
            } else {
                st.peers.clone()
            };
            (version, peers, want_full, draining)
        };
        // Freed, a copy the node holds that was dropped while it was away
        // (it may have missed writes), or one that moved off it (a drain
        // whose release did not get through); not one being reserved or
        // filled there, nor one it owes back (that goes by its give-back,
        // after the primaries were told). Checked a chunk of ids at a
        // time, the lock taken for each: a node that holds a million
        // allocations does not stop allocations for the whole list.
        let mut release = Vec::new();
        for chunk in req.held.chunks(HELD_PER_LOCK) {
            let st = self.lock();
            release.extend(chunk.iter().copied().filter(|&id| {
                !st.in_flux(id, &req.name)
                    && st
                        .allocs
                        .get(&id)
                        .is_none_or(|r| !r.alloc.held_on(&req.name))
            }));
        }
        if !release.is_empty() {
            tracing::info!(node = %req.name, ids = ?release, "node holds allocations the master has freed; releasing them");
        }
        // New copies the node holds that are whole now (the bytes the
        // record lists there, nothing of them in flux): the agent stops
        // reporting its extents inside them filling.
        let mut whole = Vec::new();
        for chunk in req.filling.chunks(HELD_PER_LOCK) {
            let st = self.lock();
            whole.extend(chunk.iter().filter_map(|&id| {
                st.listed_on(id, &req.name).map(|on| Listed {
                    alloc_id: id,
                    ranges: on
                        .into_iter()
                        .map(|(alloc_offset, len)| Range { alloc_offset, len })
                        .collect(),
                })
            }));
        }
        for s in &req.ended_sessions {
            self.end_session(s).await;
        }
        HeartbeatReply {
            known: true,
            release,
            peers,
            peers_version,
            want_full,
            draining,
            whole,
        }
    }
}

impl<L: AgentLink> Master<L> {
    /// What the table keeps of a node whose pool is gone (it restarted, or
    /// left): replicated allocations go on with their other copies, the
    /// others lose their extents there. How many lost bytes.
    pub(super) fn bytes_gone(st: &mut State, node: &str) -> usize {
        Self::drop_copies(st, node);
        let now = unix_ms();
        let mut lost = 0;
        for rec in st.allocs.values_mut() {
            if rec.alloc.held_on(node) {
                rec.lost.entry(node.to_string()).or_insert(now);
                lost += 1;
            }
        }
        lost
    }
}

/// Every known node's data address (see [`Registered::peers`]), with a
/// new version when it changed since the last time.
pub(super) fn refresh_peers(st: &mut State) -> &(u64, Vec<String>) {
    let now: Vec<String> = st
        .nodes
        .values()
        .map(|n| n.info.data_addr.clone())
        .collect();
    if now != st.peers.1 || st.peers.0 == 0 {
        st.peers = (st.peers.0 + 1, now);
    }
    &st.peers
}

/// Whether the session `who` names is known to have ended: its agent has
/// registered with this master since, under another incarnation, or
/// without it among the sessions open then (or it ended after).
fn session_dead(st: &State, who: &Owner) -> bool {
    let Some(n) = st.nodes.get(&who.node) else {
        return false;
    };
    n.incarnation != who.agent_incarnation
        || (who.session_seq < n.sessions.next_seq && !n.sessions.live.contains(&who.session_id))
}

/// Puts a record reported after a master restart back in the table.
fn adopt_record(st: &mut State, mut alloc: Allocation) {
    let id = alloc.id;
    alloc.replicas.sort_by_key(|e| (e.copy, e.alloc_offset));
    alloc.attached.clear();
    alloc.health = Health::Healthy;
    alloc.health_notes.clear();
    if !alloc.name.is_empty() {
        match st.names.get(&alloc.name) {
            Some(&other) if other != id => tracing::error!(
                alloc_id = id,
                name = %alloc.name,
                other,
                "a reported allocation's name is taken (its node came back after the recovery window); it stays, reachable by id only"
            ),
            _ => {
                st.names.insert(alloc.name.clone(), id);
            }
        }
    }
    tracing::debug!(alloc_id = id, name = %alloc.name, "allocation adopted from a node's report");
    st.insert(
        Record {
            alloc,
            lost: BTreeMap::new(),
            adopted: true,
        },
        false,
    );
}

/// Recomputes what the table places on `node` (the last part of its
/// registration settles it).
fn recount(st: &mut State, node: &str) {
    let Some(page) = st.nodes.get(node).map(|n| n.info.page()) else {
        return;
    };
    let reserved = st
        .allocs
        .values()
        .filter(|r| !r.lost.contains_key(node))
        .map(|r| footprint_on(&r.alloc, node, page))
        .sum();
    if let Some(n) = st.nodes.get_mut(node) {
        n.reserved = reserved;
        n.pool.used = reserved;
        n.pool.free = n.info.capacity.saturating_sub(reserved);
        n.pool.largest_free = n.pool.free;
    }
}

/// Counts the room a part of a registration brings back to `node` (the
/// extents in `record`) at once, so placement never sees the node emptier
/// than it is while the other parts are on their way.
fn took_room(st: &mut State, node: &str, record: &Allocation) {
    if let Some(n) = st.nodes.get_mut(node) {
        n.reserved += footprint_on(record, node, n.info.page());
    }
}

/// What `alloc`'s extents take on `node`: per copy, its ranges there
/// rounded up to whole pages, as placement counted them.
fn footprint_on(alloc: &Allocation, node: &str, page: u64) -> u64 {
    // Each copy's ranges on the node were reserved together.
    let mut per_copy: BTreeMap<u32, u64> = BTreeMap::new();
    for e in alloc.all_extents() {
        if e.node == node && e.gpu.is_none() {
            *per_copy.entry(e.copy).or_default() += e.len;
        }
    }
    per_copy.values().map(|&len| round_up(len, page)).sum()
}

/// `record`, as node `name` reports it, without the replica extents the
/// table must not take as a copy unless it lists them there already: a
/// new copy not confirmed whole (`Extent::filling`), and any replica of
/// an allocation with one copy (a move off a drained node cut short).
/// Returns the rest, and the ranges the node must give back: all of
/// those, but ones this master is filling there now (their fill lists
/// them when it ends).
fn without_unconfirmed<'a>(
    st: &State,
    name: &str,
    record: &'a Allocation,
) -> (Cow<'a, Allocation>, Vec<(u64, u64)>) {
    let one_copy = record.placement.copies() == 1;
    if !record.replicas.iter().any(|e| e.filling || one_copy) {
        return (Cow::Borrowed(record), Vec::new());
    }
    let listed: BTreeSet<(u32, u64, u64)> = st
        .allocs
        .get(&record.id)
        .into_iter()
        .flat_map(|r| r.alloc.replicas.iter())
        .filter(|e| e.node == name)
        .map(|e| (e.copy, e.alloc_offset, e.len))
        .collect();
    let (turned, kept): (Vec<Extent>, Vec<Extent>) =
        record.replicas.iter().cloned().partition(|e| {
            (e.filling || one_copy) && !listed.contains(&(e.copy, e.alloc_offset, e.len))
        });
    let mut filled_here: Vec<(u64, u64)> = st
        .fills(record.id)
        .filter(|f| f.node == name)
        .flat_map(|f| f.ranges.iter().copied())
        .collect();
    filled_here.sort_unstable();
    let give = subtract(&merged(turned.iter()), &filled_here);
    let rest = Allocation {
        replicas: kept,
        ..record.clone()
    };
    (Cow::Owned(rest), give)
}

/// Lists node `name`'s extents in `record` in the table's record of the
/// same allocation, counted against its user and on the node.
fn adopt_extents(st: &mut State, name: &str, record: &Allocation) {
    let Some(rec) = st.allocs.get_mut(&record.id) else {
        return;
    };
    let before = charge_of(&rec.alloc);
    rec.alloc.merge_extents(record);
    let after = charge_of(&rec.alloc);
    st.recharge(before, after);
    took_room(st, name, record);
}

/// `record`'s primary extents that cover bytes `rec`'s primary extents
/// already do, and `record` without them.
fn split_primary(rec: &Allocation, record: &Allocation) -> (Vec<Extent>, Allocation) {
    let (twice, once): (Vec<Extent>, Vec<Extent>) = record
        .extents
        .iter()
        .cloned()
        .partition(|r| overlaps_primary(rec, std::slice::from_ref(r)));
    let rest = Allocation {
        extents: once,
        ..record.clone()
    };
    (twice, rest)
}

/// Whether primary `extents` cover bytes `rec`'s primary extents already
/// do. A primary's extents are sorted by offset and never
/// overlap, so each reported extent is checked against the one extent of
/// `rec` that starts last before its end (a binary search: a striped
/// allocation reports tens of thousands of extents per node).
fn overlaps_primary(rec: &Allocation, extents: &[Extent]) -> bool {
    extents.iter().any(|r| {
        let end = r.alloc_offset + r.len;
        let before = rec.extents.partition_point(|e| e.alloc_offset < end);
        before > 0 && {
            let e = &rec.extents[before - 1];
            e.alloc_offset + e.len > r.alloc_offset
        }
    })
}
