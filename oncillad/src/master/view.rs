//! What the master shows: nodes with usage and state, allocations with
//! their attachments and health, and the placement candidates derived from
//! the same table. Read-only over the table.

use std::collections::{BTreeMap, BTreeSet};

use oncilla_model::alloc::{AllocRef, Allocation, Health};
use oncilla_model::node::{NodeState, NodeStatus};
use oncilla_model::Kind;

use super::placement::{Candidate, GpuRoom};
use super::state::{Record, State};
use super::{AgentLink, Master};
use crate::error::CoreError;

impl<L: AgentLink> Master<L> {
    /// Every node with its usage and state.
    pub fn nodes(&self) -> Vec<NodeStatus> {
        let st = self.lock();
        let left = super::drain::drain_left(&st);
        st.nodes
            .values()
            .map(|n| self.node_status(n, &left))
            .collect()
    }

    /// How many allocations there are and the bytes they hold, by kind and
    /// health (for metrics): one pass over the table, nothing cloned.
    pub fn census(&self) -> BTreeMap<(Kind, Health), (u64, u64)> {
        let st = self.lock();
        let mut out: BTreeMap<(Kind, Health), (u64, u64)> = BTreeMap::new();
        for rec in st.allocs.values() {
            let (health, _) = self.health(&st, rec);
            let e = out.entry((rec.alloc.kind, health)).or_default();
            e.0 += 1;
            e.1 += rec.alloc.size;
        }
        out
    }

    /// Every allocation, by id, with attachments and health.
    pub fn allocations(&self) -> Vec<Allocation> {
        self.allocations_page(0, usize::MAX, usize::MAX).0
    }

    /// Allocations with ids above `after`, in id order, with attachments
    /// and health: as many as fit in `max_allocations` and `max_extents`
    /// extents (always at least one), and whether more follow.
    pub fn allocations_page(
        &self,
        after: u64,
        max_allocations: usize,
        max_extents: usize,
    ) -> (Vec<Allocation>, bool) {
        let st = self.lock();
        let mut page = Vec::new();
        let mut extents: usize = 0;
        for rec in st.allocs.range(after.saturating_add(1)..).map(|(_, r)| r) {
            let n = rec.alloc.extents.len() + rec.alloc.replicas.len();
            if !page.is_empty()
                && (page.len() >= max_allocations || extents.saturating_add(n) > max_extents)
            {
                return (page, true);
            }
            extents += n;
            page.push(self.render(&st, rec));
        }
        (page, false)
    }

    /// One allocation, by id or name.
    ///
    /// # Errors
    /// [`CoreError::NoSuchAllocation`] / [`CoreError::NoSuchName`].
    pub fn allocation(&self, target: &AllocRef) -> Result<Allocation, CoreError> {
        let st = self.lock();
        let id = st.resolve(target)?;
        self.view(&st, id)
    }

    /// An allocation as clients see it: with attachments and health.
    pub(super) fn view(&self, st: &State, id: u64) -> Result<Allocation, CoreError> {
        let rec = st.allocs.get(&id).ok_or(CoreError::NoSuchAllocation(id))?;
        Ok(self.render(st, rec))
    }

    /// `rec` with the processes attached to it and its health.
    pub(super) fn render(&self, st: &State, rec: &Record) -> Allocation {
        let mut a = rec.alloc.clone();
        a.attached = st.attached_to(rec.alloc.id).into_iter().cloned().collect();
        let (health, mut notes) = self.health(st, rec);
        // Moving, or moved with its new primary not yet told: clients
        // wait it out (and reach it over TCP meanwhile).
        let id = rec.alloc.id;
        a.moving =
            st.moving.contains(&id) || st.copies_due_for(id) && rec.alloc.placement.copies() == 1;
        if st.moving.contains(&id) {
            notes.push("moving off a drained node".to_string());
        }
        a.health = health;
        a.health_notes = notes;
        a
    }

    /// One copy: LOST when a holder restarted since, DEGRADED when a
    /// holder is down or has not re-registered (or bytes are missing), else
    /// HEALTHY. A replicated allocation is as healthy as its best copy, and
    /// DEGRADED ("under-replicated") while any copy is not whole.
    fn health(&self, st: &State, rec: &Record) -> (Health, Vec<String>) {
        let copies = rec.alloc.placement.copies();
        if copies <= 1 {
            return self.copy_health(st, rec, 0);
        }
        let (mut whole, mut best, mut notes) = (0, Health::Lost, Vec::new());
        for copy in 0..copies {
            let (h, why) = if copy > 0 && rec.alloc.copy_extents(copy).next().is_none() {
                (Health::Lost, vec!["gone with its node".to_string()])
            } else {
                self.copy_health(st, rec, copy)
            };
            whole += usize::from(h == Health::Healthy);
            best = best.min(h);
            notes.extend(why.into_iter().map(|w| format!("copy {copy}: {w}")));
        }
        if best == Health::Healthy && whole < copies as usize {
            notes.push(format!(
                "under-replicated: {whole} of {copies} copies whole; reads use those"
            ));
            return (Health::Degraded, notes);
        }
        (best, notes)
    }

    /// The health of copy `copy` alone (see [`Self::health`]).
    fn copy_health(&self, st: &State, rec: &Record, copy: u32) -> (Health, Vec<String>) {
        let mut health = Health::Healthy;
        let mut notes = Vec::new();
        let holders: BTreeSet<&str> = rec
            .alloc
            .copy_extents(copy)
            .map(|e| e.node.as_str())
            .collect();
        for node in holders {
            if let Some(&at) = rec.lost.get(node) {
                health = Health::Lost;
                notes.push(format!(
                    "{node} restarted at unix ms {at}: its extents are gone"
                ));
                continue;
            }
            let state = st.nodes.get(node).map(|n| n.seen.state(&self.liveness));
            match state {
                Some((NodeState::Down, since)) => {
                    health = health.max(Health::Degraded);
                    notes.push(format!("{node} down since unix ms {since}"));
                }
                None => {
                    health = health.max(Health::Degraded);
                    notes.push(format!("{node} has not registered with this master"));
                }
                _ => {}
            }
        }
        if let Some((from, to)) = rec.alloc.first_gap(copy) {
            health = health.max(Health::Degraded);
            notes.push(if rec.alloc.placement.copies() > 1 {
                format!("bytes {from}..{to} gone with their node")
            } else {
                format!("bytes {from}..{to} not reported yet: their node has not re-registered")
            });
        }
        (health, notes)
    }

    /// Every node as placement sees it: free host room, liveness, and free
    /// room per GPU.
    pub(super) fn candidates(&self, st: &State) -> Vec<Candidate> {
        // Device memory placed so far, per (node, device): counted from the
        // GPU allocations' records each time (State keeps their ids), so no
        // path that removes an allocation can leave it wrong, and a table
        // of host allocations costs nothing here.
        // Extents on a node that restarted since are gone from its device
        // (its new report no longer counts them); reservations in flight
        // are not in the table yet.
        let mut on_gpu: BTreeMap<(&str, u32), u64> = BTreeMap::new();
        for r in st.gpu_records() {
            for e in &r.alloc.extents {
                if let (Some(g), false) = (e.gpu, r.lost.contains_key(&e.node)) {
                    *on_gpu.entry((e.node.as_str(), g)).or_default() += e.len;
                }
            }
        }
        for ((node, g), len) in &st.gpu_reserving {
            *on_gpu.entry((node.as_str(), *g)).or_default() += len;
        }
        st.nodes
            .values()
            .map(|n| Candidate {
                name: n.info.name.clone(),
                free: n.info.capacity.saturating_sub(n.reserved),
                up: n.seen.state(&self.liveness).0 == NodeState::Up,
                draining: n.draining,
                page: n.info.page(),
                gpus: n
                    .info
                    .gpu_devices
                    .iter()
                    .map(|g| GpuRoom {
                        index: g.index,
                        free: g.free.saturating_sub(
                            on_gpu
                                .get(&(n.info.name.as_str(), g.index))
                                .copied()
                                .unwrap_or(0),
                        ),
                    })
                    .collect(),
                gpu_note: n.info.gpu_note.clone(),
                zone: n.info.zone.clone(),
            })
            .collect()
    }
}
