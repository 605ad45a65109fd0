//! What the agent lets go of at the master's word: a whole allocation
//! (freed, or a copy the master dropped), or some of its bytes (a new copy
//! given up on a node that keeps other bytes of the same allocation).
//!
//! Memory let go of stops being reachable at once (RDMA keys revoked,
//! local mappings told) and returns to the refiller when the last copy in
//! flight that uses it ends. Never frees memory another extent still uses
//! and never waits for a copy.

use std::sync::Arc;

use dashmap::mapref::entry::Entry;

use super::Agent;
use crate::error::CoreError;
use crate::memory::held::{Held, HeldExtent};

impl Agent {
    /// Forgets `alloc_id` and tells local processes mapping it. The memory
    /// goes to the refiller when the returned entry, every in-flight copy
    /// and every local mapping of it are gone.
    pub fn release(&self, alloc_id: u64) -> Option<Arc<Held>> {
        let held = self.held.remove(&alloc_id).map(|(_, h)| h);
        if let Some(h) = &held {
            h.release();
        }
        self.leases.revoke(alloc_id);
        held
    }

    /// Lets go of the extents of `alloc_id` inside `ranges` (in order,
    /// never overlapping, as the wire checks) and keeps the others; of all
    /// of it when nothing else is held here. Returns the entry as it was when something went
    /// (its memory returns once that and every copy in flight are gone).
    ///
    /// # Errors
    /// [`CoreError::InvalidArgument`] when a range cuts through an extent
    /// (the master gives back whole reservations only); nothing is let go.
    pub fn release_part(
        &self,
        alloc_id: u64,
        ranges: &[(u64, u64)],
    ) -> Result<Option<Arc<Held>>, CoreError> {
        let Entry::Occupied(mut entry) = self.held.entry(alloc_id) else {
            return Ok(None);
        };
        // The range that may hold extent `e`: the last one starting before
        // its end (a binary search: `ranges` are in order, never
        // overlapping, and a striped allocation has many extents).
        let around = |e: &HeldExtent| {
            let end = e.alloc_offset + e.len;
            let before = ranges.partition_point(|&(o, _)| o < end);
            before.checked_sub(1).map(|i| ranges[i])
        };
        let inside = |e: &HeldExtent| {
            around(e).is_some_and(|(o, l)| {
                o <= e.alloc_offset && e.alloc_offset + e.len <= o.saturating_add(l)
            })
        };
        let touches = |e: &HeldExtent| {
            // Ranges after the one found start at or past the extent's end.
            around(e).is_some_and(|(o, l)| e.alloc_offset < o.saturating_add(l))
        };
        let cur = Arc::clone(entry.get());
        if let Some(e) = cur.extents.iter().find(|e| touches(e) && !inside(e)) {
            return Err(CoreError::InvalidArgument(format!(
                "a range to release cuts through bytes {}..{} of allocation {alloc_id} held here",
                e.alloc_offset,
                e.alloc_offset + e.len
            )));
        }
        let (gone, kept): (Vec<_>, Vec<_>) = cur.extents.iter().cloned().partition(|e| inside(e));
        if gone.is_empty() {
            return Ok(None);
        }
        if kept.is_empty() {
            let held = entry.remove();
            held.release();
            self.leases.revoke(alloc_id);
            return Ok(Some(held));
        }
        let rest = Arc::new(cur.with_extents(kept));
        // Pool memory the kept extents do not share (each reservation
        // has memory of its own): its keys stop now, and it counts as on
        // its way back.
        let mut spans = Vec::new();
        for e in &gone {
            let Some(m) = e.pool() else { continue };
            let shared = rest
                .extents
                .iter()
                .any(|k| k.pool().is_some_and(|km| Arc::ptr_eq(km, m)));
            if !shared && !spans.iter().any(|&(at, _)| at == m.ptr(0) as u64) {
                spans.push((m.ptr(0) as u64, m.len()));
                m.release();
            }
        }
        rest.keys.revoke_within(&spans);
        entry.insert(rest);
        drop(entry);
        // Primary bytes a process here may map: told, it maps again what
        // is left.
        if gone.iter().any(|e| e.copy == 0) {
            self.leases.revoke(alloc_id);
        }
        // After the table's entry: a landing copy takes this lock first.
        cur.copying
            .applied()
            .forget(gone.iter().map(|e| e.alloc_offset));
        tracing::debug!(
            alloc_id,
            extents = gone.len(),
            "released part of an allocation"
        );
        Ok(Some(cur))
    }

    /// Releases each of `ids` (the master no longer knows them).
    pub fn release_all(&self, ids: &[u64]) {
        for &id in ids {
            if self.release(id).is_some() {
                tracing::info!(
                    alloc_id = id,
                    "released a stray allocation at the master's word"
                );
            }
        }
    }
}
