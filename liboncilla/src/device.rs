//! Copies between two allocations where either side may be device memory
//! of this process: the plan is made once, before any byte moves
//! ([`DevicePlan::of`]), and run here without handing back to the caller:
//! on the device, by GPUDirect RDMA, through this GPU's page-locked staging
//! ring, or, with no device memory of this process on either side, as
//! [`crate::between`] plans it.
//!
//! The staging rings are the session's ([`crate::staging`]). It never
//! chooses a fabric: a direct copy is planned only where every piece
//! of the range is routed over verbs ([`crate::route`]).

use oncilla_cuda::{pipeline, DeviceMem};

use crate::allocation::Allocation;
use crate::error::{Error, Result};
use crate::fabric::verbs::plan::DevicePiece;
use crate::fabric::verbs::DeviceOutcome;
use crate::fabric::{find_or_push, remote_at, DataPath, Peer};
use crate::route::Hop;
use crate::staging::Staging;

/// How a copy between two allocations runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DevicePlan {
    /// Device memory of this process on both sides: on the device (peer to
    /// peer between two GPUs).
    OnDevice,
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
    /// Every piece of the copied range goes over verbs (and none is mapped).
    pub all_verbs: bool,
}

impl DevicePlan {
    /// The plan for a copy from `src` to `dst`.
    pub(crate) fn of(src: Side, dst: Side) -> Self {
        match (src.device, dst.device) {
            (true, true) => DevicePlan::OnDevice,
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
        all_verbs: other.device.is_some() && all_verbs(data, a, offset, len),
    };
    let plan = DevicePlan::of(side(src, src_offset, dst), side(dst, dst_offset, src));
    match (plan, &src.device, &dst.device) {
        (DevicePlan::OnDevice, Some(s), Some(d)) => {
            Ok(d.copy_from(dst_offset, s, src_offset, len)?)
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

/// Whether every piece of `[offset, offset + len)` of `a` goes over verbs
/// now (none mapped, none empty).
fn all_verbs(data: &DataPath, a: &Allocation, offset: u64, len: u64) -> bool {
    a.local.is_none()
        && len > 0
        && a.desc
            .pieces(offset, len)
            .all(|(i, e, ..)| matches!(data.hop(e, a.routes[i]), Ok(Hop::Verbs)))
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
        all_verbs: false,
    };
    const VERBS: Side = Side {
        device: false,
        all_verbs: true,
    };
    const GPU: Side = Side {
        device: true,
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
        // Verbs between two host allocations is the data path's business.
        assert_eq!(DevicePlan::of(VERBS, VERBS), DevicePlan::Host);
    }
}
