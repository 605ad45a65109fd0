//! The fake agent link the master's tests run against: it reserves in
//! pieces as a fragmented pool would, counts reservations and records releases,
//! records every copy change, and fails, hangs or refuses where a test
//! says.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use oncilla_model::cluster::{Piece, Range, Release, Reservation, Reserved, SetCopies};
use oncilla_model::node::PoolUsage;

use crate::error::LinkError;
use crate::master::AgentLink;

#[derive(Default, Clone)]
pub(super) struct FakeLink {
    /// Reservations made, and the calls that carried them.
    pub(super) reserved: Arc<AtomicU64>,
    pub(super) calls: Arc<AtomicU64>,
    pub(super) released: Arc<AtomicU64>,
    /// Calls that released allocations freed (each one or a batch).
    pub(super) release_calls: Arc<AtomicU64>,
    pub(super) fail_on: Option<&'static str>,
    /// An agent whose reservations never answer.
    pub(super) hang_on: Option<&'static str>,
    /// Who answers at an agent address (`identify`); nobody by default.
    pub(super) alive: Arc<std::sync::Mutex<std::collections::HashMap<String, (String, u64)>>>,
    /// Every release that got through, in order, with its agent.
    pub(super) releases: Arc<std::sync::Mutex<Vec<(String, Release)>>>,
    /// Every `set_copies` asked, in order.
    pub(super) copies_set: Arc<std::sync::Mutex<Vec<(String, SetCopies)>>>,
    /// An agent whose releases never get through.
    pub(super) release_fails_on: Option<&'static str>,
    /// An agent that refuses to let an allocation move.
    pub(super) cannot_move_on: Option<&'static str>,
    /// Every reservation of a new copy to fill, with its agent.
    pub(super) fills: Arc<std::sync::Mutex<Vec<(String, Reservation)>>>,
}

impl FakeLink {
    /// Two pieces when a range is over a page, as a fragmented pool would.
    fn reserve_one(&self, req: &Reservation) -> Reserved {
        self.reserved.fetch_add(1, Ordering::SeqCst);
        let mut pieces = Vec::new();
        for r in &req.ranges {
            let first = r.len.min(4096);
            pieces.push(Piece {
                alloc_offset: r.alloc_offset,
                len: first,
                pool_offset: 0,
                rdma: Vec::new(),
            });
            if r.len > first {
                pieces.push(Piece {
                    alloc_offset: r.alloc_offset + first,
                    len: r.len - first,
                    pool_offset: 8192,
                    rdma: Vec::new(),
                });
            }
        }
        Reserved { pieces, pool: None }
    }
}

impl AgentLink for FakeLink {
    async fn reserve(
        &self,
        addr: &str,
        reqs: Vec<Reservation>,
    ) -> Result<Vec<Reserved>, LinkError> {
        // Let other requests run meanwhile, as a real round trip does.
        tokio::task::yield_now().await;
        if Some(addr) == self.fail_on {
            return Err(LinkError::Refused("pool exhausted".into()));
        }
        if Some(addr) == self.hang_on {
            std::future::pending::<()>().await;
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut fills = self.fills.lock().unwrap_or_else(|e| e.into_inner());
        fills.extend(
            reqs.iter()
                .filter(|r| r.fill)
                .map(|r| (addr.to_string(), r.clone())),
        );
        Ok(reqs.iter().map(|r| self.reserve_one(r)).collect())
    }
    async fn release(&self, addr: &str, r: Release) -> Result<Option<PoolUsage>, LinkError> {
        if !Range::in_order(&r.ranges) {
            return Err(LinkError::Refused(format!("invalid release: {r:?}")));
        }
        if Some(addr) == self.release_fails_on {
            return Err(LinkError::Unreachable(format!("{addr} did not answer")));
        }
        self.released.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut all) = self.releases.lock() {
            all.push((addr.to_string(), r));
        }
        Ok(None)
    }
    async fn release_many(
        &self,
        addr: &str,
        ids: Vec<u64>,
    ) -> Result<Option<PoolUsage>, LinkError> {
        if Some(addr) == self.release_fails_on {
            return Err(LinkError::Unreachable(format!("{addr} did not answer")));
        }
        self.release_calls.fetch_add(1, Ordering::SeqCst);
        self.released.fetch_add(ids.len() as u64, Ordering::SeqCst);
        if let Ok(mut all) = self.releases.lock() {
            all.extend(
                ids.into_iter()
                    .map(|id| (addr.to_string(), Release::all(id))),
            );
        }
        Ok(None)
    }
    async fn set_copies(&self, addr: &str, req: SetCopies) -> Result<(), LinkError> {
        if Some(addr) == self.cannot_move_on && !req.fill.is_empty() {
            return Err(LinkError::CannotMove(format!(
                "allocation {} is mapped by a process on this node",
                req.alloc_id
            )));
        }
        // Refused as the wire refuses it (a replica named twice, ranges
        // out of order).
        if !req.well_formed() {
            return Err(LinkError::Refused(format!("invalid copy change: {req:?}")));
        }
        let mut set = self.copies_set.lock().unwrap_or_else(|e| e.into_inner());
        set.push((addr.to_string(), req));
        Ok(())
    }
    async fn identify(&self, addr: &str) -> Result<(String, u64), LinkError> {
        let alive = self.alive.lock().unwrap_or_else(|e| e.into_inner());
        alive
            .get(addr)
            .cloned()
            .ok_or_else(|| LinkError::Unreachable(format!("nothing at {addr}")))
    }
}
