//! Which master core, if any, this daemon runs now: the one it always
//! runs (no election), the one elected for the current term, or none (a
//! standby, which knows where the leader is when etcd says). It owns that
//! answer; it never campaigns (the election loop does) and never serves a
//! request itself.

use std::sync::Arc;

use super::tenure::Tenure;
use super::Master;
use crate::error::CoreError;

/// The core that serves a call, and the tenure it serves under (`None`:
/// not elected).
pub type Acting<L> = (Arc<Master<L>>, Option<Arc<Tenure>>);

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
    /// tenure holds, with that tenure (`None`: not elected): a call that
    /// changes anything checks it again before it confirms
    /// ([`Seat::still`]).
    ///
    /// # Errors
    /// [`CoreError::Standby`] otherwise (with the leader, when known).
    pub fn core(&self) -> Result<Acting<L>, CoreError> {
        match self {
            Seat::Leading { core, tenure } if tenure.as_ref().is_none_or(|t| t.holds()) => {
                Ok((Arc::clone(core), tenure.clone()))
            }
            Seat::Leading { .. } => Err(CoreError::Standby { leader: None }),
            Seat::Standby { leader } => Err(CoreError::Standby {
                leader: leader.clone(),
            }),
        }
    }

    /// Whether what a call did under `tenure` may be confirmed: the
    /// tenure still holds, so everything the call asked of agents happened
    /// before any successor could be elected.
    ///
    /// # Errors
    /// [`CoreError::Lapsed`] when the tenure ended during the call.
    pub fn still(tenure: Option<&Arc<Tenure>>) -> Result<(), CoreError> {
        match tenure {
            Some(t) if !t.holds() => Err(CoreError::Lapsed { term: t.term() }),
            _ => Ok(()),
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
