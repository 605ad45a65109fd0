//! Copies between two allocations where either side may be device memory
//! of this process: the plan is made once, before any byte moves
//! ([`DevicePlan::of`]), and run here without handing back to the caller:
//! on the device, one DMA per piece of same-node memory mapped here (the
//! mapping registered with the driver once), by GPUDirect RDMA, through
//! this GPU's page-locked staging ring, or, with no device memory of this
//! process on either side, as [`crate::between`] plans it.
//!
//! The staging rings and registrations are the session's
//! ([`crate::staging`]). It never chooses a fabric: a mapped copy is
//! planned only where every piece of the range is mapped, a direct copy
//! only where every piece is routed over verbs ([`crate::route`]).

use std::sync::Arc;

use oncilla_cuda::hostreg::{DriverPinner, HostPinner, Lookup};
use oncilla_cuda::{pipeline, DeviceMem};

use crate::allocation::Allocation;
use crate::error::{Error, Result};
use crate::fabric::verbs::plan::DevicePiece;
use crate::fabric::verbs::remote_at;
use crate::fabric::verbs::DeviceOutcome;
use crate::fabric::{check_lease, find_or_push, DataPath, Peer, Reach, Resolved};
use crate::staging::{Staging, PIN_MIN};

/// How a copy between two allocations runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DevicePlan {
    /// Device memory of this process on both sides: on the device (peer to
    /// peer between two GPUs).
    OnDevice,
    /// Between device memory of this process and host memory mapped here
    /// throughout (same-node pool memory): one driver copy per mapped
    /// piece, a DMA from the mapping registered once (or, where the driver
    /// refuses the registration, through the driver's own staging).
    Mapped { into_device: bool },
    /// Between device memory of this process and an allocation that verbs
    /// reaches throughout: RDMA straight to or from the device. Should the
    /// HCA refuse to register the device memory before anything moved, the
    /// copy is staged instead.
    Direct { into_device: bool },
    /// Through the device's staging ring, the fabric filling one buffer
    /// while the previous one goes to the device on a CUDA stream (or the
    /// other way).
    Staged { into_device: bool },
    /// No device memory of this process: [`crate::between`].
    Host,
}

/// One side of a copy, as far as planning goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Side {
    /// Device memory of this process.
    pub device: bool,
    /// Every piece of the copied range is mapped in this process.
    pub mapped: bool,
    /// Every piece of the copied range goes over verbs (and none is mapped).
    pub all_verbs: bool,
}

impl DevicePlan {
    /// The plan for a copy from `src` to `dst`.
    pub(crate) fn of(src: Side, dst: Side) -> Self {
        match (src.device, dst.device) {
            (true, true) => DevicePlan::OnDevice,
            (false, true) if src.mapped => DevicePlan::Mapped { into_device: true },
            (true, false) if dst.mapped => DevicePlan::Mapped { into_device: false },
            (false, true) if src.all_verbs => DevicePlan::Direct { into_device: true },
            (false, true) => DevicePlan::Staged { into_device: true },
            (true, false) if dst.all_verbs => DevicePlan::Direct { into_device: false },
            (true, false) => DevicePlan::Staged { into_device: false },
            (false, false) => DevicePlan::Host,
        }
    }
}

/// Copies `len` bytes between two allocations of any kinds, as
/// [`crate::Oncilla::copy`] describes; `data` and `staging` are the session's.
pub(crate) fn copy(
    data: &DataPath,
    staging: &Staging,
    dst: &Allocation,
    dst_offset: u64,
    src: &Allocation,
    src_offset: u64,
    len: u64,
) -> Result<()> {
    dst.desc.check_range(dst_offset, len)?;
    src.desc.check_range(src_offset, len)?;
    let side = |a: &Allocation, offset: u64, other: &Allocation| Side {
        device: a.device.is_some(),
        // Asked only when the other side is on a device here.
        mapped: other.device.is_some() && all_mapped(a, offset, len),
        all_verbs: other.device.is_some() && all_verbs(data, a, offset, len),
    };
    let plan = DevicePlan::of(side(src, src_offset, dst), side(dst, dst_offset, src));
    match (plan, &src.device, &dst.device) {
        (DevicePlan::OnDevice, Some(s), Some(d)) => {
            Ok(d.copy_from(dst_offset, s, src_offset, len)?)
        }
        (DevicePlan::Mapped { .. }, None, Some(d)) => {
            mapped(staging, src, src_offset, d, dst_offset, len, true)
        }
        (DevicePlan::Mapped { .. }, Some(s), None) => {
            mapped(staging, dst, dst_offset, s, src_offset, len, false)
        }
        (DevicePlan::Direct { .. }, None, Some(d)) => {
            match direct(data, src, src_offset, d, dst_offset, len, true)? {
                DeviceOutcome::Moved => Ok(()),
                DeviceOutcome::Refused(_) => stage_in(staging, src, src_offset, d, dst_offset, len),
            }
        }
        (DevicePlan::Staged { .. }, None, Some(d)) => {
            stage_in(staging, src, src_offset, d, dst_offset, len)
        }
        (DevicePlan::Direct { .. }, Some(s), None) => {
            match direct(data, dst, dst_offset, s, src_offset, len, false)? {
                DeviceOutcome::Moved => Ok(()),
                DeviceOutcome::Refused(_) => {
                    stage_out(staging, s, src_offset, dst, dst_offset, len)
                }
            }
        }
        (DevicePlan::Staged { .. }, Some(s), None) => {
            stage_out(staging, s, src_offset, dst, dst_offset, len)
        }
        _ => crate::between::copy(data, dst, dst_offset, src, src_offset, len),
    }
}

fn stage_in(
    staging: &Staging,
    src: &Allocation,
    src_offset: u64,
    d: &DeviceMem,
    dst_offset: u64,
    len: u64,
) -> Result<()> {
    staging.with(d, |ring| {
        pipeline::stream_in(&mut ring.upload(d, dst_offset), len, |c, buf| {
            src.copy_out(src_offset + c.offset, buf)
        })
    })?;
    Ok(())
}

fn stage_out(
    staging: &Staging,
    s: &DeviceMem,
    src_offset: u64,
    dst: &Allocation,
    dst_offset: u64,
    len: u64,
) -> Result<()> {
    staging.with(s, |ring| {
        pipeline::stream_out(&mut ring.download(s, src_offset), len, |c, bytes| {
            dst.copy_in(dst_offset + c.offset, bytes)
        })
    })?;
    Ok(())
}

/// Whether every piece of `[offset, offset + len)` of `a` is mapped here.
fn all_mapped(a: &Allocation, offset: u64, len: u64) -> bool {
    a.local.as_ref().is_some_and(|m| {
        len > 0
            && a.desc
                .pieces(offset, len)
                .all(|(_, _, at, _, n)| m.ptr_for(at, n).is_some())
    })
}

/// Copies between the mapped range `[offset, offset + len)` of `a` and
/// device memory `mem` at `mem_offset` (`into_device`: from `a` to `mem`),
/// one driver copy per mapped piece. A copy of at least [`PIN_MIN`] bytes
/// first registers the whole mapping with the driver (once: the session's
/// cache keeps it until the mapping goes), so every copy through the
/// mapping from then on is one DMA.
fn mapped(
    staging: &Staging,
    a: &Allocation,
    offset: u64,
    mem: &DeviceMem,
    mem_offset: u64,
    len: u64,
    into_device: bool,
) -> Result<()> {
    mem.check(mem_offset, len)?;
    check_lease(&a.desc, a.local.as_deref())?;
    let Some(mapping) = a.local.as_deref() else {
        return Err(Error::Internal(format!(
            "allocation {}: planned as mapped, but nothing of it is mapped",
            a.desc.id
        )));
    };
    // Held until every piece has moved: an eviction meanwhile leaves the
    // range registered until this drops.
    let _pin = (len >= PIN_MIN).then(|| {
        let (base, map_len) = mapping.range();
        let gpu = mem.gpu().clone();
        let make = move || Arc::new(DriverPinner::new(gpu)) as Arc<dyn HostPinner>;
        // SAFETY: the range is the mapping's whole, which `a` keeps mapped
        // through this copy, and which releases its registration from the
        // cache before it unmaps (`Mapping`'s drop): by then no copy holds
        // a Pin of it, since each holds the mapping too.
        match unsafe { staging.pins.get(make, base as usize, map_len) } {
            Lookup::Pinned(pin) => Some(pin),
            Lookup::Unpinned => None,
        }
    });
    for (_, _, at, _, n) in a.desc.pieces(offset, len) {
        let ptr = mapping.ptr_for(at, n).ok_or_else(|| {
            Error::Internal(format!(
                "allocation {}: a mapped piece is not in the mapping",
                a.desc.id
            ))
        })?;
        let bytes = usize::try_from(n)
            .map_err(|_| Error::Internal("copy larger than the address space".into()))?;
        let dev_at = mem_offset + (at - offset);
        // SAFETY: `ptr_for` checked that `n` bytes at `ptr` lie inside the
        // mapping, which `a` keeps mapped until this returns; pool memory
        // is reached only through raw pointers (other processes may write
        // it meanwhile, unordered with this copy as any two writers are:
        // ARCHITECTURE, "Coherence"), and the driver call returns once its
        // bytes have moved.
        unsafe {
            if into_device {
                mem.write_from(dev_at, ptr, bytes)?;
            } else {
                mem.read_into(dev_at, ptr, bytes)?;
            }
        }
    }
    Ok(())
}

/// Whether every piece of `[offset, offset + len)` of `a` goes over verbs
/// now (none mapped, none empty).
fn all_verbs(data: &DataPath, a: &Allocation, offset: u64, len: u64) -> bool {
    a.local.is_none()
        && len > 0
        && data.resolve(a.target(), offset, len).all(|p| {
            matches!(
                p,
                Ok(Resolved {
                    reach: Reach::Verbs,
                    ..
                })
            )
        })
}

/// Runs a planned GPUDirect copy between `a` and device memory `mem`,
/// node after node. A registration refused on the first node (nothing
/// moved yet) comes back as [`DeviceOutcome::Refused`]; later, it is an
/// error.
fn direct(
    data: &DataPath,
    a: &Allocation,
    offset: u64,
    mem: &DeviceMem,
    mem_offset: u64,
    len: u64,
    read: bool,
) -> Result<DeviceOutcome> {
    mem.check(mem_offset, len)?;
    // By node: (node, agent, pieces as (remote, device offset, len)).
    let mut nodes: Vec<(&str, &str, Vec<DevicePiece<'_>>)> = Vec::new();
    for (_, extent, at, _, n) in a.desc.pieces(offset, len) {
        let piece = (remote_at(extent, at), mem_offset + (at - offset), n);
        find_or_push(
            &mut nodes,
            |w| w.0 == extent.node,
            || (&extent.node, &extent.agent_addr, Vec::new()),
        )
        .2
        .push(piece);
    }
    for (i, (node, agent, pieces)) in nodes.iter().enumerate() {
        let to = Peer {
            node,
            addr: agent,
            alloc: a.desc.id,
        };
        match data.verbs().run_device(to, mem, pieces, read)? {
            DeviceOutcome::Moved => {}
            // Nothing moved yet (registration comes first, and this is the
            // first node): stage instead.
            DeviceOutcome::Refused(why) if i == 0 => {
                tracing::debug!("GPUDirect RDMA refused: {why}; staging through host memory");
                return Ok(DeviceOutcome::Refused(why));
            }
            DeviceOutcome::Refused(why) => {
                return Err(Error::Fabric {
                    node: node.to_string(),
                    addr: agent.to_string(),
                    reason: format!("registering device memory for RDMA: {why}"),
                })
            }
        }
    }
    Ok(DeviceOutcome::Moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: Side = Side {
        device: false,
        mapped: false,
        all_verbs: false,
    };
    const VERBS: Side = Side {
        device: false,
        mapped: false,
        all_verbs: true,
    };
    const MAPPED: Side = Side {
        device: false,
        mapped: true,
        all_verbs: false,
    };
    const GPU: Side = Side {
        device: true,
        mapped: false,
        all_verbs: false,
    };

    #[test]
    fn device_copies_are_planned_once() {
        assert_eq!(DevicePlan::of(GPU, GPU), DevicePlan::OnDevice);
        assert_eq!(
            DevicePlan::of(VERBS, GPU),
            DevicePlan::Direct { into_device: true }
        );
        assert_eq!(
            DevicePlan::of(HOST, GPU),
            DevicePlan::Staged { into_device: true }
        );
        assert_eq!(
            DevicePlan::of(GPU, VERBS),
            DevicePlan::Direct { into_device: false }
        );
        assert_eq!(
            DevicePlan::of(GPU, HOST),
            DevicePlan::Staged { into_device: false }
        );
        assert_eq!(DevicePlan::of(HOST, HOST), DevicePlan::Host);
        // Same-node memory mapped here goes to and from the device
        // directly, one DMA per piece, never through the staging ring.
        assert_eq!(
            DevicePlan::of(MAPPED, GPU),
            DevicePlan::Mapped { into_device: true }
        );
        assert_eq!(
            DevicePlan::of(GPU, MAPPED),
            DevicePlan::Mapped { into_device: false }
        );
        assert_eq!(DevicePlan::of(MAPPED, MAPPED), DevicePlan::Host);
        // Verbs between two host allocations is the data path's business.
        assert_eq!(DevicePlan::of(VERBS, VERBS), DevicePlan::Host);
    }
}
