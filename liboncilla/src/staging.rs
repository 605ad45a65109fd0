//! The page-locked staging rings of a session, one per GPU, made on first
//! use and kept: device copies that cannot go straight to or from device
//! memory pass through them. It owns the rings, never a copy's plan.

use std::collections::HashMap;
use std::sync::Mutex;

use oncilla_cuda::pinned::PinnedRing;
use oncilla_cuda::DeviceMem;

use crate::error::{Error, Result};
use crate::options::OptionError;

/// Buffers in a staging ring: the network fills one while the device
/// drains another and a third waits, so neither side idles on a hiccup.
const STAGING_SLOTS: usize = 3;

/// The staging rings of a session, by GPU index.
pub(crate) struct Staging {
    /// Bytes per buffer (`ONCILLA_GPU_STAGING`), or why the setting was refused.
    len: std::result::Result<usize, OptionError>,
    /// A copy holds its device's ring for its duration.
    rings: Mutex<HashMap<u32, PinnedRing>>,
}

impl Staging {
    pub(crate) fn new(len: std::result::Result<usize, OptionError>) -> Self {
        Self {
            len,
            rings: Mutex::new(HashMap::new()),
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
