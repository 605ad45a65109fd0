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
//! (`recovery.rs`). Instead, [`Master::refill`] re-creates it on another
//! node: reserves the share there, has the primary's agent send it the
//! whole share (agent to agent, never through a client), and only then
//! lists it, so no reader sees a copy that is still filling. That node
//! may hold other bytes of the allocation (in a small cluster every node
//! does), never these: a failed copy gives back only its own bytes
//! (`give_back.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use oncilla_model::alloc::{Allocation, Extent};
use oncilla_model::cluster::{Piece, Range, ReplicaShare, Reservation, SetCopies};
use oncilla_model::Fabric;

use super::allocate::check_pieces;
use super::give_back::{barred, owe};
use super::placement::{self, Planned};
use super::ranges::{intersect, merged, overlaps, subtract};
use super::state::{charge_of, Filling, State};
use super::{AgentLink, LinkError, Master};

/// How long a share whose copy could not be made waits before another try.
const REFILL_PAUSE: Duration = Duration::from_secs(5);

/// One copy being re-created.
struct Refill {
    alloc_id: u64,
    copy: u32,
    /// The primary's node and the bytes of it the copy gets.
    share: Planned,
    /// The primary's agent, and its replicas with the new one.
    primary_agent: String,
    replicas: Vec<ReplicaShare>,
    /// The node receiving it: name, agent and data addresses.
    target: (String, String, String),
    reservation: Reservation,
    /// When its copy change was decided (with the job).
    generation: u64,
}

impl<L: AgentLink> Master<L> {
    /// Takes every copy `node` holds out of the replicated allocations,
    /// promoting a replica where it held a primary share, and queues what
    /// their primaries' agents must be told. Allocations whose every copy
    /// of some bytes was on `node` keep those extents (degraded or lost,
    /// as with one copy).
    pub(super) fn drop_copies(st: &mut State, node: &str) {
        let mut due = Vec::new();
        let mut charges = Vec::new();
        let mut freed: Vec<u64> = Vec::new();
        for (id, rec) in &mut st.allocs {
            let a = &mut rec.alloc;
            if a.placement.copies() <= 1 || !a.held_on(node) {
                continue;
            }
            // Its room on the node, per copy as it was reserved.
            let mut per_copy: BTreeMap<u32, u64> = BTreeMap::new();
            for e in a.all_extents().filter(|e| e.node == node) {
                *per_copy.entry(e.copy).or_default() += e.len;
            }
            let before = charge_of(a);
            a.replicas.retain(|e| e.node != node);
            let promoted = promote(a, node);
            if !a.held_on(node) {
                freed.extend(per_copy.into_values());
            }
            let after = charge_of(a);
            charges.push((before, after));
            tracing::warn!(alloc_id = id, %node, promoted = promoted.len(), "a copy's node is lost: its copies leave the allocation");
            for primary in primaries(a) {
                let promote = promoted
                    .iter()
                    .filter(|(to, _)| *to == primary)
                    .flat_map(|(_, r)| r.iter().copied())
                    .collect();
                let replicas = replicas_of(a, &primary);
                due.push((*id, primary, promote, replicas));
            }
        }
        for (before, after) in charges {
            st.recharge(before, after);
        }
        if let Some(n) = st.nodes.get_mut(node) {
            for len in freed {
                n.reserved = n.reserved.saturating_sub(n.footprint(len));
            }
        }
        for (id, primary, promote, replicas) in due {
            queue(st, id, &primary, promote, replicas);
        }
    }

    /// Tells agents the copy changes they have not acknowledged; a failure
    /// is logged and asked again at the next call.
    pub(super) async fn send_copies(&self) {
        let due: Vec<((u64, String), (String, SetCopies))> = {
            let mut guard = self.lock();
            let st = &mut *guard;
            // A node that holds no primary bytes of the allocation any more
            // (its share moved, or the allocation is gone) has nothing to
            // copy: its change is dropped, not asked forever.
            let allocs = &st.allocs;
            st.copies_due.retain(|(id, node), _| {
                allocs
                    .get(id)
                    .is_some_and(|r| r.alloc.extents.iter().any(|e| e.node == *node))
            });
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

impl<L: AgentLink> Master<L> {
    /// Re-creates one missing copy, if a replicated allocation's primary
    /// share has fewer copies than asked and a node has room: reserves it
    /// there, has the primary's agent fill it, then lists it in the record.
    /// Undone whole when any step fails (asked again at a later tick).
    pub async fn refill(&self) {
        let Some(job) = self.next_refill() else {
            return;
        };
        let started = Instant::now();
        let reserved =
            self.link
                .reserve(&job.target.1, vec![job.reservation.clone()])
                .await
                .and_then(|r| {
                    let r = r.into_iter().next().ok_or_else(|| {
                        LinkError::BadReply("no answer to the reservation".into())
                    })?;
                    check_pieces(&job.share, r.pieces)
                });
        let pieces = match reserved {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(alloc_id = job.alloc_id, node = %job.target.0, error = %e, "could not reserve a new copy; trying again later");
                self.end_refill(&job);
                self.give_back_copy(&job).await;
                return;
            }
        };
        let change = SetCopies {
            alloc_id: job.alloc_id,
            promote: Vec::new(),
            replicas: job.replicas.clone(),
            fill: vec![job.target.2.clone()],
            generation: job.generation,
        };
        if let Err(e) = self.link.set_copies(&job.primary_agent, change).await {
            tracing::warn!(alloc_id = job.alloc_id, node = %job.target.0, error = %e, "could not fill a new copy; trying again later");
            self.end_refill(&job);
            // The primary may have taken the new replica before failing:
            // it is told its replicas again, before the copy goes (a write
            // it copies there meanwhile still lands).
            Self::tell_primaries(&mut self.lock(), job.alloc_id);
            self.send_copies().await;
            self.give_back_copy(&job).await;
            return;
        }
        let listed = {
            let mut st = self.lock();
            let listed = self.list_refill(&mut st, &job, pieces);
            self.end_refill_locked(&mut st, &job, listed);
            // A change queued while it filled was made without the new
            // copy: every primary is told the record's replicas again.
            Self::tell_primaries(&mut st, job.alloc_id);
            listed
        };
        if listed {
            let secs = started.elapsed().as_secs_f64();
            tracing::info!(alloc_id = job.alloc_id, copy = job.copy, node = %job.target.0, bytes = job.share.bytes(), secs, "copy re-created");
        } else {
            self.send_copies().await;
            self.give_back_copy(&job).await;
        }
    }

    /// The new copy's node lets go of it (and of nothing else it holds).
    async fn give_back_copy(&self, job: &Refill) {
        let (node, agent, _) = &job.target;
        self.give_back(node, agent, job.alloc_id, &job.share.ranges)
            .await;
    }

    /// Picks the next missing copy and holds room for it.
    fn next_refill(&self) -> Option<Refill> {
        if self.check_serving().is_err() {
            return None;
        }
        let mut st = self.lock();
        let now = Instant::now();
        st.refill_after.retain(|_, until| *until > now);
        let candidates = self.candidates(&st);
        let up = |node: &str| candidates.iter().any(|n| n.name == node && n.up);
        let mut found = None;
        'all: for (id, rec) in st.replicated_records() {
            let a = &rec.alloc;
            let copies = a.placement.copies();
            // A change not yet delivered comes first: the agents must
            // agree with the record before a copy is filled from it.
            let pending = st.copies_due_for(*id);
            if copies <= 1 || !rec.lost.is_empty() || pending {
                continue;
            }
            for primary in primaries(a) {
                let key = (*id, primary.clone());
                if st.refilling.contains_key(&key)
                    || st.refill_after.contains_key(&key)
                    || !up(&primary)
                {
                    continue;
                }
                // The primary's bytes that some copy has no node for (a
                // promoted node's bytes may be held by different nodes per
                // copy, so this is per byte, not per node).
                let ranges = merged(a.extents.iter().filter(|e| e.node == primary));
                let Some((copy, missing)) = (1..copies).find_map(|c| {
                    let missing = subtract(&ranges, &merged(a.copy_extents(c)));
                    (!missing.is_empty()).then_some((c, missing))
                }) else {
                    continue;
                };
                let missing = held_alike(a, &primary, &missing);
                // Any node but one that holds, gets or owes these bytes:
                // one holding other bytes of the allocation takes them
                // beside its own (a failed fill gives back only these).
                let barred = barred(&st, a, &missing);
                let barred: Vec<&str> = barred.iter().map(String::as_str).collect();
                let share = Planned {
                    node: primary.clone(),
                    ranges: missing,
                    gpu: None,
                };
                let Some(target) = placement::refill(&share, &barred, &candidates) else {
                    continue;
                };
                let (Some(p), Some(t)) = (st.nodes.get(&primary), st.nodes.get(&target.name))
                else {
                    continue;
                };
                let mut replicas = replicas_of(a, &primary);
                add_replica(
                    &mut replicas,
                    replica_share(&t.info.data_addr, &share.ranges),
                );
                found = Some(Refill {
                    alloc_id: *id,
                    copy,
                    primary_agent: p.info.agent_addr.clone(),
                    replicas,
                    target: (
                        t.info.name.clone(),
                        t.info.agent_addr.clone(),
                        t.info.data_addr.clone(),
                    ),
                    reservation: copy_reservation(a, &share.ranges, copy, Fabric::Tcp),
                    share,
                    generation: 0,
                });
                break 'all;
            }
        }
        let mut job = found?;
        job.generation = st.next_copies_generation();
        let node = st.nodes.get_mut(&job.target.0)?;
        node.reserved += node.footprint(job.share.bytes());
        st.refilling
            .entry((job.alloc_id, job.share.node.clone()))
            .or_default()
            .push(Filling {
                node: job.target.0.clone(),
                ranges: job.share.ranges.clone(),
            });
        tracing::info!(alloc_id = job.alloc_id, copy = job.copy, node = %job.target.0, bytes = job.share.bytes(), "re-creating a lost copy");
        Some(job)
    }

    /// Lists the filled copy in the record, if the allocation is still
    /// there and its primary still holds those bytes; whether it did.
    fn list_refill(&self, st: &mut State, job: &Refill, pieces: Vec<Piece>) -> bool {
        let Some(rec) = st.allocs.get_mut(&job.alloc_id) else {
            return false;
        };
        let primary = merged(
            rec.alloc
                .extents
                .iter()
                .filter(|e| e.node == job.share.node),
        );
        if !subtract(&job.share.ranges, &primary).is_empty() {
            return false;
        }
        let before = charge_of(&rec.alloc);
        rec.alloc
            .replicas
            .extend(pieces.into_iter().map(|p| Extent {
                node: job.target.0.clone(),
                alloc_offset: p.alloc_offset,
                len: p.len,
                pool_offset: p.pool_offset,
                data_addr: job.target.2.clone(),
                fabric: Fabric::Tcp,
                agent_addr: job.target.1.clone(),
                gpu: None,
                rdma: p.rdma,
                copy: job.copy,
                // Filled (its agent hears it at its next heartbeat).
                filling: false,
            }));
        rec.alloc.replicas.sort_by_key(|e| (e.copy, e.alloc_offset));
        let after = charge_of(&rec.alloc);
        st.recharge(before, after);
        true
    }

    /// A re-creation ended without its copy listed: its room goes back.
    fn end_refill(&self, job: &Refill) {
        let mut st = self.lock();
        self.end_refill_locked(&mut st, job, false);
    }

    fn end_refill_locked(&self, st: &mut State, job: &Refill, listed: bool) {
        let key = (job.alloc_id, job.share.node.clone());
        st.refilling.remove(&key);
        if !listed {
            // Not again before a pause, so one share that cannot be filled
            // does not hold up the others.
            st.refill_after.insert(key, Instant::now() + REFILL_PAUSE);
            if let Some(n) = st.nodes.get_mut(&job.target.0) {
                n.reserved = n.reserved.saturating_sub(n.footprint(job.share.bytes()));
            }
            // Owed back from now on (the give-back that follows pays it):
            // no heartbeat's reply confirms these bytes whole meanwhile.
            owe(st, &job.target.0, job.alloc_id, &job.share.ranges);
        }
    }

    /// Queues every primary share's replicas of `alloc_id` as the record
    /// says, to be sent at the next tick.
    pub(super) fn tell_primaries(st: &mut State, alloc_id: u64) {
        let Some(a) = st.allocs.get(&alloc_id).map(|r| r.alloc.clone()) else {
            return;
        };
        for primary in primaries(&a) {
            let replicas = replicas_of(&a, &primary);
            queue(st, alloc_id, &primary, Vec::new(), replicas);
        }
    }
}

/// Queues a copy change for `primary`'s agent: its replicas from now on,
/// and ranges it is promoted to (a promotion not yet delivered stays in
/// the change that replaces it). A copy of its share being made (re-created,
/// or moved off a drained node) stays among the replicas: it must get
/// every write until the record lists it or the copy is given up.
pub(super) fn queue(
    st: &mut State,
    id: u64,
    primary: &str,
    promote: Vec<Range>,
    mut replicas: Vec<ReplicaShare>,
) {
    let Some(agent) = st.nodes.get(primary).map(|n| n.info.agent_addr.clone()) else {
        return;
    };
    add_filling(st, id, primary, &mut replicas);
    let generation = st.next_copies_generation();
    let entry = st
        .copies_due
        .entry((id, primary.to_string()))
        .or_insert_with(|| (agent.clone(), SetCopies::default()));
    let mut all = std::mem::take(&mut entry.1.promote);
    all.extend(promote);
    let change = SetCopies {
        alloc_id: id,
        promote: all,
        replicas,
        fill: Vec::new(),
        generation,
    };
    *entry = (agent, change);
}

/// Adds to `replicas` (of `primary`'s bytes of allocation `id`) the
/// copies of them being made (re-created, or moved off a drained node):
/// each must get every write until the record lists it or it is given up.
pub(super) fn add_filling(st: &State, id: u64, primary: &str, replicas: &mut Vec<ReplicaShare>) {
    for f in st
        .refilling
        .get(&(id, primary.to_string()))
        .into_iter()
        .flatten()
    {
        let Some(addr) = st.nodes.get(&f.node).map(|n| n.info.data_addr.as_str()) else {
            continue;
        };
        add_replica(replicas, replica_share(addr, &f.ranges));
    }
}

/// Replaces the primary extents on `node` with replica extents holding
/// the same bytes, as copy 0: the lowest copy's first, each byte once, so
/// the bytes may go to several nodes, also to nodes that hold primary
/// bytes already (each copies a write only to the replicas holding its
/// bytes). Returns each promoted node with its new ranges; none when the
/// copies left do not hold all of the node's bytes (they stay with it,
/// degraded or lost as with one copy).
fn promote(a: &mut Allocation, node: &str) -> Vec<(String, Vec<Range>)> {
    let lost: Vec<(u64, u64)> = merged(a.extents.iter().filter(|e| e.node == node));
    if lost.is_empty() {
        return Vec::new();
    }
    // Look-ups, not scans: a striped allocation has tens of thousands of
    // extents, and this runs under the lock. `lost` is in order.
    let inside = |e: &Extent| {
        let i = lost.partition_point(|&(o, _)| o <= e.alloc_offset);
        i.checked_sub(1)
            .is_some_and(|i| e.alloc_offset + e.len <= lost[i].0 + lost[i].1)
    };
    // The lowest copy's extents first; `covered` (start -> end, never
    // overlapping) says whether an extent's bytes were taken already.
    let mut by_copy: Vec<usize> = (0..a.replicas.len()).collect();
    by_copy.sort_by_key(|&i| a.replicas[i].copy);
    let mut up = vec![false; a.replicas.len()];
    let mut covered: BTreeMap<u64, u64> = BTreeMap::new();
    for i in by_copy {
        let e = &a.replicas[i];
        let end = e.alloc_offset + e.len;
        let free = covered
            .range(..end)
            .next_back()
            .is_none_or(|(_, &until)| until <= e.alloc_offset);
        if inside(e) && free {
            up[i] = true;
            covered.insert(e.alloc_offset, end);
        }
    }
    let covered: Vec<(u64, u64)> = covered.into_iter().map(|(o, end)| (o, end - o)).collect();
    if !subtract(&lost, &covered).is_empty() {
        return Vec::new();
    }
    let mut taken = Vec::new();
    let mut rest = Vec::with_capacity(a.replicas.len());
    for (e, up) in std::mem::take(&mut a.replicas).into_iter().zip(up) {
        if up {
            taken.push(Extent { copy: 0, ..e });
        } else {
            rest.push(e);
        }
    }
    a.replicas = rest;
    let mut to: Vec<String> = taken.iter().map(|e| e.node.clone()).collect();
    to.sort();
    to.dedup();
    let promoted = to
        .into_iter()
        .map(|n| {
            let ranges = merged(taken.iter().filter(|e| e.node == n))
                .into_iter()
                .map(|(alloc_offset, len)| Range { alloc_offset, len })
                .collect();
            (n, ranges)
        })
        .collect();
    a.extents.retain(|e| e.node != node);
    a.extents.extend(taken);
    a.extents.sort_by_key(|e| e.alloc_offset);
    promoted
}

/// The nodes holding primary bytes of `a`, in order.
fn primaries(a: &Allocation) -> Vec<String> {
    let mut nodes: Vec<String> = a.extents.iter().map(|e| e.node.clone()).collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// The replicas of the bytes `primary` holds as primary: per other node
/// holding a copy of some of them, which (a range per copy's run of
/// bytes, never merged across copies).
pub(super) fn replicas_of(a: &Allocation, primary: &str) -> Vec<ReplicaShare> {
    let ranges = merged(a.extents.iter().filter(|e| e.node == primary));
    let mut nodes: Vec<(&str, &str)> = a
        .replicas
        .iter()
        .filter(|e| e.node != primary && overlaps(e, &ranges))
        .map(|e| (e.node.as_str(), e.data_addr.as_str()))
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
        .into_iter()
        .map(|(node, addr)| {
            let mut held = Vec::new();
            for copy in a.replica_copies() {
                let of_copy = merged(
                    a.replicas
                        .iter()
                        .filter(|e| e.node == node && e.copy == copy),
                );
                held.extend(intersect(&of_copy, &ranges));
            }
            held.sort_unstable();
            replica_share(addr, &held)
        })
        .collect()
}

/// The part of `missing` (bytes `primary` holds as primary) whose other
/// copies are held by the same nodes as its first byte's: a new copy of
/// them takes writes from one primary whichever copy is promoted when
/// `primary` dies (a node takes copies of one copy number from one
/// primary only: they are stamped per copy).
fn held_alike(a: &Allocation, primary: &str, missing: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let by_copy: Vec<Vec<&Extent>> = a
        .replica_copies()
        .into_iter()
        .map(|c| a.copy_extents(c).collect())
        .collect();
    let holders = |offset: u64| -> Vec<Option<&str>> {
        by_copy
            .iter()
            .map(|extents| {
                let i = extents.partition_point(|e| e.alloc_offset <= offset);
                i.checked_sub(1)
                    .map(|i| extents[i])
                    .filter(|e| offset < e.alloc_offset + e.len)
                    .map(|e| e.node.as_str())
            })
            .collect()
    };
    let Some(&(first, _)) = missing.first() else {
        return Vec::new();
    };
    let Some(start) = a
        .extents
        .iter()
        .find(|e| e.node == primary && e.alloc_offset <= first && first < e.alloc_offset + e.len)
        .map(|e| e.alloc_offset)
    else {
        return Vec::new();
    };
    let like = holders(start);
    let alike = merged(
        a.extents
            .iter()
            .filter(|e| e.node == primary && holders(e.alloc_offset) == like),
    );
    intersect(missing, &alike)
}

/// Adds `share` to a primary's `replicas`: a node that is a replica of
/// some of its bytes already (a copy made beside another) gets the new
/// ranges in its entry, one entry per node. A range already held there
/// adds nothing; ranges side by side stay apart (each may be of another
/// copy).
pub(super) fn add_replica(replicas: &mut Vec<ReplicaShare>, share: ReplicaShare) {
    let Some(r) = replicas.iter_mut().find(|r| r.data_addr == share.data_addr) else {
        replicas.push(share);
        return;
    };
    for g in share.ranges {
        let end = g.alloc_offset + g.len;
        let inside = r
            .ranges
            .iter()
            .any(|h| h.alloc_offset <= g.alloc_offset && end <= h.alloc_offset + h.len);
        if !inside {
            r.ranges.push(g);
        }
    }
    r.ranges.sort_by_key(|g| g.alloc_offset);
    // Overlapping ranges (none is expected) become one.
    let mut out: Vec<Range> = Vec::with_capacity(r.ranges.len());
    for g in r.ranges.drain(..) {
        match out.last_mut() {
            Some(last) if g.alloc_offset < last.alloc_offset + last.len => {
                let end = (g.alloc_offset + g.len).max(last.alloc_offset + last.len);
                last.len = end - last.alloc_offset;
            }
            _ => out.push(g),
        }
    }
    r.ranges = out;
}

/// A replica at `addr` of `ranges`.
pub(super) fn replica_share(addr: &str, ranges: &[(u64, u64)]) -> ReplicaShare {
    let ranges: Vec<Range> = ranges
        .iter()
        .map(|&(alloc_offset, len)| Range { alloc_offset, len })
        .collect();
    ReplicaShare::of(addr, &ranges)
}

/// The reservation of `ranges` of `a` as copy `copy` (a replica: it
/// takes writes only from its primary) on a node that holds none of
/// these bytes yet, reached as `fabric` says; the record it carries is `a` without
/// extents, key or attachments, as agents keep it. It is to be filled:
/// the agent reports it `filling` until a heartbeat's reply confirms it.
pub(super) fn copy_reservation(
    a: &Allocation,
    ranges: &[(u64, u64)],
    copy: u32,
    fabric: Fabric,
) -> Reservation {
    let mut record = a.clone();
    record.extents.clear();
    record.replicas.clear();
    record.access_key.clear();
    record.attached.clear();
    Reservation {
        alloc_id: a.id,
        access_key: a.access_key.clone(),
        ranges: ranges
            .iter()
            .map(|&(alloc_offset, len)| Range { alloc_offset, len })
            .collect(),
        record,
        fabric,
        gpu: None,
        copy,
        replicas: Vec::new(),
        fill: true,
    }
}

#[cfg(test)]
mod range_tests {
    use super::{add_replica, held_alike, replica_share, replicas_of};
    use crate::master::tests::extent;
    use oncilla_model::alloc::Allocation;
    use oncilla_model::Kind;

    /// p holds its own bytes [0, 100) and bytes it took over [100, 200);
    /// copy 1 of each is on a and n, copy 2 of both is missing.
    fn took_over() -> Allocation {
        let mut a = Allocation::new(1, 200, Kind::RemoteHost);
        a.extents = vec![extent("p", 0, 100, 0), extent("p", 100, 100, 0)];
        a.replicas = vec![extent("a", 0, 100, 1), extent("n", 100, 100, 1)];
        a
    }

    #[test]
    fn a_new_copy_is_of_bytes_whose_other_copies_are_held_alike() {
        let a = took_over();
        // Were p to die, [0, 100) goes to a and [100, 200) to n: one new
        // copy 2 of both would take copies from two primaries.
        assert_eq!(held_alike(&a, "p", &[(0, 200)]), [(0, 100)]);
        assert_eq!(held_alike(&a, "p", &[(150, 50)]), [(150, 50)]);
        assert!(held_alike(&a, "p", &[]).is_empty());
    }

    #[test]
    fn replicas_are_named_with_their_bytes_never_merged_across_copies() {
        let mut a = took_over();
        // n holds copy 1 of [100, 200) and copy 2 of [0, 100): adjacent
        // bytes of two copies, stamped apart.
        a.replicas.push(extent("n", 0, 100, 2));
        a.replicas.sort_by_key(|e| (e.copy, e.alloc_offset));
        let r = replicas_of(&a, "p");
        let ranges = |addr: &str| -> Vec<(u64, u64)> {
            r.iter()
                .find(|s| s.data_addr == addr)
                .map(|s| s.ranges.iter().map(|g| (g.alloc_offset, g.len)).collect())
                .unwrap_or_default()
        };
        assert_eq!(ranges("a:2"), [(0, 100)]);
        assert_eq!(ranges("n:2"), [(0, 100), (100, 100)]);
    }

    #[test]
    fn a_node_that_is_a_replica_already_gets_the_new_ranges_in_its_entry() {
        let share = |addr: &str, ranges: &[(u64, u64)]| replica_share(addr, ranges);
        let mut replicas = vec![share("x:2", &[(0, 10)]), share("y:2", &[(10, 10)])];
        add_replica(&mut replicas, share("x:2", &[(20, 5)]));
        add_replica(&mut replicas, share("z:2", &[(30, 5)]));
        // Again, or a part of one held: nothing more.
        add_replica(&mut replicas, share("x:2", &[(20, 5), (2, 3)]));
        assert_eq!(
            replicas,
            [
                share("x:2", &[(0, 10), (20, 5)]),
                share("y:2", &[(10, 10)]),
                share("z:2", &[(30, 5)])
            ]
        );
        // Side by side: kept apart.
        add_replica(&mut replicas, share("y:2", &[(20, 5)]));
        assert_eq!(replicas[1], share("y:2", &[(10, 10), (20, 5)]));
    }
}
