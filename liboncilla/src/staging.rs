//! What a session's device copies DMA through: the page-locked staging
//! rings, one per GPU, made on first use and kept (device copies that
//! cannot go straight to or from device memory pass through them), and the
//! registrations of this process's mappings of same-node pool memory with
//! the driver ([`PinCache`]: made on a mapping's first large device copy,
//! released when the mapping goes), so those copies are one DMA. It owns
//! the rings and the cache, never a copy's plan.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use oncilla_cuda::hostreg::PinCache;
use oncilla_cuda::pinned::PinnedRing;
use oncilla_cuda::DeviceMem;

use crate::error::{Error, Result};
use crate::options::OptionError;

/// Buffers in a staging ring: the network fills one while the device
/// drains another and a third waits, so neither side idles on a hiccup.
const STAGING_SLOTS: usize = 3;

/// The staging rings of a session, by GPU index, and its registrations.
pub(crate) struct Staging {
    /// Bytes per buffer (`ONCILLA_GPU_STAGING`), or why the setting was refused.
    len: std::result::Result<usize, OptionError>,
    /// A copy holds its device's ring for its duration.
    rings: Mutex<HashMap<u32, PinnedRing>>,
    /// Registered mappings; each [`crate::fabric::shm::Mapping`] releases
    /// its own when it is unmapped.
    pub(crate) pins: Arc<PinCache>,
}

/// Mapped memory smaller than this is copied to and from devices without
/// registering it first: registering costs more than such a copy (46 µs
/// for 64 KiB against a 10 µs copy, `shared/measured-facts.md`).
pub(crate) const PIN_MIN: u64 = 64 << 10;

impl Staging {
    pub(crate) fn new(len: std::result::Result<usize, OptionError>) -> Self {
        Self {
            len,
            rings: Mutex::new(HashMap::new()),
            pins: Arc::new(PinCache::new(pin_limit())),
        }
    }

    /// Runs `f` with the staging ring of `mem`'s device, made on first use.
    pub(crate) fn with<T>(
        &self,
        mem: &DeviceMem,
        f: impl FnOnce(&mut PinnedRing) -> Result<T>,
    ) -> Result<T> {
        let index = mem.gpu().index();
        // A panic inside `f` leaves the ring drained or dropped: still usable.
        let mut rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        let ring = match rings.entry(index) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let len = self
                    .len
                    .clone()
                    .map_err(|e| Error::InvalidArgument(e.to_string()))?;
                v.insert(PinnedRing::new(mem.gpu(), STAGING_SLOTS, len)?)
            }
        };
        f(ring)
    }
}

/// Most bytes a session keeps registered: half the machine's memory, so
/// registrations (which lock pages for the driver) never take what the
/// rest of the machine needs; 16 GiB where the size cannot be read.
fn pin_limit() -> u64 {
    use nix::unistd::{sysconf, SysconfVar};
    let pages = sysconf(SysconfVar::_PHYS_PAGES).ok().flatten();
    let page = sysconf(SysconfVar::PAGE_SIZE).ok().flatten();
    match (pages, page) {
        (Some(n), Some(p)) if n > 0 && p > 0 => (n as u64).saturating_mul(p as u64) / 2,
        _ => 16 << 30,
    }
}
