//! The agent's side of a copy change (`Agent.SetCopies`): a replica
//! promoted to primary, the replicas a primary share copies its writes
//! to, and a new replica it fills, including the first replica of an
//! allocation with one copy that moves off a drained node. The master
//! decides every change; this only applies it to the allocation's
//! `Held` and `Copying`, the latest decided last whatever order changes
//! arrive in (their generation).

use std::sync::Arc;

use oncilla_model::cluster::SetCopies;

use super::Agent;
use crate::error::CoreError;
use crate::memory::copying::Order;
use crate::memory::held::HeldExtent;

impl Agent {
    /// A replicated allocation's copies changed: the ranges of `c.promote`
    /// that this node held as a replica are its primary's from now on
    /// (also beside a primary share it held already), each write to its
    /// primary ranges goes to the `c.replicas` holding its bytes (a
    /// promoted range is sent to them again first), and each of `c.fill`
    /// (a new replica) is owed all it holds (`fabric::replicate::fill`
    /// sends it).
    ///
    /// The master may send two changes of one allocation at once (a queued
    /// one and a re-created copy's), and they may arrive in either order:
    /// the replicas of a change decided before one already applied are
    /// not taken (the later one knew of it). Its promotions are, as each
    /// range is promoted once (a range already this node's primary is
    /// left as it is), and its fill is, if the replicas in force list the
    /// new one.
    ///
    /// # Errors
    /// [`CoreError::NoSuchAllocation`]; [`CoreError::InvalidArgument`] for
    /// a promoted range this node holds neither as a replica nor as its
    /// primary, or a fill where it holds no primary share;
    /// [`CoreError::CannotMove`] for a new replica of a single-copy
    /// allocation that is GPU memory or that a process here maps;
    /// [`CoreError::Superseded`] for a fill of a replica that a later
    /// change left out.
    pub fn set_copies(&self, c: SetCopies) -> Result<(), CoreError> {
        let copying = self
            .held
            .get(&c.alloc_id)
            .map(|e| Arc::clone(&e.value().copying))
            .ok_or(CoreError::NoSuchAllocation(c.alloc_id))?;
        let promote: Vec<(u64, u64)> = c.promote.iter().map(|g| (g.alloc_offset, g.len)).collect();
        // The order lock first (a write may hold it while it copies), then
        // the replica side's (a copy landing finishes first, and none lands
        // in a range once it is promoted), then the table's entry, only for
        // as long as it takes to change it.
        let mut order = copying.order();
        let latest = c.generation >= order.generation;
        if let Some(addr) = c
            .fill
            .iter()
            .find(|a| !latest && order.replica(a).is_none())
        {
            return Err(CoreError::Superseded(format!(
                "a later change of allocation {}'s copies left out replica {addr}; ask again with the copies as they are now",
                c.alloc_id
            )));
        }
        if !c.fill.is_empty() {
            self.may_gain_replica(c.alloc_id, &order)?;
        }
        let applied = copying.applied();
        let mut entry = self
            .held
            .get_mut(&c.alloc_id)
            .ok_or(CoreError::NoSuchAllocation(c.alloc_id))?;
        let mut cur = Arc::clone(entry.value());
        if !c.fill.is_empty() && promote.is_empty() && cur.extents.iter().all(|e| e.copy != 0) {
            return Err(CoreError::InvalidArgument(format!(
                "this node holds no primary share of allocation {} to fill a replica from",
                c.alloc_id
            )));
        }
        // Ranges promoted by this change: a range already this node's
        // primary was promoted by a change sent again, or carried by a later
        // one too.
        let mut promoted = Vec::with_capacity(promote.len());
        for &(offset, len) in &promote {
            let held_as = |primary: bool| {
                cur.span_for(offset, len)
                    .is_some_and(|span| cur.extents[span].iter().all(|e| (e.copy == 0) == primary))
            };
            if held_as(false) {
                promoted.push((offset, len));
            } else if !held_as(true) {
                return Err(CoreError::InvalidArgument(format!(
                    "bytes {offset}..{} of allocation {} are not a replica held here",
                    offset.saturating_add(len),
                    c.alloc_id
                )));
            }
        }
        let promote = promoted;
        if !promote.is_empty() {
            let inside = |e: &HeldExtent| {
                promote
                    .iter()
                    .any(|&(o, l)| e.alloc_offset >= o && e.alloc_offset + e.len <= o + l)
            };
            let extents = cur
                .extents
                .iter()
                .map(|e| {
                    if inside(e) {
                        Arc::new(e.as_copy(0))
                    } else {
                        Arc::clone(e)
                    }
                })
                .collect();
            cur = Arc::new(cur.with_extents(extents));
            *entry.value_mut() = Arc::clone(&cur);
            // Its replicas must not take this node for an earlier primary.
            order.new_sender();
        }
        drop(entry);
        drop(applied);
        let replicas = if latest {
            order.generation = c.generation;
            self.copies_generation
                .fetch_max(c.generation, std::sync::atomic::Ordering::SeqCst);
            c.replicas
        } else {
            tracing::debug!(
                alloc_id = c.alloc_id,
                generation = c.generation,
                applied = order.generation,
                "a copy change decided before the one in force: its replicas are not taken"
            );
            order.replicas.clone()
        };
        order.copy_to(replicas, &promote);
        // A new replica gets every byte of this node's primary ranges it
        // holds (`fill` sends them).
        for addr in &c.fill {
            let Some(owed) = order.replica(addr).map(|r| {
                r.parts_of(
                    cur.extents
                        .iter()
                        .filter(|e| e.copy == 0)
                        .map(|e| (e.alloc_offset, e.len)),
                )
            }) else {
                continue;
            };
            for (offset, len) in owed {
                order.miss(addr, offset, len);
            }
        }
        let replicas: Vec<&str> = order
            .replicas
            .iter()
            .map(|r| r.data_addr.as_str())
            .collect();
        tracing::info!(
            alloc_id = c.alloc_id,
            promoted = promote.len(),
            ?replicas,
            "copies changed"
        );
        Ok(())
    }

    /// Whether allocation `alloc_id` may take a replica to fill (`order`
    /// is its order lock, held). One asked for with a single copy is
    /// moving (its node is being drained): every write to it must come
    /// through this agent from now on, so it is refused while a process
    /// here maps it, and its RDMA keys are revoked (a one-sided write
    /// would bypass the copying). The map server looks for replicas after
    /// it registers a lease, and this looks for leases under the lock
    /// that sets them, so one of the two sees the other.
    fn may_gain_replica(&self, alloc_id: u64, order: &Order) -> Result<(), CoreError> {
        let held = self
            .held
            .get(&alloc_id)
            .map(|e| Arc::clone(e.value()))
            .ok_or(CoreError::NoSuchAllocation(alloc_id))?;
        if held.record.placement.copies() > 1 || !order.replicas.is_empty() {
            return Ok(());
        }
        if held.extents.iter().any(|e| e.pool().is_none()) {
            return Err(CoreError::CannotMove(format!(
                "allocation {alloc_id} is GPU memory; only host memory moves to another node"
            )));
        }
        if self.leases.holds(alloc_id) {
            return Err(CoreError::CannotMove(format!(
                "allocation {alloc_id} is mapped by a process on this node; it moves once that process unmaps it"
            )));
        }
        held.keys.revoke();
        // Its reports no longer name the regions (a master that starts
        // now gives clients none).
        if let Some(mut entry) = self.held.get_mut(&alloc_id) {
            let cur = entry.value();
            let extents = cur
                .extents
                .iter()
                .map(|e| Arc::new(e.without_rdma()))
                .collect();
            *entry.value_mut() = Arc::new(cur.with_extents(extents));
        }
        Ok(())
    }
}
