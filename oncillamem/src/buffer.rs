//! The buffers an original-API allocation is made of, and the one way
//! bytes move between two of them. A buffer is either memory of this
//! process (a remote kind's local buffer, or this node's host memory
//! mapped here) or a liboncilla [`Allocation`] reached by copies (remote
//! memory, GPU memory). It owns no handle table and checks no C argument.

use std::num::NonZeroUsize;
use std::ptr::NonNull;

use liboncilla::ffi::{ocm_status_t, Fail};
use liboncilla::{Allocation, Oncilla};
use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

/// Zeroed, page-aligned memory of this process, unmapped on drop: a
/// remote kind's local buffer.
pub struct ProcessBuf {
    at: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; which thread
// unmaps it does not matter, and access through `at` is ordered by the
// API's contract (a program must not touch a range while a call moves
// bytes through it).
unsafe impl Send for ProcessBuf {}
// SAFETY: as for Send: `&ProcessBuf` only hands out the address.
unsafe impl Sync for ProcessBuf {}

impl ProcessBuf {
    /// `len` (> 0) zeroed bytes.
    pub fn new(len: NonZeroUsize) -> Result<Self, Fail> {
        // SAFETY: a fresh private anonymous mapping aliases nothing.
        let at = unsafe {
            mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }
        .map_err(|e| {
            Fail(
                ocm_status_t::OCM_E_NO_MEMORY,
                format!("cannot map a local buffer of {len} bytes in this process: {e}"),
            )
        })?;
        Ok(ProcessBuf {
            at: at.cast(),
            len: len.get(),
        })
    }

    pub fn side(&self) -> Side<'_> {
        Side::Mem {
            at: self.at.as_ptr(),
            len: self.len as u64,
        }
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.at.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for ProcessBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped once; no reference into
        // it outlives `self` (slices exist only inside one copy).
        let _ = unsafe { munmap(self.at.cast(), self.len) };
    }
}

/// One end of a copy: bytes of this process at `at` (`len` of them), or an
/// allocation reached by liboncilla's copies.
#[derive(Clone, Copy)]
pub enum Side<'a> {
    Mem { at: *mut u8, len: u64 },
    Alloc(&'a Allocation),
}

impl Side<'_> {
    /// The address of `n` bytes at `off` of a `Mem` side, checked against
    /// its length; `what` names the buffer in the error.
    fn span(at: *mut u8, len: u64, off: u64, n: u64, what: &str) -> Result<*mut u8, Fail> {
        match off.checked_add(n) {
            Some(end) if end <= len => {
                // SAFETY: `off` is within the buffer's `len` bytes (checked),
                // so the result stays inside its mapping.
                Ok(unsafe { at.add(off as usize) })
            }
            _ => Err(Fail(
                ocm_status_t::OCM_E_OUT_OF_BOUNDS,
                format!("{n} bytes at offset {off} of the {what} run past its {len} bytes"),
            )),
        }
    }
}

/// Moves `n` bytes from `from` at `from_off` to `to` at `to_off`; `from_what`
/// and `to_what` name the buffers in errors.
pub fn move_bytes(
    ocm: &Oncilla,
    (to, to_off, to_what): (Side<'_>, u64, &str),
    (from, from_off, from_what): (Side<'_>, u64, &str),
    n: u64,
) -> Result<(), Fail> {
    if n == 0 {
        return Ok(());
    }
    match (to, from) {
        (Side::Mem { at: t, len: tl }, Side::Mem { at: f, len: fl }) => {
            let dst = Side::span(t, tl, to_off, n, to_what)?;
            let src = Side::span(f, fl, from_off, n, from_what)?;
            // SAFETY: both ranges lie inside live buffers (checked); `copy`
            // allows them to overlap (one buffer to itself).
            unsafe { std::ptr::copy(src, dst, n as usize) };
        }
        (Side::Mem { at, len }, Side::Alloc(a)) => {
            let dst = Side::span(at, len, to_off, n, to_what)?;
            // SAFETY: the range lies inside a live buffer of this process
            // (checked) that nothing else touches during the call (the
            // API's contract).
            let dst = unsafe { std::slice::from_raw_parts_mut(dst, n as usize) };
            a.copy_out(from_off, dst)?;
        }
        (Side::Alloc(a), Side::Mem { at, len }) => {
            let src = Side::span(at, len, from_off, n, from_what)?;
            // SAFETY: as above; the bytes are only read.
            let src = unsafe { std::slice::from_raw_parts(src.cast_const(), n as usize) };
            a.copy_in(to_off, src)?;
        }
        (Side::Alloc(t), Side::Alloc(f)) => ocm.copy(t, to_off, f, from_off, n)?,
    }
    Ok(())
}
