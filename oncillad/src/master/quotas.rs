//! Quotas at the master: showing them with what each user holds, and
//! setting them, kept through the [`QuotaStore`] port (a file, for the
//! daemon) so they outlive a restart. Enforcement is part of allocating
//! (`allocate`); usage is counted in the table (`state`), so a restarted
//! master knows it again once the agents have reported their allocations.
//! It never touches a file itself.

use oncilla_model::quota::{Limits, Quotas, Report, Subject};

use super::{AgentLink, Master};
use crate::error::CoreError;

/// Where the master keeps its quotas.
pub trait QuotaStore: Send + Sync {
    /// Keeps `quotas` (all of them, replacing what was kept).
    ///
    /// # Errors
    /// Why they could not be kept, for the operator who set them.
    fn save(&self, quotas: &Quotas) -> Result<(), String>;
}

impl<L: AgentLink> Master<L> {
    /// Starts with `quotas`, keeping changes in `store` (without one,
    /// quotas cannot be changed while the master runs).
    pub fn with_quotas(self, quotas: Quotas, store: Option<Box<dyn QuotaStore>>) -> Self {
        self.lock().quotas = quotas;
        Self {
            quota_store: store.map(std::sync::Mutex::new),
            ..self
        }
    }

    /// Every quota and what each user holds.
    pub fn quota_report(&self) -> Report {
        let st = self.lock();
        Report::new(&st.quotas, &st.usage, self.quota_store.is_some())
    }

    /// Sets `who`'s limits (`None`: a user's own are dropped), kept before
    /// they apply: a quota that could not be kept is not set. Allocations
    /// already made stay, even past a lowered quota; only new ones are
    /// refused.
    ///
    /// # Errors
    /// [`CoreError::QuotaStore`] without a store, or when it fails.
    pub fn set_quota(&self, who: Subject, limits: Option<Limits>) -> Result<Report, CoreError> {
        let store = self.quota_store.as_ref().ok_or_else(|| {
            CoreError::QuotaStore(
                "this master keeps no quota file, so quotas cannot be set; start it with --quota-file PATH".into(),
            )
        })?;
        // One change at a time, each kept before the next: the file never
        // goes back to an older table.
        let store = store.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = self.lock().quotas.clone();
        next.set(who, limits);
        store
            .save(&next)
            .map_err(|e| CoreError::QuotaStore(format!("quotas not changed: {e}")))?;
        tracing::info!(%who, ?limits, "quota set");
        let mut st = self.lock();
        st.quotas = next;
        Ok(Report::new(&st.quotas, &st.usage, true))
    }
}
