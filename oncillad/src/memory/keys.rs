//! The RDMA registrations of memory this node holds: an allocation's host
//! memory keys ([`Keys`]), a `REMOTE_GPU` extent's device-memory
//! registrations ([`GpuRegistration`]), and the keys revoked recently
//! ([`Retired`]), so none is handed out again soon.
//!
//! These live beside the memory they open ([`super::held`] declares them
//! before it, so they drop first). This module only keeps and drops
//! registrations; it never makes one (`crate::hca` does) and never
//! talks to the network.

use oncilla_rdma::verbs::Mr;

use oncilla_model::alloc::RdmaRegion;

/// Revoked keys remembered per port, so none is handed out again soon.
pub const RETIRED_KEPT: usize = 1 << 16;

/// The remote keys of one allocation's host memory on this node: one
/// registration per pool extent per opened port. [`Keys::revoke`] (at
/// release) or dropping them invalidates every key at once; they must go
/// before the memory returns to the pool ([`super::held::Held`] declares
/// them first).
pub struct Keys {
    mrs: std::sync::Mutex<Vec<(usize, Mr)>>,
    /// Where revoked keys are remembered; set by the first registration
    /// (its own or one it absorbs).
    retired: std::sync::OnceLock<std::sync::Arc<Retired>>,
}

impl Keys {
    /// No keys: memory that verbs does not reach.
    pub fn none() -> Keys {
        Keys {
            mrs: std::sync::Mutex::new(Vec::new()),
            retired: std::sync::OnceLock::new(),
        }
    }

    /// No keys yet; those added later are remembered in `retired` when
    /// they are revoked.
    pub(crate) fn remembered_in(retired: std::sync::Arc<Retired>) -> Keys {
        Keys {
            mrs: std::sync::Mutex::new(Vec::new()),
            retired: std::sync::OnceLock::from(retired),
        }
    }

    /// Keeps registration `mr`, made on port `port`.
    pub(crate) fn push(&self, port: usize, mr: Mr) {
        lock(&self.mrs).push((port, mr));
    }

    /// Invalidates every key now; later calls do nothing.
    pub fn revoke(&self) {
        let mrs = std::mem::take(&mut *lock(&self.mrs));
        if let Some(r) = self.retired.get() {
            r.note(mrs.iter().map(|(port, mr)| (*port, mr.rkey())));
        }
        drop(mrs);
    }

    /// Invalidates now the keys of registrations that lie inside one of
    /// `spans` (`(address, length)`: memory this allocation lets go of
    /// while it keeps the rest here).
    pub fn revoke_within(&self, spans: &[(u64, u64)]) {
        let inside = |mr: &Mr| {
            spans
                .iter()
                .any(|&(at, len)| mr.addr >= at && mr.addr.saturating_add(mr.len) <= at + len)
        };
        let mut mrs = lock(&self.mrs);
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut *mrs)
            .into_iter()
            .partition(|(_, mr)| inside(mr));
        *mrs = kept;
        drop(mrs);
        if let Some(r) = self.retired.get() {
            r.note(gone.iter().map(|(port, mr)| (*port, mr.rkey())));
        }
        drop(gone);
    }

    /// Takes `other`'s keys into these (an allocation that grows on this
    /// node keeps the keys it had), and where revoked keys are remembered
    /// (so keys revoked later are still never handed out again soon).
    pub fn absorb(&self, other: &Keys) {
        let moved = std::mem::take(&mut *lock(&other.mrs));
        lock(&self.mrs).extend(moved);
        if let Some(r) = other.retired.get() {
            let _ = self.retired.set(std::sync::Arc::clone(r));
        }
    }

    /// Drops the registrations on port `port` (its device went away);
    /// their keys are not remembered: the device that made them is gone.
    pub fn drop_port(&self, port: usize) {
        lock(&self.mrs).retain(|(p, _)| *p != port);
    }

    /// Registrations held (for tests and logs).
    pub fn count(&self) -> usize {
        lock(&self.mrs).len()
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        self.revoke();
    }
}

/// Device memory registered with every opened port; dropping it
/// deregisters (before the memory is freed: see `held::GpuMemory`).
pub struct GpuRegistration {
    /// One region per port, for the extent's record.
    pub regions: Vec<RdmaRegion>,
    /// How the HCA took it: "nvidia-peermem" or "dma-buf".
    pub how: &'static str,
    /// Each registration with the index of its port.
    mrs: std::sync::Mutex<Vec<(usize, Mr)>>,
}

impl GpuRegistration {
    /// The registrations `mrs` (with their ports' indices), described by
    /// `regions`, made the way `how` says.
    pub(crate) fn new(
        regions: Vec<RdmaRegion>,
        how: &'static str,
        mrs: Vec<(usize, Mr)>,
    ) -> GpuRegistration {
        GpuRegistration {
            regions,
            how,
            mrs: std::sync::Mutex::new(mrs),
        }
    }

    /// Drops the registration on port `port` (its device went away).
    pub fn drop_port(&self, port: usize) {
        lock(&self.mrs).retain(|(p, _)| *p != port);
    }
}

/// The last [`RETIRED_KEPT`] keys revoked on each port.
#[derive(Default)]
pub(crate) struct Retired {
    keys: std::sync::Mutex<RetiredKeys>,
}

/// (port index, rkey) pairs: in revocation order, and as a set.
#[derive(Default)]
struct RetiredKeys {
    order: std::collections::VecDeque<(usize, u32)>,
    set: std::collections::HashSet<(usize, u32)>,
}

impl Retired {
    fn note(&self, keys: impl Iterator<Item = (usize, u32)>) {
        let mut g = lock(&self.keys);
        let RetiredKeys { order, set } = &mut *g;
        for k in keys {
            if set.insert(k) {
                order.push_back(k);
            }
            while order.len() > RETIRED_KEPT {
                if let Some(old) = order.pop_front() {
                    set.remove(&old);
                }
            }
        }
    }

    /// Whether key `k` (port index, rkey) was revoked recently.
    pub(crate) fn contains(&self, k: (usize, u32)) -> bool {
        lock(&self.keys).set.contains(&k)
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every holder leaves the state consistent before it can panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoked_keys_are_remembered_per_port_and_the_oldest_forgotten() {
        let r = Retired::default();
        r.note([(0, 7), (1, 7)].into_iter());
        assert!(r.contains((0, 7)) && r.contains((1, 7)));
        assert!(!r.contains((0, 8)), "another key");
        r.note((0..RETIRED_KEPT as u32).map(|k| (2, k)));
        assert!(!r.contains((0, 7)), "pushed out by newer keys");
        assert!(r.contains((2, 0)) && r.contains((2, RETIRED_KEPT as u32 - 1)));
        assert_eq!(lock(&r.keys).order.len(), RETIRED_KEPT);
    }

    #[test]
    fn no_keys_count_nothing_and_revoking_is_idempotent() {
        let keys = Keys::none();
        assert_eq!(keys.count(), 0);
        keys.revoke();
        keys.revoke();
    }
}
