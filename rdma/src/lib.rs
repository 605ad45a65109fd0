//! Oncilla's RDMA layer: what this node has (sysfs discovery), the
//! queue-pair life and completion meanings that the agent and the client
//! share, and, with the `verbs` cargo feature, the verbs layer itself
//! (devices, protection domains, memory registrations, queue pairs, each
//! owned by a type that releases it once, in the right order).
//!
//! Everything but [`verbs`] is plain logic that builds and is tested on
//! any machine. This crate never chooses a fabric, never moves bytes on its
//! own and knows nothing of the wire (protobuf conversions of its types
//! live in `oncilla-proto`). Every failure is an [`RdmaError`].

pub mod discover;
mod error;
pub mod qp;
/// The verbs layer: libibverbs with the `verbs` feature, else a stand-in
/// whose types cannot be made (`stand_in.rs`). The one switch of the
/// feature in the workspace's code: everything above compiles one path.
#[cfg(feature = "verbs")]
pub mod verbs;
#[cfg(not(feature = "verbs"))]
#[path = "stand_in.rs"]
pub mod verbs;
pub mod wc;

pub use error::RdmaError;

use std::path::Path;
use std::sync::Arc;

use discover::Port;

/// One RDMA READ or WRITE between a registered local range and a remote
/// one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wr {
    pub wr_id: u64,
    pub read: bool,
    pub local: u64,
    pub lkey: u32,
    pub len: u32,
    pub remote: u64,
    pub rkey: u32,
    /// Whether it produces a completion (selective signaling).
    pub signaled: bool,
}

/// A completed (or failed) work request: its id, `ibv_wc_status` and the
/// vendor's error code (0 when it succeeded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    pub wr_id: u64,
    pub status: u32,
    pub vendor_err: u32,
}

impl Completion {
    /// `Ok` for a successful completion, else what failed.
    ///
    /// # Errors
    /// [`RdmaError::Completion`] with the status's name and meaning.
    pub fn check(&self) -> Result<(), RdmaError> {
        match wc::failure(self.status) {
            None => Ok(()),
            Some(failure) => Err(RdmaError::Completion {
                wr_id: self.wr_id,
                failure,
                vendor_err: self.vendor_err,
            }),
        }
    }
}

/// What a process found when it looked for RDMA, and what it can use.
pub struct Probe {
    /// Every port sysfs lists, usable or not (for `ocmctl nodes`).
    pub found: Vec<Port>,
    /// Opened ports, in selection order.
    pub devices: Vec<Arc<verbs::Device>>,
    /// Why the verbs fabric is unavailable; `None` when it is available.
    pub note: Option<String>,
}

impl Probe {
    pub fn available(&self) -> bool {
        self.note.is_none()
    }

    /// Every port found, active MTUs filled in where a port was opened.
    pub fn ports(&self) -> Vec<Port> {
        self.found
            .iter()
            .map(|p| {
                self.devices
                    .iter()
                    .find(|d| d.port.label() == p.label())
                    .map_or_else(|| p.clone(), |d| d.port.clone())
            })
            .collect()
    }
}

/// Looks for RDMA ports under `root` (normally [`discover::SYSFS`]) and,
/// in a `verbs` build, opens the ones `wanted` selects (`NAME` or
/// `NAME:PORT`; none: every active port). Never fails: what cannot be
/// used is explained in [`Probe::note`].
pub fn probe(root: &Path, wanted: &[String]) -> Probe {
    let found = match discover::ports(root) {
        Ok(f) => f,
        Err(why) => return unusable(Vec::new(), why.to_string()),
    };
    match discover::select(&found, wanted) {
        Ok(selected) => open(found, &selected),
        Err(why) => unusable(found, why.to_string()),
    }
}

/// A probe that found `found` and can use none of it, because of `why`.
fn unusable(found: Vec<Port>, why: String) -> Probe {
    Probe {
        found,
        devices: Vec::new(),
        note: Some(why),
    }
}

fn open(found: Vec<Port>, selected: &[Port]) -> Probe {
    let mut devices = Vec::new();
    let mut errors = Vec::new();
    let mut built = true;
    for p in selected {
        match verbs::Device::open(p) {
            Ok(d) => devices.push(d),
            Err(RdmaError::NotBuilt) => built = false,
            Err(e) => errors.push(format!("{}: {e}", p.label())),
        }
    }
    let note = devices.is_empty().then(|| match built {
        // Said once, not per port.
        false => RdmaError::NotBuilt.to_string(),
        true => errors.join("; "),
    });
    Probe {
        found,
        devices,
        note,
    }
}
