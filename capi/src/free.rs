//! The C ABI of letting go of allocations (`ocm_free`, `ocm_free_many`):
//! a handle leaves the context at once, its mapping is unmapped, and its
//! allocation is freed (alone, or with a batch in one call) unless
//! another thread is still copying through it, whose end frees it. It
//! only adapts liboncilla's frees to C handles.

use std::ffi::c_int;
use std::sync::Arc;

use liboncilla::ffi::invalid;
use liboncilla::{Allocation, MAX_BATCH};

use super::{bad_handle, ocm_alloc_t, session, status, with_context, Handle};

/// Frees `a`. The handle is invalid afterwards, whatever the outcome: on
/// `OCM_E_BUSY` (a named allocation other processes are attached to) the
/// allocation stays in the cluster for them. A copy still running on the
/// handle in another thread finishes first.
#[no_mangle]
pub extern "C" fn ocm_free(a: ocm_alloc_t) -> c_int {
    status(|| {
        let h = with_context(|c| c.allocs.remove(&(a as usize)).ok_or_else(|| bad_handle(a)))?;
        match last_share(h) {
            Some(alloc) => Ok(alloc.free()?),
            None => Ok(()),
        }
    })
}

/// Frees the `n` allocations of `allocs` together: one call to the
/// master, which frees all of them or, when one may not be freed
/// (`OCM_E_BUSY`: a named allocation other processes are attached to),
/// none. As with `ocm_free`, every handle is invalid afterwards, whatever
/// the outcome: where the batch is refused, each is let go of on its own
/// (one this process made is freed, a named one is detached and stays
/// for the processes attached). `n` is 1 to 256, each allocation once
/// (by one handle); otherwise, or for a NULL or misaligned `allocs`,
/// `OCM_E_INVALID`
/// (`OCM_E_BAD_HANDLE` for a handle that is not live), and no handle is
/// touched. A copy still running on a handle in another thread finishes
/// first, and that allocation is freed after it, alone.
///
/// # Safety
/// `allocs` is NULL, misaligned, or holds `n` handles, readable for the
/// call.
#[no_mangle]
pub unsafe extern "C" fn ocm_free_many(allocs: *const ocm_alloc_t, n: usize) -> c_int {
    status(|| {
        liboncilla::ffi::aligned(allocs, "allocs")?;
        if n == 0 || n > MAX_BATCH as usize {
            return Err(invalid(format!("n is {n}; a batch frees 1 to {MAX_BATCH}")));
        }
        // SAFETY: `allocs` is aligned and not NULL (checked) and holds `n`
        // handles per the caller, readable for the call.
        let given = unsafe { std::slice::from_raw_parts(allocs, n) };
        let taken = with_context(|c| {
            let mut keys: Vec<usize> = given.iter().map(|&a| a as usize).collect();
            keys.sort_unstable();
            if let Some(twice) = keys.windows(2).find(|w| w[0] == w[1]) {
                return Err(invalid(format!("handle {:#x} is given twice", twice[0])));
            }
            let mut ids = Vec::with_capacity(n);
            for &a in given {
                let h = c.allocs.get(&(a as usize)).ok_or_else(|| bad_handle(a))?;
                ids.push(h.alloc.descriptor().id);
            }
            ids.sort_unstable();
            if let Some(twice) = ids.windows(2).find(|w| w[0] == w[1]) {
                return Err(invalid(format!(
                    "allocation {} is given twice (two handles of it)",
                    twice[0]
                )));
            }
            Ok(given
                .iter()
                .filter_map(|&a| c.allocs.remove(&(a as usize)))
                .collect::<Vec<_>>())
        })?;
        let mut batch: Vec<Allocation> = taken.into_iter().filter_map(last_share).collect();
        if batch.is_empty() {
            return Ok(());
        }
        Ok(session()?.free_many(&mut batch)?)
    })
}

/// The allocation of a handle that left the context, unmapped first (its
/// dirty blocks go back before the memory does, and no mapping outlives
/// its allocation); `None` while another thread is copying through it
/// (the last one to finish frees it as the allocation drops).
fn last_share(h: Arc<Handle>) -> Option<Allocation> {
    let Handle { mapped, alloc, .. } = Arc::try_unwrap(h).ok()?;
    if let Some(m) = mapped.into_inner().unwrap_or_else(|e| e.into_inner()) {
        if let Err(e) = m.unmap() {
            tracing::warn!(error = %e, "a mapped allocation freed");
        }
    }
    // The mapping's share went with it: this is the last.
    Arc::try_unwrap(alloc).ok()
}
