//! Which master core, if any, this daemon runs now: the one it always
//! runs (no election), the one elected for the current term, or none (a
//! standby, which knows where the leader is when etcd says). It owns that
//! answer; it never campaigns (the election loop does) and never serves a
//! request itself.

use std::sync::Arc;

use super::tenure::Tenure;
use super::Master;
use crate::error::CoreError;

/// This daemon's place among the masters.
pub enum Seat<L> {
    /// It leads: `tenure` is `None` without an election (it always leads).
    Leading {
        core: Arc<Master<L>>,
        tenure: Option<Arc<Tenure>>,
    },
    /// It waits; the leader's address when one is known.
    Standby { leader: Option<String> },
}

impl<L> Seat<L> {
    /// The core to serve a request with, while this daemon leads and its
    /// tenure holds.
    ///
    /// # Errors
    /// [`CoreError::Standby`] otherwise (with the leader, when known).
    pub fn core(&self) -> Result<Arc<Master<L>>, CoreError> {
        match self {
            Seat::Leading { core, tenure } if tenure.as_ref().is_none_or(|t| t.holds()) => {
                Ok(Arc::clone(core))
            }
            Seat::Leading { .. } => Err(CoreError::Standby { leader: None }),
            Seat::Standby { leader } => Err(CoreError::Standby {
                leader: leader.clone(),
            }),
        }
    }

    /// The core, whatever its tenure (for metrics and the liveness tick).
    pub fn leading(&self) -> Option<&Arc<Master<L>>> {
        match self {
            Seat::Leading { core, .. } => Some(core),
            Seat::Standby { .. } => None,
        }
    }
}
