//! The C ABI of mapped remote memory (`ocm_map`, `ocm_flush`,
//! `ocm_invalidate`, `ocm_unmap`): a handle's mapping lives in its
//! [`Handle`] and holds a share of the allocation. It only adapts
//! [`OwnedMapping`] to C; paging is liboncilla's.

use std::ffi::{c_int, c_void};

use super::ocm_status_t::*;
use super::{handle, ocm_alloc_t, status, Handle};
use liboncilla::ffi::{invalid, Fail};
use std::sync::Arc;

use liboncilla::OwnedMapping;
use liboncilla::{MapOptions, Mapped};

/// Maps `a` into this process and stores its first byte's address in
/// `*ptr`. Remote memory is fetched in 64 KiB blocks as it is touched
/// (read ahead up to 32 MiB for sequential access, at most 1 GiB held
/// locally, a block that cannot be fetched within 30 s raises SIGBUS); an
/// allocation in this node's memory is mapped directly. Writes reach the
/// allocation, and other processes, at `ocm_flush` or `ocm_unmap`.
/// `flags` must be 0. `OCM_E_EXISTS` when `a` is mapped already; `OCM_E_MAP`
/// when this process may not map (the message says what to change).
///
/// # Safety
/// `ptr` is NULL (refused) or points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn ocm_map(a: ocm_alloc_t, flags: c_int, ptr: *mut *mut c_void) -> c_int {
    status(|| {
        if ptr.is_null() {
            return Err(invalid("ocm_map: ptr is NULL"));
        }
        if flags != 0 {
            return Err(invalid(format!("ocm_map: flags must be 0, not {flags}")));
        }
        let h = handle(a)?;
        let mut slot = h.mapped.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Err(Fail(
                OCM_E_EXISTS,
                format!(
                    "allocation {} is mapped already; ocm_unmap it first",
                    h.alloc.id()
                ),
            ));
        }
        let m = OwnedMapping::new(Arc::clone(&h.alloc), MapOptions::default())?;
        let at = m.as_ptr().cast::<c_void>();
        *slot = Some(m);
        // SAFETY: not NULL (checked); writable per the caller.
        unsafe { ptr.write(at) };
        Ok(())
    })
}

/// Writes back what was written through `a`'s mapping and unmaps it; the
/// pointer `ocm_map` gave is invalid after. `OCM_E_INVALID` when `a` is not
/// mapped (a second unmap); `OCM_E_MAP` when written bytes could not be
/// written back (a node is down): the range is released all the same.
#[no_mangle]
pub extern "C" fn ocm_unmap(a: ocm_alloc_t) -> c_int {
    status(|| {
        let h = handle(a)?;
        let m = h.mapped.lock().unwrap_or_else(|e| e.into_inner()).take();
        match m {
            Some(m) => Ok(m.unmap()?),
            None => Err(not_mapped(&h)),
        }
    })
}

/// Makes the bytes written through `a`'s mapping in `[offset, offset +
/// len)` visible to other processes (writes them back).
#[no_mangle]
pub extern "C" fn ocm_flush(a: ocm_alloc_t, offset: u64, len: u64) -> c_int {
    on_mapping(a, |m| m.flush(offset, len))
}

/// Drops the clean cached blocks of `[offset, offset + len)` of `a`'s
/// mapping: the next touch fetches what the allocation holds then.
#[no_mangle]
pub extern "C" fn ocm_invalidate(a: ocm_alloc_t, offset: u64, len: u64) -> c_int {
    on_mapping(a, |m| m.invalidate(offset, len))
}

/// `f` on `a`'s mapping, as a status.
fn on_mapping(a: ocm_alloc_t, f: impl FnOnce(&Mapped<'static>) -> liboncilla::Result<()>) -> c_int {
    status(|| {
        let h = handle(a)?;
        let slot = h.mapped.lock().unwrap_or_else(|e| e.into_inner());
        let m = slot.as_ref().ok_or_else(|| not_mapped(&h))?;
        Ok(f(m)?)
    })
}

fn not_mapped(h: &Handle) -> Fail {
    invalid(format!(
        "allocation {} is not mapped (ocm_map it first; a second ocm_unmap is refused)",
        h.alloc.id()
    ))
}
