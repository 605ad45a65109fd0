//! What the C libraries built on this crate share at their boundary
//! (`oncilla-capi`'s `oncilla.h` and `oncillamem`'s `oncillamem.h`): the
//! status codes, the translation of [`Error`] into them, the panic guard
//! every entry point runs under, each thread's last failure, and the checks
//! of raw arguments (strings, pointers, lengths).
//!
//! It exports no symbol (`#[no_mangle]` lives only in those crates, so
//! both libraries can link this one without their same-named C functions
//! colliding), and it never talks to the cluster.

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::Error;

/// Status codes: every call that can fail returns one (0 is success), and
/// `ocm_last_error` repeats the calling thread's last one. The values are
/// part of the ABI and never change.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ocm_status_t {
    OCM_OK = 0,
    /// A NULL pointer, an unknown kind, policy or fabric, a bad string.
    OCM_E_INVALID = 1,
    /// A NULL, unknown or already freed allocation handle.
    OCM_E_BAD_HANDLE = 2,
    /// `ocm_init` has not run (or `ocm_tini` has).
    OCM_E_NOT_INITIALIZED = 3,
    /// A copy outside an allocation.
    OCM_E_OUT_OF_BOUNDS = 4,
    /// Not enough free memory in the cluster (or on the GPU).
    OCM_E_NO_MEMORY = 5,
    /// No such allocation or name in the cluster (freed by someone else).
    OCM_E_NOT_FOUND = 6,
    /// Not allowed: another session's or user's allocation, a credential
    /// or access key that is not accepted.
    OCM_E_PERMISSION = 7,
    /// The local agent, the master or a node cannot be reached, or is down.
    OCM_E_UNREACHABLE = 8,
    /// The data path to a node failed mid-copy.
    OCM_E_FABRIC = 9,
    /// The name is taken by another allocation.
    OCM_E_EXISTS = 10,
    /// Other processes are attached (free it from every process).
    OCM_E_BUSY = 11,
    /// GPU memory where there is none (no CUDA driver, no such device).
    OCM_E_NO_GPU = 12,
    /// The CUDA driver failed.
    OCM_E_GPU = 13,
    /// A cluster token was given (ONCILLA_TOKEN / ONCILLA_TOKEN_FILE) but
    /// cannot be used (unreadable, weak, readable by others). Applications
    /// need none: the agent admits them by its socket's permissions.
    OCM_E_TOKEN = 14,
    /// A bug, an unexpected answer, or a panic caught at the boundary.
    OCM_E_INTERNAL = 15,
    /// The request would take this process's user past a quota (the
    /// message names it; `ocmctl quota` shows them).
    OCM_E_QUOTA = 16,
    /// Remote memory cannot be mapped here (userfaultfd not allowed, too
    /// old a kernel, GPU memory) or its paging failed.
    OCM_E_MAP = 17,
}

use ocm_status_t::*;

/// A failure at the boundary: its code and message.
#[derive(Debug)]
pub struct Fail(pub ocm_status_t, pub String);

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::AgentUnreachable { .. }
            | Error::Unavailable(_)
            | Error::NodeDown(_)
            | Error::NodeUnreachable { .. } => OCM_E_UNREACHABLE,
            Error::NotFound(_) => OCM_E_NOT_FOUND,
            Error::CapacityExhausted(_) => OCM_E_NO_MEMORY,
            Error::QuotaExceeded(_) => OCM_E_QUOTA,
            Error::PermissionDenied(_) => OCM_E_PERMISSION,
            Error::InvalidArgument(_) => OCM_E_INVALID,
            Error::AlreadyExists(_) => OCM_E_EXISTS,
            Error::InUse(_) => OCM_E_BUSY,
            Error::OutOfBounds { .. } => OCM_E_OUT_OF_BOUNDS,
            Error::Fabric { .. } => OCM_E_FABRIC,
            Error::NoGpu(_) => OCM_E_NO_GPU,
            Error::Gpu(_) => OCM_E_GPU,
            Error::Token(_) => OCM_E_TOKEN,
            Error::Map(_) => OCM_E_MAP,
            Error::Internal(_) => OCM_E_INTERNAL,
        };
        Fail(code, e.to_string())
    }
}

/// An `OCM_E_INVALID` failure.
pub fn invalid(msg: impl Into<String>) -> Fail {
    Fail(OCM_E_INVALID, msg.into())
}

/// The failure of a call before `ocm_init` (or after `ocm_tini`); `lib`
/// names the library.
pub fn not_initialized(lib: &str) -> Fail {
    Fail(
        OCM_E_NOT_INITIALIZED,
        format!("{lib} is not initialized: call ocm_init() first"),
    )
}

thread_local! {
    static LAST: RefCell<(ocm_status_t, CString)> = RefCell::new((OCM_OK, CString::default()));
}

fn remember(code: ocm_status_t, msg: String) {
    let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // A call from a thread's exit (its storage gone) keeps no last error.
    let _ = LAST.try_with(|l| *l.borrow_mut() = (code, msg));
}

/// Runs `f` at the boundary: its outcome (a failure, a panic, or success)
/// is recorded as the thread's last; a failure answers its code.
pub fn outcome<T>(f: impl FnOnce() -> Result<T, Fail>) -> Result<T, ocm_status_t> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => {
            remember(OCM_OK, String::new());
            Ok(v)
        }
        Ok(Err(Fail(code, msg))) => {
            remember(code, msg);
            Err(code)
        }
        Err(_) => {
            remember(OCM_E_INTERNAL, "internal error: panic in liboncilla".into());
            Err(OCM_E_INTERNAL)
        }
    }
}

/// [`outcome`] for calls that answer a value: `on_error` on failure.
pub fn guard<T>(on_error: T, f: impl FnOnce() -> Result<T, Fail>) -> T {
    outcome(f).unwrap_or(on_error)
}

/// The calling thread's last status (0 when its last call succeeded).
pub fn last_code() -> c_int {
    catch_unwind(|| {
        LAST.try_with(|l| l.borrow().0 as c_int)
            .unwrap_or(OCM_E_INTERNAL as c_int)
    })
    .unwrap_or(OCM_E_INTERNAL as c_int)
}

/// The message of the calling thread's last failure ("" after a success),
/// valid until that thread's next call.
pub fn last_message() -> *const c_char {
    // The thread's storage is gone only while the thread exits.
    catch_unwind(|| LAST.try_with(|l| l.borrow().1.as_ptr()).ok())
        .ok()
        .flatten()
        .unwrap_or(c"".as_ptr())
}

/// What status code `code` means, as a static string (any `code` is fine).
pub fn strerror(code: c_int) -> &'static CStr {
    match code {
        0 => c"success",
        1 => c"invalid argument",
        2 => c"bad allocation handle (NULL, unknown or freed)",
        3 => c"not initialized (call ocm_init)",
        4 => c"out of bounds",
        5 => c"not enough memory in the cluster",
        6 => c"no such allocation",
        7 => c"permission denied",
        8 => c"agent, master or node unreachable",
        9 => c"data transfer failed",
        10 => c"name already in use",
        11 => c"allocation in use by other processes",
        12 => c"no GPU",
        13 => c"GPU driver failure",
        14 => c"no usable cluster token",
        15 => c"internal error",
        16 => c"quota exceeded",
        17 => c"cannot map remote memory here",
        _ => c"unknown status code",
    }
}

/// A C string argument.
///
/// # Safety
/// `s` is NULL or a NUL-terminated string that stays readable for the call.
pub unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if s.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: not NULL (checked) and NUL-terminated per the caller.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// Refuses a NULL or misaligned pointer to `T`.
pub fn aligned<T>(p: *const T, what: &str) -> Result<(), Fail> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    if !p.is_aligned() {
        return Err(invalid(format!(
            "{what} ({p:p}) is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    Ok(())
}

/// A buffer length the caller's memory can hold (`from_raw_parts` needs
/// at most `isize::MAX` bytes).
pub fn buffer_len(len: u64) -> Result<usize, Fail> {
    usize::try_from(len)
        .ok()
        .filter(|&l| isize::try_from(l).is_ok())
        .ok_or_else(|| invalid(format!("len {len} does not fit in memory")))
}

/// The caller's `len` bytes at `p` to read, `&[]` for none.
///
/// # Safety
/// `p` is NULL or points at `len` bytes readable for `'a`.
pub unsafe fn bytes<'a>(p: *const u8, len: u64, what: &str) -> Result<&'a [u8], Fail> {
    let len = buffer_len(len)?;
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: not NULL (checked), `len` readable bytes per the caller, at
    // most isize::MAX (checked).
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The caller's `len` bytes at `p` to write, `&mut []` for none.
///
/// # Safety
/// `p` is NULL or points at `len` bytes writable for `'a` that nothing
/// else touches meanwhile.
pub unsafe fn bytes_mut<'a>(p: *mut u8, len: u64, what: &str) -> Result<&'a mut [u8], Fail> {
    let len = buffer_len(len)?;
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: not NULL (checked), `len` writable bytes used by nothing
    // else per the caller, at most isize::MAX (checked).
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}
