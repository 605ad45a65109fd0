//! liboncillamem: the original Oncilla runtime's application API
//! (`include/oncillamem.h`, generated from this crate by cbindgen), so that
//! programs written for that runtime compile unmodified and run against an
//! Oncilla cluster. Its functions share names with `oncilla.h`'s, which is
//! why this is a library of its own over liboncilla's Rust API.
//!
//! This module owns the translation between the original calls and
//! liboncilla: its kinds, its paired local and remote buffers, its
//! parameter blocks. Every entry point checks its raw arguments (NULL,
//! alignment, kinds and flags as plain integers), runs under the panic
//! guard (no panic crosses into C) and answers 0 or a negative status;
//! `oncillamem_last_error_message` says what failed. Handles and the
//! session are `table`'s; moving bytes is `buffer`'s.

#![allow(non_camel_case_types)]

mod buffer;
mod table;

use std::ffi::{c_char, c_int, c_void};
use std::num::NonZeroUsize;
use std::panic::catch_unwind;

use liboncilla::ffi::{aligned, buffer_len, guard, invalid, outcome, Fail};
use liboncilla::Kind;

use buffer::{move_bytes, ProcessBuf, Side};
use table::{Handle, Local};

/// The kinds of the original runtime. RMA (EXTOLL) and RDMA kinds both
/// mean host memory over the best fabric Oncilla has. An allocation's kind
/// is read back as this enum; C passes it in `ocm_alloc_params` as an
/// integer, and any other value is refused.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ocm_kind {
    /// Not a kind: what `ocm_alloc_kind` answers for a bad handle (an
    /// addition to the original enum).
    OCM_KIND_INVALID = 0,
    /// Host memory of this node (one buffer).
    OCM_LOCAL_HOST = 1,
    /// Host memory of this node (one buffer), as OCM_LOCAL_HOST.
    OCM_LOCAL_RMA,
    /// A local buffer paired with host memory anywhere in the cluster.
    OCM_REMOTE_RMA,
    /// Host memory of this node (one buffer), as OCM_LOCAL_HOST.
    OCM_LOCAL_RDMA,
    /// A local buffer paired with host memory anywhere in the cluster.
    OCM_REMOTE_RDMA,
    /// Device memory of this node's GPU in this process (one buffer;
    /// `ocm_localbuf` gives its device address).
    OCM_LOCAL_GPU,
    /// A local buffer paired with GPU memory an agent holds anywhere in
    /// the cluster.
    OCM_REMOTE_GPU,
}

impl ocm_kind {
    /// The kind C passed as `k`.
    fn from_c(k: c_int) -> Result<Self, Fail> {
        use ocm_kind::*;
        Ok(match k {
            1 => OCM_LOCAL_HOST,
            2 => OCM_LOCAL_RMA,
            3 => OCM_REMOTE_RMA,
            4 => OCM_LOCAL_RDMA,
            5 => OCM_REMOTE_RDMA,
            6 => OCM_LOCAL_GPU,
            7 => OCM_REMOTE_GPU,
            k => {
                return Err(invalid(format!(
                    "kind {k} is not an enum ocm_kind value (OCM_LOCAL_HOST 1 ... OCM_REMOTE_GPU 7)"
                )))
            }
        })
    }

    /// Whether the kind pairs a local buffer with a remote one.
    fn is_remote(self) -> bool {
        use ocm_kind::*;
        matches!(self, OCM_REMOTE_RMA | OCM_REMOTE_RDMA | OCM_REMOTE_GPU)
    }

    /// What liboncilla allocates for it: the remote buffer of a remote
    /// kind, the one buffer of a local kind.
    fn cluster_kind(self) -> Kind {
        use ocm_kind::*;
        match self {
            OCM_REMOTE_RMA | OCM_REMOTE_RDMA => Kind::RemoteHost,
            OCM_REMOTE_GPU => Kind::RemoteGpu,
            OCM_LOCAL_GPU => Kind::LocalGpu,
            OCM_KIND_INVALID | OCM_LOCAL_HOST | OCM_LOCAL_RMA | OCM_LOCAL_RDMA => Kind::LocalHost,
        }
    }
}

/// An allocation: an opaque handle, valid from `ocm_alloc` until `ocm_free`.
pub struct lib_alloc {
    _opaque: [u8; 0],
}

/// A handle to an allocation.
pub type ocm_alloc_t = *mut lib_alloc;

/// What `ocm_copy` and `ocm_copy_onesided` move (see each).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ocm_params {
    pub src_offset: u64,
    pub dest_offset: u64,
    pub src_offset_2: u64,
    pub dest_offset_2: u64,
    pub bytes: u64,
    /// 0 reads, 1 writes; any other value is refused.
    pub op_flag: c_int,
}

pub type ocm_param_t = *mut ocm_params;

/// What `ocm_alloc` makes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ocm_alloc_params {
    /// The local buffer: a local kind's only buffer (more than 0), a remote
    /// kind's buffer in this process (0 for none).
    pub local_alloc_bytes: u64,
    /// A remote kind's remote buffer (more than 0); ignored for local kinds.
    pub rem_alloc_bytes: u64,
    /// An `enum ocm_kind` value.
    pub kind: c_int,
}

pub type ocm_alloc_param_t = *mut ocm_alloc_params;

/// [`outcome`] for calls that answer a status: 0, or minus the code.
fn status(f: impl FnOnce() -> Result<(), Fail>) -> c_int {
    match outcome(f) {
        Ok(()) => 0,
        Err(code) => -(code as c_int),
    }
}

/// A copy's direction from `op_flag`: true for a write.
fn writes(op_flag: c_int) -> Result<bool, Fail> {
    match op_flag {
        0 => Ok(false),
        1 => Ok(true),
        f => Err(invalid(format!("op_flag is {f}: 0 reads, 1 writes"))),
    }
}

/// The parameter block `p` points at.
///
/// # Safety
/// `p` is NULL, misaligned (both refused) or points at a readable `T`.
unsafe fn read<T: Copy>(p: *const T, what: &str) -> Result<T, Fail> {
    aligned(p, what)?;
    // SAFETY: not NULL and aligned (checked), readable per the caller.
    Ok(unsafe { p.read() })
}

/// Connects this process to its node's agent (`ONCILLA_SOCKET`, token
/// from `ONCILLA_TOKEN` or `ONCILLA_TOKEN_FILE`, as for liboncilla).
/// Calling it again while initialized does nothing.
#[no_mangle]
pub extern "C" fn ocm_init() -> c_int {
    status(table::open)
}

/// Frees every allocation this process still holds and ends the session.
/// Handles are invalid afterwards.
#[no_mangle]
pub extern "C" fn ocm_tini() -> c_int {
    status(table::close)
}

/// An allocation as `params` describes it; NULL on failure (a NULL or
/// misaligned `params`, an unknown kind, a zero size).
///
/// # Safety
/// `params` is NULL, misaligned, or points at a readable
/// `struct ocm_alloc_params`.
#[no_mangle]
pub unsafe extern "C" fn ocm_alloc(params: ocm_alloc_param_t) -> ocm_alloc_t {
    guard(std::ptr::null_mut(), || {
        // SAFETY: as the caller promises.
        let p = unsafe { read(params.cast_const(), "params")? };
        let kind = ocm_kind::from_c(p.kind)?;
        let ocm = table::session()?;
        let handle = if kind.is_remote() {
            if p.rem_alloc_bytes == 0 {
                return Err(invalid(
                    "rem_alloc_bytes is 0: a remote kind needs a remote buffer",
                ));
            }
            let local = match NonZeroUsize::new(buffer_len(p.local_alloc_bytes)?) {
                Some(len) => Some(ProcessBuf::new(len)?),
                None => None,
            };
            Handle {
                kind,
                local: Local::Process(local),
                remote: Some(ocm.alloc(p.rem_alloc_bytes, kind.cluster_kind())?),
            }
        } else {
            if p.local_alloc_bytes == 0 {
                return Err(invalid(
                    "local_alloc_bytes is 0: a local kind is one buffer of local_alloc_bytes",
                ));
            }
            let alloc = ocm.alloc(p.local_alloc_bytes, kind.cluster_kind())?;
            let host = if kind == ocm_kind::OCM_LOCAL_GPU {
                0
            } else {
                alloc.local_range()?.0 as usize
            };
            Handle {
                kind,
                local: Local::Node { alloc, host },
                remote: None,
            }
        };
        Ok(table::file(handle)? as ocm_alloc_t)
    })
}

/// Frees `a`; the handle is invalid afterwards, whatever the outcome. A
/// copy still running on it in another thread finishes first (and the
/// memory goes when it does).
#[no_mangle]
pub extern "C" fn ocm_free(a: ocm_alloc_t) -> c_int {
    status(
        || match std::sync::Arc::try_unwrap(table::take(a as usize)?) {
            Ok(h) => h.free(),
            Err(_) => Ok(()),
        },
    )
}

/// The local buffer of `a` and its length: a remote kind's buffer in this
/// process (NULL and 0 when made with 0 bytes), a local host kind's memory
/// (mapped in this process), a local GPU kind's device address.
///
/// # Safety
/// `buf` and `len` are NULL (refused) or point at writable storage.
#[no_mangle]
pub unsafe extern "C" fn ocm_localbuf(
    a: ocm_alloc_t,
    buf: *mut *mut c_void,
    len: *mut usize,
) -> c_int {
    status(|| {
        aligned(buf.cast_const(), "buf")?;
        aligned(len.cast_const(), "len")?;
        let (at, n) = table::get(a as usize)?.local_range();
        let n = buffer_len(n)?;
        // SAFETY: both aligned and not NULL (checked), writable per the
        // caller.
        unsafe {
            buf.write(at as *mut c_void);
            len.write(n);
        }
        Ok(())
    })
}

/// Whether `a` is of a remote kind (false, and a failure recorded, for a
/// bad handle).
#[no_mangle]
pub extern "C" fn ocm_is_remote(a: ocm_alloc_t) -> bool {
    guard(false, || Ok(table::get(a as usize)?.kind.is_remote()))
}

/// The kind `a` was made with (`OCM_KIND_INVALID` for a bad handle).
#[no_mangle]
pub extern "C" fn ocm_alloc_kind(a: ocm_alloc_t) -> ocm_kind {
    guard(ocm_kind::OCM_KIND_INVALID, || {
        Ok(table::get(a as usize)?.kind)
    })
}

/// The size of `a`'s remote buffer in `*len` (0 for a local kind).
///
/// # Safety
/// `len` is NULL (refused) or points at writable storage.
#[no_mangle]
pub unsafe extern "C" fn ocm_remote_sz(a: ocm_alloc_t, len: *mut usize) -> c_int {
    status(|| {
        aligned(len.cast_const(), "len")?;
        let h = table::get(a as usize)?;
        let n = buffer_len(h.remote.as_ref().map_or(0, |r| r.size()))?;
        // SAFETY: aligned and not NULL (checked), writable per the caller.
        unsafe { len.write(n) };
        Ok(())
    })
}

/// The whole of `a`'s remote buffer (or a local kind's one buffer) and
/// its size.
fn whole(h: &Handle) -> (Side<'_>, u64, &'static str) {
    match &h.remote {
        Some(r) => (Side::Alloc(r), r.size(), "remote buffer"),
        None => (h.local_side(), h.local_range().1, "local buffer"),
    }
}

/// Copies all of `src`'s remote buffer (a local kind: its one buffer) to
/// `dst`, which must hold that many bytes (`ocm_remote_sz`).
///
/// # Safety
/// `dst` is NULL (refused) or points at that many writable bytes that
/// nothing else touches during the call.
#[no_mangle]
pub unsafe extern "C" fn ocm_copy_out(dst: *mut c_void, src: ocm_alloc_t) -> c_int {
    status(|| {
        let h = table::get(src as usize)?;
        let (from, n, what) = whole(&h);
        if dst.is_null() {
            return Err(invalid("dst is NULL"));
        }
        let to = Side::Mem {
            at: dst.cast(),
            len: n,
        };
        move_bytes(&table::session()?, (to, 0, "dst"), (from, 0, what), n)
    })
}

/// Copies `src` into all of `dst`'s remote buffer (a local kind: its one
/// buffer); `src` must hold that many bytes (`ocm_remote_sz`).
///
/// # Safety
/// `src` is NULL (refused) or points at that many readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ocm_copy_in(dst: ocm_alloc_t, src: *mut c_void) -> c_int {
    status(|| {
        let h = table::get(dst as usize)?;
        let (to, n, what) = whole(&h);
        if src.is_null() {
            return Err(invalid("src is NULL"));
        }
        let from = Side::Mem {
            at: src.cast(),
            len: n,
        };
        move_bytes(&table::session()?, (to, 0, what), (from, 0, "src"), n)
    })
}

/// Copies `options->bytes` between two allocations: with `op_flag` 1 from
/// `src` to `dst`, with 0 from `dst` to `src`. Each offset stays with its
/// allocation: `src_offset`/`dest_offset` address the local buffers of
/// `src`/`dst`; an allocation of a remote kind hops between its remote
/// buffer (at `src_offset_2`/`dest_offset_2`) and its local buffer: the
/// copy reads the source's remote bytes into its local buffer, copies local
/// to local, and writes the destination's local bytes to its remote buffer.
///
/// # Safety
/// `options` is NULL, misaligned (both refused) or points at a readable
/// `struct ocm_params`.
#[no_mangle]
pub unsafe extern "C" fn ocm_copy(
    dst: ocm_alloc_t,
    src: ocm_alloc_t,
    options: ocm_param_t,
) -> c_int {
    status(|| {
        // SAFETY: as the caller promises.
        let p = unsafe { read(options.cast_const(), "options")? };
        let (d, s) = (table::get(dst as usize)?, table::get(src as usize)?);
        let d_end = (&*d, p.dest_offset, p.dest_offset_2);
        let s_end = (&*s, p.src_offset, p.src_offset_2);
        let ((from, from_off, from_off2), (to, to_off, to_off2)) = if writes(p.op_flag)? {
            (s_end, d_end)
        } else {
            (d_end, s_end)
        };
        let ocm = table::session()?;
        let n = p.bytes;
        if let Some(r) = &from.remote {
            move_bytes(
                &ocm,
                (from.local_side(), from_off, "source's local buffer"),
                (Side::Alloc(r), from_off2, "source's remote buffer"),
                n,
            )?;
        }
        move_bytes(
            &ocm,
            (to.local_side(), to_off, "destination's local buffer"),
            (from.local_side(), from_off, "source's local buffer"),
            n,
        )?;
        if let Some(r) = &to.remote {
            move_bytes(
                &ocm,
                (Side::Alloc(r), to_off2, "destination's remote buffer"),
                (to.local_side(), to_off, "destination's local buffer"),
                n,
            )?;
        }
        Ok(())
    })
}

/// Moves `options->bytes` between `src`'s local and remote buffers (a
/// remote kind only): with `op_flag` 1 writes local → remote, with 0 reads
/// remote → local. In both directions `src_offset` is the offset in the
/// local buffer and `dest_offset` the offset in the remote buffer; more
/// bytes than the local buffer holds from there is `OCM_E_OUT_OF_BOUNDS`.
///
/// # Safety
/// `options` is NULL, misaligned (both refused) or points at a readable
/// `struct ocm_params`.
#[no_mangle]
pub unsafe extern "C" fn ocm_copy_onesided(src: ocm_alloc_t, options: ocm_param_t) -> c_int {
    status(|| {
        // SAFETY: as the caller promises.
        let p = unsafe { read(options.cast_const(), "options")? };
        let h = table::get(src as usize)?;
        let Some(r) = &h.remote else {
            return Err(invalid(format!(
                "ocm_copy_onesided needs a remote kind; this allocation is {:?} (use ocm_copy)",
                h.kind
            )));
        };
        let local = (h.local_side(), p.src_offset, "local buffer");
        let remote = (Side::Alloc(r), p.dest_offset, "remote buffer");
        let ocm = table::session()?;
        if writes(p.op_flag)? {
            move_bytes(&ocm, remote, local, p.bytes)
        } else {
            move_bytes(&ocm, local, remote, p.bytes)
        }
    })
}

/// The status this thread's last call answered: 0 after a success, else
/// the same negative value (an addition to the original API).
#[no_mangle]
pub extern "C" fn oncillamem_last_error() -> c_int {
    -liboncilla::ffi::last_code()
}

/// What this thread's last failure was, in full ("" after a success),
/// valid until its next call into liboncillamem (an addition to the
/// original API).
#[no_mangle]
pub extern "C" fn oncillamem_last_error_message() -> *const c_char {
    liboncilla::ffi::last_message()
}

/// What a status (negative, as the calls answer it, or its positive code)
/// means, as a static string (an addition to the original API).
#[no_mangle]
pub extern "C" fn oncillamem_strerror(status: c_int) -> *const c_char {
    catch_unwind(|| liboncilla::ffi::strerror(status.saturating_abs()).as_ptr())
        .unwrap_or(c"internal error".as_ptr())
}
