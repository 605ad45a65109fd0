//! The master's table and its bookkeeping: nodes, allocation records,
//! names, sessions, reservations in flight, and what each user holds
//! against their quota, with the pure functions that keep them consistent. Nothing here awaits, logs decisions or reaches an
//! agent; callers hold the master's lock around every use.

use std::collections::{BTreeMap, BTreeSet};

use oncilla_model::alloc::{AllocRef, Allocation, Owner};
use oncilla_model::cluster::SetCopies;
use oncilla_model::quota::{Charge, Quotas, Usage};

use super::node::Node;
use super::placement::Planned;
use crate::error::CoreError;

/// An allocation as the master keeps it.
pub(super) struct Record {
    /// Without attachments (derived from sessions) and health (derived from
    /// node states when listed).
    pub alloc: Allocation,
    /// Nodes that restarted since, losing their extents: name -> unix ms.
    pub lost: BTreeMap<String, u64>,
    /// Rebuilt from an agent's report after a master restart.
    pub adopted: bool,
}

/// A process's session, known from its allocations and attachments.
pub(super) struct SessionRec {
    pub who: Owner,
    /// Persistent allocations it is attached to.
    pub attached: BTreeSet<u64>,
}

/// A planned share of an allocation with its agent's addresses
/// (agent, data).
pub(super) type Target = (Planned, String, String);

/// The whole table.
#[derive(Default)]
pub(super) struct State {
    pub nodes: BTreeMap<String, Node>,
    pub allocs: BTreeMap<u64, Record>,
    /// Name -> id of named allocations.
    pub names: BTreeMap<String, u64>,
    pub sessions: BTreeMap<String, SessionRec>,
    /// Indexes kept by [`State::insert`], [`State::remove`] and the
    /// session methods below, so that no request scans the table:
    /// allocations by owning session, attached sessions by allocation,
    /// the ids of GPU allocations (placement counts device memory from
    /// their records) and of replicated ones (the refill looks for a
    /// missing copy among them).
    owned: BTreeMap<String, BTreeSet<u64>>,
    attachments: BTreeMap<u64, BTreeSet<String>>,
    gpu_allocs: BTreeSet<u64>,
    replicated: BTreeSet<u64>,
    /// Ids being reserved: agents already hold them, the table not yet.
    pub reserving: BTreeSet<u64>,
    /// Device memory of allocations being reserved, per (node, GPU): not
    /// in `allocs` yet, but no longer free for placement.
    pub gpu_reserving: BTreeMap<(String, u32), u64>,
    /// Adopted allocations freed since: a late report of one is released,
    /// not adopted again.
    pub freed_adopted: BTreeSet<u64>,
    pub next_id: u64,
    /// Every node's data address, and its version (bumped when it
    /// changes): what agents may pull from.
    pub peers: (u64, Vec<String>),
    pub quotas: Quotas,
    /// What each user's allocations (recorded, and being reserved) hold.
    pub usage: BTreeMap<u32, Usage>,
    /// Replicated allocations' copy changes agents must still be told,
    /// per (allocation, primary node): the agent's address and the change
    /// (see `copies.rs`).
    pub copies_due: BTreeMap<(u64, String), (String, SetCopies)>,
    /// The last copy change's generation: every change is decided under
    /// the lock with the next one, above any an agent reported applying
    /// (`SetCopies::generation`).
    pub copies_generation: u64,
    /// Copies being made, per (allocation, primary node): re-created, or
    /// moved off a drained node (the nodes receiving them hold the id
    /// before the record lists them).
    pub refilling: BTreeMap<(u64, String), Vec<Filling>>,
    /// Shares whose copy could not be made, not tried again before then.
    pub refill_after: BTreeMap<(u64, String), std::time::Instant>,
    /// Allocations moving off a drained node (`drain.rs`), and those whose
    /// move failed, not tried again before then.
    pub moving: BTreeSet<u64>,
    pub move_after: BTreeMap<u64, std::time::Instant>,
    /// Per drained node, the id its next move is looked for from.
    pub drain_cursor: BTreeMap<String, u64>,
    /// Bytes nodes must let go of while they keep other bytes of the same
    /// allocation, per (allocation, node), until their agents confirm
    /// (`give_back.rs`).
    pub owed: BTreeMap<(u64, String), Vec<(u64, u64)>>,
    /// Allocations a registration reported a copy of that the table did
    /// not take (not confirmed whole): their primaries' agents may still
    /// copy writes to it, so each is told the record's replicas, also one
    /// that registers later (`recovery.rs`).
    pub retell: BTreeSet<u64>,
}

/// A copy being made of some of a primary's bytes.
#[derive(Debug, Clone)]
pub struct Filling {
    /// The node receiving it.
    pub node: String,
    /// Which of the primary's bytes it gets (merged, in order).
    pub ranges: Vec<(u64, u64)>,
}

impl State {
    /// The generation of a copy change decided now.
    pub fn next_copies_generation(&mut self) -> u64 {
        self.copies_generation += 1;
        self.copies_generation
    }

    /// The refusal of a request naming a node this master does not know,
    /// with those it knows.
    pub fn unknown_node(&self, name: &str) -> CoreError {
        CoreError::UnknownNode {
            name: name.to_string(),
            known: self.nodes.keys().cloned().collect::<Vec<_>>().join(", "),
        }
    }

    /// Whether a copy change of allocation `id` is still to be told.
    pub fn copies_due_for(&self, id: u64) -> bool {
        of_alloc(&self.copies_due, id).next().is_some()
    }

    /// The copies of allocation `id` being made (re-created, or moved off
    /// a drained node), of every primary's bytes.
    pub fn fills(&self, id: u64) -> impl Iterator<Item = &Filling> {
        of_alloc(&self.refilling, id).flatten()
    }

    /// The nodes a copy of allocation `id` is being made on.
    pub fn filling(&self, id: u64) -> impl Iterator<Item = &str> {
        self.fills(id).map(|f| f.node.as_str())
    }

    /// Whether allocation `id` is in flux on `node`: being reserved, a
    /// copy of it being made there, or bytes of it owed back from there.
    pub fn in_flux(&self, id: u64, node: &str) -> bool {
        self.reserving.contains(&id)
            || self.filling(id).any(|n| n == node)
            || self.owing(id).any(|n| n == node)
    }

    /// The bytes of allocation `id` the record lists on `node` (merged,
    /// in order), when it is not in flux there: an agent's new copy
    /// inside them is confirmed whole.
    pub fn listed_on(&self, id: u64, node: &str) -> Option<Vec<(u64, u64)>> {
        if self.in_flux(id, node) {
            return None;
        }
        let rec = self.allocs.get(&id)?;
        let on = super::ranges::merged(rec.alloc.all_extents().filter(|e| e.node == node));
        (!on.is_empty()).then_some(on)
    }

    /// The nodes that still owe allocation `id` a give-back.
    pub fn owing(&self, id: u64) -> impl Iterator<Item = &str> {
        self.owed
            .range((id, String::new())..)
            .take_while(move |((owed, _), _)| *owed == id)
            .map(|((_, node), _)| node.as_str())
    }

    pub fn new() -> Self {
        Self {
            next_id: id_floor(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            ),
            ..Self::default()
        }
    }

    /// Ends the device-memory reservations of `targets` (recorded or rolled back).
    pub fn unreserve_gpus(&mut self, targets: &[Target]) {
        for (p, _, _) in targets {
            let Some(g) = p.gpu else { continue };
            let key = (p.node.clone(), g);
            if let Some(left) = self.gpu_reserving.get_mut(&key) {
                *left = left.saturating_sub(p.bytes());
                if *left == 0 {
                    self.gpu_reserving.remove(&key);
                }
            }
        }
    }

    /// Counts `charge` against user `uid` (`add`), or gives it back.
    pub fn charge(&mut self, uid: u32, charge: &Charge, add: bool) {
        let usage = self.usage.entry(uid).or_default();
        if add {
            usage.add(charge);
        } else {
            usage.sub(charge);
            if usage.is_empty() {
                self.usage.remove(&uid);
            }
        }
    }

    /// Gives back what an allocation counted (`before`) and counts what it
    /// counts now (`after`): its extents changed.
    pub fn recharge(&mut self, before: Option<(u32, Charge)>, after: Option<(u32, Charge)>) {
        for (charge, add) in [(before, false), (after, true)] {
            if let Some((uid, c)) = charge {
                self.charge(uid, &c, add);
            }
        }
    }

    /// Puts a record in the table, counting it against its user.
    pub fn insert(&mut self, rec: Record, counted: bool) {
        if !counted {
            if let Some((uid, c)) = charge_of(&rec.alloc) {
                self.charge(uid, &c, true);
            }
        }
        let id = rec.alloc.id;
        if let Some(owner) = &rec.alloc.owner {
            self.owned
                .entry(owner.session_id.clone())
                .or_default()
                .insert(id);
        }
        if rec.alloc.kind.is_gpu() {
            self.gpu_allocs.insert(id);
        }
        if rec.alloc.placement.copies() > 1 {
            self.replicated.insert(id);
        }
        self.allocs.insert(id, rec);
    }

    /// The records of GPU allocations.
    pub fn gpu_records(&self) -> impl Iterator<Item = &Record> {
        self.gpu_allocs.iter().filter_map(|id| self.allocs.get(id))
    }

    /// The records of replicated allocations, in id order.
    pub fn replicated_records(&self) -> impl Iterator<Item = (&u64, &Record)> {
        self.replicated
            .iter()
            .filter_map(|id| self.allocs.get_key_value(id))
    }

    /// The owner of each session that owns allocations (from the index:
    /// one record per session, not the table).
    pub fn owners(&self) -> impl Iterator<Item = &Owner> {
        self.owned.values().filter_map(|ids| {
            ids.first()
                .and_then(|id| self.allocs.get(id))
                .and_then(|r| r.alloc.owner.as_ref())
        })
    }

    /// Ids of the allocations session `session` owns.
    pub fn owned_by(&self, session: &str) -> Vec<u64> {
        self.owned
            .get(session)
            .map(|ids| ids.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Adds `who` to the processes attached to `id`.
    pub fn attach_session(&mut self, who: Owner, id: u64) {
        let session = who.session_id.clone();
        self.sessions
            .entry(session.clone())
            .or_insert_with(|| SessionRec {
                who,
                attached: BTreeSet::new(),
            })
            .attached
            .insert(id);
        self.attachments.entry(id).or_default().insert(session);
    }

    /// Takes `session` off the processes attached to `id`.
    pub fn detach_session(&mut self, session: &str, id: u64) {
        if let Some(s) = self.sessions.get_mut(session) {
            s.attached.remove(&id);
        }
        self.unindex_attachment(id, session);
    }

    /// Forgets session `session`'s attachments (it ended); returns the ids
    /// of the allocations it owns, still in the table.
    pub fn end_session(&mut self, session: &str) -> Vec<u64> {
        if let Some(s) = self.sessions.remove(session) {
            for id in s.attached {
                self.unindex_attachment(id, session);
            }
        }
        self.owned_by(session)
    }

    fn unindex_attachment(&mut self, id: u64, session: &str) {
        if let Some(by) = self.attachments.get_mut(&id) {
            by.remove(session);
            if by.is_empty() {
                self.attachments.remove(&id);
            }
        }
    }

    /// Processes attached to `id`.
    pub fn attached_to(&self, id: u64) -> Vec<&Owner> {
        self.attachments
            .get(&id)
            .into_iter()
            .flatten()
            .filter_map(|session| self.sessions.get(session))
            .map(|s| &s.who)
            .collect()
    }

    /// Takes `id` out of the table and its nodes' accounting; returns the
    /// holders to release it on (`(node, agent address)`), one per node.
    pub fn remove(&mut self, id: u64) -> Vec<(String, String)> {
        let Some(rec) = self.allocs.remove(&id) else {
            return Vec::new();
        };
        if let Some((uid, c)) = charge_of(&rec.alloc) {
            self.charge(uid, &c, false);
        }
        if self.names.get(&rec.alloc.name) == Some(&id) {
            self.names.remove(&rec.alloc.name);
        }
        if let Some(owner) = &rec.alloc.owner {
            if let Some(ids) = self.owned.get_mut(&owner.session_id) {
                ids.remove(&id);
                if ids.is_empty() {
                    self.owned.remove(&owner.session_id);
                }
            }
        }
        self.gpu_allocs.remove(&id);
        self.replicated.remove(&id);
        self.retell.remove(&id);
        for session in self.attachments.remove(&id).unwrap_or_default() {
            if let Some(s) = self.sessions.get_mut(&session) {
                s.attached.remove(&id);
            }
        }
        let due: Vec<(u64, String)> = self
            .copies_due
            .range((id, String::new())..)
            .take_while(|((due, _), _)| *due == id)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            self.copies_due.remove(&k);
        }
        if rec.adopted {
            self.freed_adopted.insert(id);
        }
        // One Release per agent, and each copy's footprint there counted
        // once: a copy's ranges on a node were reserved together.
        let mut per_copy: BTreeMap<(&str, u32), u64> = BTreeMap::new();
        for e in rec.alloc.all_extents() {
            // GPU memory is not the host pool's: the node is a holder all the same.
            let host = if e.gpu.is_none() { e.len } else { 0 };
            *per_copy.entry((e.node.as_str(), e.copy)).or_default() += host;
        }
        let mut holders: Vec<(String, String)> = Vec::with_capacity(per_copy.len());
        for ((node, _), len) in per_copy {
            if rec.lost.contains_key(node) {
                continue;
            }
            if let Some(n) = self.nodes.get_mut(node) {
                n.reserved = n.reserved.saturating_sub(n.footprint(len));
                if holders.last().is_none_or(|(last, _)| last != node) {
                    holders.push((node.to_string(), n.info.agent_addr.clone()));
                }
            }
        }
        holders
    }

    /// The id an [`AllocRef`] names.
    pub fn resolve(&self, target: &AllocRef) -> Result<u64, CoreError> {
        match target {
            AllocRef::Id(id) => Ok(*id),
            AllocRef::Name(name) => self
                .names
                .get(name)
                .copied()
                .ok_or_else(|| CoreError::NoSuchName(name.clone())),
        }
    }
}

/// What `alloc` counts against its user's quota, and the user; `None` for
/// an operator's allocation (no user).
pub fn charge_of(alloc: &Allocation) -> Option<(u32, Charge)> {
    let uid = alloc.user?;
    let mut nodes: BTreeMap<String, u64> = BTreeMap::new();
    for e in alloc.extents.iter().chain(&alloc.replicas) {
        *nodes.entry(e.node.clone()).or_default() += e.len;
    }
    Some((
        uid,
        Charge {
            bytes: alloc
                .size
                .saturating_mul(u64::from(alloc.placement.copies())),
            nodes,
            persistent: alloc.owner.is_none(),
        },
    ))
}

/// Where a master started at `now_ms` (Unix milliseconds) begins its ids:
/// 1,024 per millisecond since the epoch. An earlier master counted up
/// from its own start the same way, so unless it handed out more than
/// about a million ids a second over its whole life, every id it gave is
/// below this one's first, even of a node that is away while this master
/// starts (registrations raise the counter past what the nodes present
/// hold as well). Rises until the year 2248, where it stops a trillion
/// ids below [`oncilla_model::alloc::MAX_ID`].
pub fn id_floor(now_ms: u64) -> u64 {
    // A trillion ids left above the floor even then.
    now_ms
        .saturating_mul(1024)
        .clamp(1, oncilla_model::alloc::MAX_ID - (1 << 40))
}

/// The values of `map` (keyed by allocation and node) for allocation `id`.
fn of_alloc<V>(map: &BTreeMap<(u64, String), V>, id: u64) -> impl Iterator<Item = &V> {
    map.range((id, String::new())..)
        .take_while(move |((of, _), _)| *of == id)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod id_tests {
    use super::id_floor;

    #[test]
    fn a_later_master_starts_past_what_an_earlier_one_gave() {
        let first = id_floor(1_790_000_000_000);
        // A minute later, after half a million allocations a minute ago.
        let gave = first + 500_000;
        assert!(id_floor(1_790_000_060_000) > gave);
        assert!(id_floor(u64::MAX) < oncilla_model::alloc::MAX_ID);
        assert_eq!(id_floor(0), 1);
    }
}
