//! Copies between two allocations with no device memory of this process
//! on either side: planned segment by segment (a segment lies in one
//! extent of each side) and run as one data-path call, every node at once,
//! with no byte bounced through this process that need not be:
//!
//! - both sides mapped here: a memory move between the mappings;
//! - the destination mapped: the fabric reads the source straight into
//!   the mapping;
//! - the source mapped: the fabric writes straight out of the mapping;
//! - neither: the destination's agent pulls the bytes from the source's
//!   agent (a third-party copy, [`IoBuf::Pull`]), into its pool or its
//!   device memory alike; only a destination this process may reach over
//!   verbs alone (no TCP to ask for a pull) goes through a buffer here.
//!
//! It never decides routes: a side is mapped exactly when its extent's
//! route says so ([`Reach::Mapped`]). Overlapping ranges of one allocation
//! are refused: segments run in parallel, so no order could be promised.
//!
//! The plan follows each handle's description as opened. Where a side's
//! primary is elsewhere now (a promoted replica, a move), or the planned
//! copy fails as a lost node or a move makes it fail, the copy goes
//! through a buffer here instead, each side through its handle's
//! [`crate::failover`], which waits out the loss or the move: the
//! application sees no failure a copy of its own would not show. (Copying
//! the same bytes again is harmless: the failed copy was never
//! acknowledged.)

use oncilla_net::wire::{Source, MAX_ADDR};

use crate::allocation::Allocation;
use crate::descriptor::Extent;
use crate::error::{Error, Result};
use crate::fabric::tcp::{IoBuf, Pull};
use crate::fabric::{check_lease, DataPath, Reach, Resolved, Transfer};
use crate::failover::may_succeed_later;
use crate::route::Route;

/// Bytes of a segment that must go through this process, moved per step.
const BOUNCE: u64 = 16 << 20;

/// One piece of the copy: `len` bytes at `dst_at` of the destination and
/// `src_at` of the source, each inside one extent.
struct Segment<'a> {
    dst: Side<'a>,
    src: Side<'a>,
    len: u64,
}

/// One side of a segment: its extent, allocation offset, where it is
/// mapped in this process, if it is, and whether its agent may be asked
/// over TCP (not where verbs was demanded without fallback).
struct Side<'a> {
    extent: &'a Extent,
    at: u64,
    mapped: Option<*mut u8>,
    tcp: bool,
}

/// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`.
///
/// Both ranges were checked against their allocations by the caller
/// ([`crate::device::copy`]).
///
/// # Errors
/// [`Error::InvalidArgument`] for overlapping ranges of one allocation;
/// fabric failures (the first met; every segment still runs to its end).
pub(crate) fn copy(
    data: &DataPath,
    dst: &Allocation,
    dst_offset: u64,
    src: &Allocation,
    src_offset: u64,
    len: u64,
) -> Result<()> {
    if dst.desc.id == src.desc.id && dst_offset < src_offset + len && src_offset < dst_offset + len
    {
        return Err(Error::InvalidArgument(format!(
            "bytes {src_offset}..{} and {dst_offset}..{} of allocation {} overlap; copy through a buffer",
            src_offset + len,
            dst_offset + len,
            dst.desc.id
        )));
    }
    check_lease(&dst.desc, dst.local.as_deref())?;
    check_lease(&src.desc, src.local.as_deref())?;
    if dst.failover.rerouted() || src.failover.rerouted() {
        return bounce(dst, dst_offset, src, src_offset, len);
    }
    match planned(data, dst, dst_offset, src, src_offset, len) {
        Err(e) if may_succeed_later(&e) => {
            tracing::debug!(dst = dst.desc.id, src = src.desc.id, error = %e, "a copy between allocations failed as a loss or a move makes it fail; copying through the handles");
            bounce(dst, dst_offset, src, src_offset, len)
        }
        done => done,
    }
}

/// The copy as planned from both handles' descriptions.
fn planned(
    data: &DataPath,
    dst: &Allocation,
    dst_offset: u64,
    src: &Allocation,
    src_offset: u64,
    len: u64,
) -> Result<()> {
    let segments = segments(data, dst, dst_offset, src, src_offset, len)?;
    let mut transfers = Vec::with_capacity(segments.len());
    let mut bounced = Vec::new();
    for s in &segments {
        let n = usize::try_from(s.len).map_err(|_| too_large())?;
        match (s.dst.mapped, s.src.mapped) {
            (Some(to), Some(from)) => {
                // SAFETY: both pointers come from `Mapping::ptr_for`, which
                // checked that `n` bytes from each lie in a mapping that the
                // borrowed handles keep mapped until this returns; a move
                // is right even where the two overlap (they cannot: the
                // ranges of one allocation were checked above).
                unsafe { std::ptr::copy(from, to, n) };
            }
            (Some(to), None) => transfers.push(Transfer {
                target: src.target(),
                offset: s.src.at,
                // SAFETY: as above, `n` bytes at `to` are mapped for the
                // whole call; segments are disjoint ranges of `dst`, so no
                // two buffers alias, and the source is another allocation
                // or a disjoint range of this one. The fabric fills it with
                // system calls or the HCA; other processes that write these
                // bytes at the same time are unordered with it, as with
                // any two writers (ARCHITECTURE, "Coherence").
                buf: IoBuf::Read(unsafe { std::slice::from_raw_parts_mut(to, n) }),
            }),
            (None, Some(from)) => transfers.push(Transfer {
                target: dst.target(),
                offset: s.dst.at,
                // SAFETY: as above, read-only.
                buf: IoBuf::Write(unsafe { std::slice::from_raw_parts(from, n) }),
            }),
            (None, None) if pullable(s) => transfers.push(Transfer {
                target: dst.target(),
                offset: s.dst.at,
                buf: IoBuf::Pull(Pull {
                    src: Source {
                        alloc_id: src.desc.id,
                        key: src.desc.key,
                        offset: s.src.at,
                        addr: s.src.extent.data_addr.clone(),
                    },
                    len: n,
                }),
            }),
            (None, None) => bounced.push(s),
        }
    }
    let mut outcome = data.run(transfers);
    // Every segment runs; the first failure is the outcome.
    for s in bounced {
        let moved = bounce(dst, s.dst.at, src, s.src.at, s.len);
        if outcome.is_ok() {
            outcome = moved;
        }
    }
    outcome
}

/// Whether the destination's agent can pull the segment: its agent
/// reachable over TCP, and a source address the wire can carry.
fn pullable(s: &Segment<'_>) -> bool {
    s.dst.tcp && (1..=MAX_ADDR).contains(&s.src.extent.data_addr.len())
}

/// The copy's segments, in destination order, each side resolved by the
/// data path ([`DataPath::resolve`]).
fn segments<'a>(
    data: &DataPath,
    dst: &'a Allocation,
    dst_offset: u64,
    src: &'a Allocation,
    src_offset: u64,
    len: u64,
) -> Result<Vec<Segment<'a>>> {
    // Where a sub-range starting `from` bytes into a resolved piece lies.
    let side = |p: &Resolved<'a>, from: u64| -> Result<Side<'a>> {
        Ok(Side {
            extent: p.extent,
            at: p.at + from,
            // Inside the piece's mapped range, which `Mapping::ptr_for`
            // checked whole.
            mapped: match p.reach {
                Reach::Mapped(base) => {
                    Some(base.wrapping_add(usize::try_from(from).map_err(|_| too_large())?))
                }
                Reach::Tcp | Reach::Verbs => None,
            },
            tcp: !matches!(p.route, Route::Verbs { fallback: false }),
        })
    };
    let mut out = Vec::new();
    for d in data.resolve(dst.target(), dst_offset, len) {
        let d = d?;
        let s_start = src_offset + (d.at - dst_offset);
        for s in data.resolve(src.target(), s_start, d.len) {
            let s = s?;
            out.push(Segment {
                dst: side(&d, s.at - s_start)?,
                src: side(&s, 0)?,
                len: s.len,
            });
        }
    }
    Ok(out)
}

/// Moves `len` bytes through a buffer here, a step at a time, each side
/// through its handle (and so its failover): where the destination's agent
/// cannot be asked to pull them, or the plan no longer holds.
fn bounce(
    dst: &Allocation,
    dst_offset: u64,
    src: &Allocation,
    src_offset: u64,
    len: u64,
) -> Result<()> {
    let step = len.min(BOUNCE);
    let mut buf = vec![0u8; usize::try_from(step).map_err(|_| too_large())?];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(step);
        let part = &mut buf[..usize::try_from(n).map_err(|_| too_large())?];
        src.copy_out(src_offset + done, part)?;
        dst.copy_in(dst_offset + done, part)?;
        done += n;
    }
    Ok(())
}

fn too_large() -> Error {
    Error::Internal("copy larger than the address space".into())
}
