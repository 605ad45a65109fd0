//! The master role: cluster membership, placement and the allocation table.
//!
//! The master decides where memory goes and records every allocation; the
//! agents hold the memory and keep the master's record of each allocation
//! they hold, so the master is soft state: after a restart it rebuilds the
//! table from the agents' registrations (`recovery`). It reaches agents
//! only through [`AgentLink`], so this module never imports a transport or
//! a wire type and is tested with a fake link. It never holds its lock
//! across an await.
//!
//! - `state`: the table and its bookkeeping (pure functions on [`State`]);
//! - `allocate`: plan, reserve on every agent, commit or roll back;
//! - `sessions`: free, attach, detach, a session's end;
//! - `view`: what operators and clients are shown (health, usage);
//! - `quotas`: showing and setting users' quotas (enforced by `allocate`);
//! - `recovery`: registration, heartbeats, rebuilding after a restart;
//! - `liveness`: when a silent node is suspect or down;
//! - `copies`, `drain`: replicated allocations' lost copies, and moving
//!   allocations off a node being drained;
//! - `placement`: which nodes hold which bytes (pure);
//! - `seat`: whether this daemon leads (which core) or stands by;
//! - `tenure`: how long an elected master may act.

mod allocate;
mod copies;
mod drain;
mod give_back;
mod leave;
pub mod liveness;
mod node;
pub mod placement;
mod quotas;
mod ranges;
mod recovery;
pub mod refusals;
pub mod seat;
mod sessions;
mod state;
pub mod tenure;
#[cfg(test)]
mod tests;
mod view;

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use oncilla_model::cluster::{Release, Reservation, Reserved, SetCopies};
use oncilla_model::node::PoolUsage;

use crate::error::{CoreError, LinkError};
pub use node::{Liveness, HEARTBEAT_DEADLINE};
pub use quotas::QuotaStore;
use state::State;

/// How the master reaches agents.
pub trait AgentLink: Send + Sync + 'static {
    /// Reserves ranges of allocations on the agent at `addr` (1 to
    /// [`oncilla_model::alloc::MAX_BATCH`] of them, all or none); returns,
    /// for each in order, where its pieces went and the agent's pool usage.
    fn reserve(
        &self,
        addr: &str,
        reqs: Vec<Reservation>,
    ) -> impl Future<Output = Result<Vec<Reserved>, LinkError>> + Send;
    /// Releases what the agent holds of an allocation (all of it, or some
    /// of its bytes); returns the agent's pool usage when it said.
    fn release(
        &self,
        addr: &str,
        release: Release,
    ) -> impl Future<Output = Result<Option<PoolUsage>, LinkError>> + Send;
    /// Releases everything the agent holds of each of `ids` (1 to
    /// [`oncilla_model::alloc::MAX_BATCH`] allocations freed); returns
    /// the agent's pool usage when it said.
    fn release_many(
        &self,
        addr: &str,
        ids: Vec<u64>,
    ) -> impl Future<Output = Result<Option<PoolUsage>, LinkError>> + Send;
    /// Changes a replicated allocation's copies on the agent at `addr`
    /// (promoted ranges, its primary share's replicas).
    fn set_copies(
        &self,
        addr: &str,
        req: SetCopies,
    ) -> impl Future<Output = Result<(), LinkError>> + Send;
    /// Who answers at `addr` now: its node name and incarnation, within a
    /// short deadline (it decides whether a registration may take over a
    /// name that is in use).
    fn identify(&self, addr: &str)
        -> impl Future<Output = Result<(String, u64), LinkError>> + Send;
}

/// The master core.
pub struct Master<L> {
    link: L,
    liveness: Liveness,
    /// Random per start, never 0; agents report which master they knew.
    incarnation: u64,
    /// Its term when masters are elected (see [`Master::with_term`]), else 0.
    term: u64,
    started: Instant,
    /// How long after `started` the table stays frozen.
    recovery: Duration,
    state: Mutex<State>,
    /// Where quotas are kept; held while one is changed.
    quota_store: Option<Mutex<Box<dyn QuotaStore>>>,
    /// What allocation requests came to, for the metrics.
    refusals: refusals::Refusals,
}

impl<L: AgentLink> Master<L> {
    /// A master expecting heartbeats as `liveness` says. It serves changes
    /// to the table only after [`Liveness::recovery`], once agents that
    /// knew a previous master have re-registered.
    pub fn new(link: L, liveness: Liveness) -> Self {
        Self {
            link,
            liveness,
            incarnation: rand::random::<u64>().max(1),
            term: 0,
            started: Instant::now(),
            recovery: liveness.recovery(),
            state: Mutex::new(State::new()),
            quota_store: None,
            refusals: refusals::Refusals::default(),
        }
    }

    /// What its allocation requests came to so far.
    pub fn refusals(&self) -> &refusals::Refusals {
        &self.refusals
    }

    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The master elected as leader in `term` (larger for every later
    /// leader): agents that registered with it refuse older terms. It
    /// waits [`Liveness::takeover_recovery`] for agents before it changes
    /// the table.
    #[must_use]
    pub fn with_term(mut self, term: u64) -> Self {
        self.term = term;
        self.recovery = self.liveness.takeover_recovery();
        self
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    /// Time left before the master changes its table (0 once serving).
    pub fn recovering(&self) -> Duration {
        self.recovery.saturating_sub(self.started.elapsed())
    }

    fn check_serving(&self) -> Result<(), CoreError> {
        match self.recovering() {
            d if d.is_zero() => Ok(()),
            d => Err(CoreError::Recovering(d)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent before it can
        // panic, so a poisoned lock still guards valid data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
