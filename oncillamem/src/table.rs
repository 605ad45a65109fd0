//! The process's session and its handles: what `ocm_init` opens and
//! `ocm_tini` closes, and the table that turns a C handle into an
//! allocation. Handles are tokens, never pointers to Rust memory, so a
//! NULL, forged or freed handle is a failure, not undefined behaviour. It
//! knows nothing of C argument types or of how bytes move.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use liboncilla::ffi::{ocm_status_t, Fail};
use liboncilla::{Allocation, Oncilla};

use crate::buffer::{ProcessBuf, Side};
use crate::ocm_kind;

/// An allocation of the original API.
pub struct Handle {
    pub kind: ocm_kind,
    pub local: Local,
    /// A remote kind's remote buffer.
    pub remote: Option<Allocation>,
}

/// The local buffer of an allocation.
pub enum Local {
    /// A remote kind's buffer in this process (none for 0 bytes).
    Process(Option<ProcessBuf>),
    /// A local kind's memory on this node: host memory mapped here at
    /// `host`, or GPU memory (`host` 0) reached by copies.
    Node { alloc: Allocation, host: usize },
}

impl Handle {
    /// The local buffer as one end of a copy.
    pub fn local_side(&self) -> Side<'_> {
        match &self.local {
            Local::Process(Some(b)) => b.side(),
            Local::Process(None) => Side::Mem {
                at: std::ptr::null_mut(),
                len: 0,
            },
            Local::Node { alloc, host: 0 } => Side::Alloc(alloc),
            Local::Node { alloc, host } => Side::Mem {
                at: *host as *mut u8,
                len: alloc.size(),
            },
        }
    }

    /// The local buffer's address (a device address for GPU memory) and
    /// length.
    pub fn local_range(&self) -> (usize, u64) {
        match &self.local {
            Local::Process(Some(b)) => (b.as_ptr() as usize, b.len() as u64),
            Local::Process(None) => (0, 0),
            Local::Node { alloc, host: 0 } => (
                alloc
                    .device_mem()
                    .and_then(|d| d.device_ptr(0).ok())
                    .map_or(0, |p| p as usize),
                alloc.size(),
            ),
            Local::Node { alloc, host } => (*host, alloc.size()),
        }
    }

    /// Frees what the handle holds in the cluster, remote buffer first;
    /// the first failure is reported, after both were tried.
    pub fn free(self) -> Result<(), Fail> {
        let remote = self.remote.map(Allocation::free);
        let local = match self.local {
            Local::Node { alloc, .. } => Some(alloc.free()),
            Local::Process(_) => None,
        };
        for outcome in [remote, local].into_iter().flatten() {
            outcome?;
        }
        Ok(())
    }
}

struct Context {
    ocm: Oncilla,
    handles: HashMap<usize, Arc<Handle>>,
    next: usize,
}

static CONTEXT: Mutex<Option<Context>> = Mutex::new(None);

fn context() -> MutexGuard<'static, Option<Context>> {
    // Every critical section leaves the table consistent before it can panic.
    CONTEXT.lock().unwrap_or_else(|e| e.into_inner())
}

fn not_initialized() -> Fail {
    liboncilla::ffi::not_initialized("liboncillamem")
}

fn bad_handle(h: usize) -> Fail {
    Fail(
        ocm_status_t::OCM_E_BAD_HANDLE,
        format!("{h:#x} is not a live allocation handle (NULL, never returned by ocm_alloc, or already freed)"),
    )
}

fn with_context<T>(f: impl FnOnce(&mut Context) -> Result<T, Fail>) -> Result<T, Fail> {
    context().as_mut().ok_or_else(not_initialized).and_then(f)
}

/// Connects to this node's agent, once; later calls do nothing.
pub fn open() -> Result<(), Fail> {
    let mut guard = context();
    if guard.is_none() {
        *guard = Some(Context {
            ocm: Oncilla::connect()?,
            handles: HashMap::new(),
            next: 1,
        });
    }
    Ok(())
}

/// Ends the session: every allocation still held is freed.
pub fn close() -> Result<(), Fail> {
    let ctx = context().take().ok_or_else(not_initialized)?;
    drop(ctx);
    Ok(())
}

/// The session.
pub fn session() -> Result<Oncilla, Fail> {
    with_context(|c| Ok(c.ocm.clone()))
}

/// Files `handle` in the table and makes its token.
pub fn file(handle: Handle) -> Result<usize, Fail> {
    with_context(|c| {
        // Tokens are 17, 33, 49, ...: never NULL, never a small integer
        // mistaken for a handle.
        c.next += 16;
        c.handles.insert(c.next, Arc::new(handle));
        Ok(c.next)
    })
}

/// The allocation behind token `h`.
pub fn get(h: usize) -> Result<Arc<Handle>, Fail> {
    with_context(|c| c.handles.get(&h).cloned().ok_or_else(|| bad_handle(h)))
}

/// Takes token `h` out of the table: the handle is invalid from now on.
pub fn take(h: usize) -> Result<Arc<Handle>, Fail> {
    with_context(|c| c.handles.remove(&h).ok_or_else(|| bad_handle(h)))
}
