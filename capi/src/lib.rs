//! liboncilla's C ABI (`liboncilla.so`/`.a`, `include/oncilla.h`
//! generated from this crate by cbindgen): the Oncilla calls (`ocm_init`,
//! `ocm_alloc`, `ocm_copy`, ...) over [`Oncilla`], with stable numeric
//! status codes and opaque handles. A crate of its own so that Rust users of
//! liboncilla build no C library, and so that `oncillamem` (the original
//! runtime's API, whose functions share these names) links liboncilla
//! without two definitions of one symbol.
//!
//! Handles are tokens, never pointers to Rust memory: each names an entry
//! of a process-wide table, so a NULL, forged or freed handle is answered
//! with `OCM_E_BAD_HANDLE` instead of undefined behaviour. Kinds, policies,
//! fabrics and flags cross the ABI as plain integers (a C enum or `bool`
//! may hold any value; a Rust one may not) and are checked here: an
//! unknown value is `OCM_E_INVALID`, as are NULL or misaligned pointers
//! to checked arguments. Every entry point catches panics
//! (`OCM_E_INTERNAL`); none crosses into C. Every
//! call may run concurrently with every other on any thread, except that
//! `ocm_init` and `ocm_tini` must not race each other; a handle freed while
//! another thread copies with it stays valid until that copy returns.
//!
//! The last failure of each thread is kept for `ocm_last_error` and
//! `ocm_last_error_message`. This module owns only the translation between
//! C and the Rust API; it never talks to the cluster itself.

#![allow(non_camel_case_types)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::panic::catch_unwind;
use std::sync::{Arc, Mutex, MutexGuard};

pub use liboncilla::ffi::ocm_status_t;
use liboncilla::ffi::{aligned, bytes, bytes_mut, guard, invalid, outcome, text, Fail};
use liboncilla::{AllocSpec, Allocation, Fabric, Kind, Oncilla, OwnedMapping, Policy};

mod free;
pub use free::{ocm_free, ocm_free_many};
mod map;
pub use map::{ocm_flush, ocm_invalidate, ocm_map, ocm_unmap};

use ocm_status_t::*;

/// What an allocation's bytes are (values as in the original Oncilla).
/// Calls take them as `int`: any other value is `OCM_E_INVALID`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ocm_kind_t {
    /// Not a kind: what `ocm_kind` answers for a bad handle.
    OCM_KIND_INVALID = 0,
    /// Host memory of this node's agent (mapped: see `ocm_localbuf`).
    OCM_LOCAL_HOST = 1,
    /// Host memory anywhere in the cluster.
    OCM_REMOTE_HOST = 2,
    /// Device memory of one of this node's GPUs, in this process.
    OCM_LOCAL_GPU = 3,
    /// Device memory of a GPU held by an agent anywhere in the cluster.
    OCM_REMOTE_GPU = 4,
}

/// How the master places an allocation that names no nodes (an `int` in
/// `ocm_params_t`: any other value is `OCM_E_INVALID`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ocm_policy_t {
    /// This node if it holds it all, else the emptiest nodes.
    OCM_POLICY_LOCAL_FIRST = 0,
    /// An equal share on every live node with room.
    OCM_POLICY_SPREAD = 1,
    /// As few nodes as possible.
    OCM_POLICY_PACK = 2,
}

/// How this process moves bytes (a hint; `AUTO` picks the best reachable;
/// an `int` in `ocm_params_t`: any other value is `OCM_E_INVALID`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ocm_fabric_t {
    OCM_FABRIC_AUTO = 0,
    OCM_FABRIC_TCP = 1,
    OCM_FABRIC_SHM = 2,
    OCM_FABRIC_VERBS = 3,
}

/// An allocation: an opaque handle, valid from `ocm_alloc`/`ocm_attach`
/// until `ocm_free`.
pub struct ocm_allocation {
    _opaque: [u8; 0],
}

/// A handle to an allocation.
pub type ocm_alloc_t = *mut ocm_allocation;

/// Everything `ocm_alloc_ex` can ask for. Start from
/// `ocm_params_default(size, kind)` and change what you need.
///
/// The struct grows at its end in later versions. `struct_size` says how
/// much of it the program knows (`ocm_params_default` sets it to the
/// `sizeof` of the header it was compiled with): a library reads that
/// much, and gives fields past it their defaults; a newer program's
/// fields this library does not know must be zero (`OCM_E_INVALID`
/// otherwise: it cannot do what they ask).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ocm_params_t {
    /// `sizeof(ocm_params_t)` as the program knows it; set by
    /// `ocm_params_default`.
    pub struct_size: usize,
    pub size: u64,
    /// An `ocm_kind_t` value.
    pub kind: c_int,
    /// An `ocm_policy_t` value, used when `n_nodes` is 0.
    pub policy: c_int,
    /// `n_nodes` node names to place the allocation on (transparent
    /// placement); NULL with `n_nodes` 0 for the policy's choice.
    pub nodes: *const *const c_char,
    /// NULL for equal shares, else `n_nodes` weights (each at least 1).
    pub weights: *const u32,
    /// At most 65,536 (`OCM_E_INVALID` above).
    pub n_nodes: usize,
    /// Stripe unit in bytes over the chosen nodes; 0 for contiguous shares.
    pub stripe: u64,
    /// A name other processes can `ocm_attach`; NULL for none.
    pub name: *const c_char,
    /// 1: outlives this process until freed explicitly (needs a name);
    /// 0: does not. Any other value is `OCM_E_INVALID`.
    pub persistent: u8,
    /// An `ocm_fabric_t` value.
    pub fabric: c_int,
    /// GPU kinds: the device index, or -1 for any.
    pub gpu: i32,
    /// Copies of every byte, each on another node: 0 or 1 for one, at most
    /// 3 (`OCM_E_INVALID` above). Remote host memory over TCP only.
    pub replicas: u32,
}

/// The process's session and its handles.
struct Context {
    ocm: Oncilla,
    allocs: HashMap<usize, Arc<Handle>>,
    next: usize,
}

/// One allocation behind a handle, with its mapping found once.
struct Handle {
    /// `ocm_map`'s mapping, which holds a share of the allocation; unmapped
    /// before the allocation is freed.
    mapped: Mutex<Option<OwnedMapping>>,
    /// The only other share is a mapping's.
    alloc: Arc<Allocation>,
    /// `ocm_localbuf`'s answer: the mapped bytes of a local host
    /// allocation (an address, valid while `alloc` lives), or 0.
    local: usize,
}

static CONTEXT: Mutex<Option<Context>> = Mutex::new(None);

fn context() -> MutexGuard<'static, Option<Context>> {
    // Every critical section leaves the table consistent before it can panic.
    CONTEXT.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`outcome`] for calls that answer a status.
fn status(f: impl FnOnce() -> Result<(), Fail>) -> c_int {
    match outcome(f) {
        Ok(()) => OCM_OK as c_int,
        Err(code) => code as c_int,
    }
}

fn not_initialized() -> Fail {
    liboncilla::ffi::not_initialized("liboncilla")
}

fn bad_handle(h: *const ocm_allocation) -> Fail {
    Fail(
        OCM_E_BAD_HANDLE,
        format!("{h:p} is not a live allocation handle (NULL, never returned by ocm_alloc/ocm_attach, or already freed)"),
    )
}

/// Runs `f` on the process's context (locked), or fails with
/// `OCM_E_NOT_INITIALIZED` when there is none.
fn with_context<T>(f: impl FnOnce(&mut Context) -> Result<T, Fail>) -> Result<T, Fail> {
    context().as_mut().ok_or_else(not_initialized).and_then(f)
}

/// The session.
fn session() -> Result<Oncilla, Fail> {
    with_context(|c| Ok(c.ocm.clone()))
}

/// The allocation behind `h`.
fn handle(h: *const ocm_allocation) -> Result<Arc<Handle>, Fail> {
    with_context(|c| {
        c.allocs
            .get(&(h as usize))
            .cloned()
            .ok_or_else(|| bad_handle(h))
    })
}

/// Files `alloc` in the table and makes its handle.
fn file(mut alloc: Allocation) -> Result<ocm_alloc_t, Fail> {
    let local = alloc.localbuf().map_or(0, |b| b.as_mut_ptr() as usize);
    with_context(|c| {
        // Tokens are 17, 33, 49, ...: never NULL, never a small integer
        // mistaken for a handle.
        c.next += 16;
        c.allocs.insert(
            c.next,
            Arc::new(Handle {
                mapped: Mutex::new(None),
                alloc: Arc::new(alloc),
                local,
            }),
        );
        Ok(c.next as ocm_alloc_t)
    })
}

/// The most node names `ocm_params_t` may carry (an allocation has at
/// most this many extents, so never more nodes).
const OCM_MAX_NODES: usize = 1 << 16;

/// The kind `k` names (an `ocm_kind_t` value).
fn kind_from(k: c_int) -> Result<Kind, Fail> {
    use ocm_kind_t::*;
    match k {
        k if k == OCM_LOCAL_HOST as c_int => Ok(Kind::LocalHost),
        k if k == OCM_REMOTE_HOST as c_int => Ok(Kind::RemoteHost),
        k if k == OCM_LOCAL_GPU as c_int => Ok(Kind::LocalGpu),
        k if k == OCM_REMOTE_GPU as c_int => Ok(Kind::RemoteGpu),
        k => Err(invalid(format!(
            "kind {k} is not a kind (OCM_LOCAL_HOST 1, OCM_REMOTE_HOST 2, OCM_LOCAL_GPU 3, OCM_REMOTE_GPU 4)"
        ))),
    }
}

/// The policy `p` names (an `ocm_policy_t` value).
fn policy_from(p: c_int) -> Result<Policy, Fail> {
    use ocm_policy_t::*;
    match p {
        p if p == OCM_POLICY_LOCAL_FIRST as c_int => Ok(Policy::LocalFirst),
        p if p == OCM_POLICY_SPREAD as c_int => Ok(Policy::Spread),
        p if p == OCM_POLICY_PACK as c_int => Ok(Policy::Pack),
        p => Err(invalid(format!(
            "policy {p} is not a policy (OCM_POLICY_LOCAL_FIRST 0, OCM_POLICY_SPREAD 1, OCM_POLICY_PACK 2)"
        ))),
    }
}

/// The fabric `f` names (an `ocm_fabric_t` value).
fn fabric_from(f: c_int) -> Result<Fabric, Fail> {
    use ocm_fabric_t::*;
    match f {
        f if f == OCM_FABRIC_AUTO as c_int => Ok(Fabric::Auto),
        f if f == OCM_FABRIC_TCP as c_int => Ok(Fabric::Tcp),
        f if f == OCM_FABRIC_SHM as c_int => Ok(Fabric::Shm),
        f if f == OCM_FABRIC_VERBS as c_int => Ok(Fabric::Verbs),
        f => Err(invalid(format!(
            "fabric {f} is not a fabric (OCM_FABRIC_AUTO 0, OCM_FABRIC_TCP 1, OCM_FABRIC_SHM 2, OCM_FABRIC_VERBS 3)"
        ))),
    }
}

/// A C truth value that must be 0 or 1.
fn flag(v: u8, what: &str) -> Result<bool, Fail> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(invalid(format!("{what} is {v}, not 0 or 1"))),
    }
}

/// Connects this process to its node's agent (`ONCILLA_SOCKET`). No token
/// is needed: the agent admits the process by its socket's permissions
/// and gives the session a credential of its own (a cluster token in
/// `ONCILLA_TOKEN` or `ONCILLA_TOKEN_FILE`, an operator's, is used when
/// set). Calling it again while initialized does nothing.
#[no_mangle]
pub extern "C" fn ocm_init() -> c_int {
    status(|| {
        let mut guard = context();
        if guard.is_none() {
            *guard = Some(Context {
                ocm: Oncilla::connect()?,
                allocs: HashMap::new(),
                next: 1,
            });
        }
        Ok(())
    })
}

/// Frees every allocation this process still holds (named and persistent
/// ones stay in the cluster) and ends the session. Handles are invalid
/// afterwards.
#[no_mangle]
pub extern "C" fn ocm_tini() -> c_int {
    status(|| {
        let ctx = context().take().ok_or_else(not_initialized)?;
        drop(ctx);
        Ok(())
    })
}

/// `size` bytes of `kind`, placed by the default policy. NULL on failure
/// (see `ocm_last_error`).
#[no_mangle]
pub extern "C" fn ocm_alloc(size: u64, kind: c_int) -> ocm_alloc_t {
    guard(std::ptr::null_mut(), || {
        let kind = kind_from(kind)?;
        file(session()?.alloc(size, kind)?)
    })
}

/// The version of this library, major.minor.patch (also `OCM_VERSION_*`).
pub const OCM_VERSION_MAJOR: u32 = 0;
/// See [`OCM_VERSION_MAJOR`].
pub const OCM_VERSION_MINOR: u32 = 1;
/// See [`OCM_VERSION_MAJOR`].
pub const OCM_VERSION_PATCH: u32 = 0;

/// This library's version as "MAJOR.MINOR.PATCH", a static string (never
/// NULL, never to be freed): what a program linked against the header's
/// `OCM_VERSION_*` can compare with the library it runs with.
#[no_mangle]
pub extern "C" fn ocm_version() -> *const c_char {
    const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    VERSION.as_ptr().cast()
}

/// The parameters `ocm_alloc_ex` starts from: the default policy, no
/// nodes, no stripe, no name, not persistent, automatic fabric, any GPU,
/// one copy. `kind` is kept as given (`ocm_alloc_ex` checks it). For Rust
/// callers of this ABI; C and C++ programs call the header's inline
/// `ocm_params_default`, which passes their `sizeof(ocm_params_t)` to
/// [`ocm_params_init`].
pub fn ocm_params_default(size: u64, kind: c_int) -> ocm_params_t {
    ocm_params_t {
        struct_size: std::mem::size_of::<ocm_params_t>(),
        size,
        kind,
        policy: ocm_policy_t::OCM_POLICY_LOCAL_FIRST as c_int,
        nodes: std::ptr::null(),
        weights: std::ptr::null(),
        n_nodes: 0,
        stripe: 0,
        name: std::ptr::null(),
        persistent: 0,
        fabric: ocm_fabric_t::OCM_FABRIC_AUTO as c_int,
        gpu: -1,
        replicas: 1,
    }
}

/// Fills the `struct_size` bytes at `params` (the program's
/// `sizeof(ocm_params_t)`) with the parameters `ocm_alloc_ex` starts from:
/// the default policy, no nodes, no stripe, no name, not persistent,
/// automatic fabric, any GPU, one copy; `kind` kept as given (`ocm_alloc_ex`
/// checks it), and `struct_size` set. Bytes of a newer program's struct
/// past this library's are zeroed. The header's `ocm_params_default` calls
/// it. `OCM_E_INVALID` for a NULL or misaligned `params`, or a
/// `struct_size` smaller than this version's struct or over 4,096.
///
/// # Safety
/// `params` is NULL, misaligned, or has `struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ocm_params_init(
    params: *mut ocm_params_t,
    struct_size: usize,
    size: u64,
    kind: c_int,
) -> c_int {
    status(|| {
        aligned(params.cast_const(), "params")?;
        let known = struct_size_checked(struct_size)?;
        // SAFETY: aligned (checked) and `struct_size >= known` writable
        // bytes per the caller.
        unsafe {
            params.write(ocm_params_t {
                struct_size,
                ..ocm_params_default(size, kind)
            });
            std::ptr::write_bytes(params.cast::<u8>().add(known), 0, struct_size - known);
        }
        Ok(())
    })
}

/// This library's `sizeof(ocm_params_t)`, once `declared` (a program's)
/// is one it can take: not smaller (only this version exists yet), at
/// most [`PARAMS_MAX`].
fn struct_size_checked(declared: usize) -> Result<usize, Fail> {
    let known = std::mem::size_of::<ocm_params_t>();
    if declared < known {
        return Err(invalid(format!(
            "params.struct_size is {declared}, less than this library's ocm_params_t ({known} bytes): start from ocm_params_default(), which sets it"
        )));
    }
    if declared > PARAMS_MAX {
        return Err(invalid(format!(
            "params.struct_size is {declared}: more than {PARAMS_MAX} bytes is no ocm_params_t"
        )));
    }
    Ok(known)
}

/// An allocation as `params` describes it. NULL on failure; a NULL or
/// misaligned `params`, `nodes` or `weights`, more than 65,536
/// nodes, or an unknown kind, policy, fabric or `persistent` value is
/// `OCM_E_INVALID`.
///
/// # Safety
/// `params` is NULL, misaligned, or points at an `ocm_params_t` whose
/// `nodes` (and `weights`, unless NULL) hold `n_nodes` entries and whose
/// strings are NUL-terminated, all readable for the call.
#[no_mangle]
pub unsafe extern "C" fn ocm_alloc_ex(params: *const ocm_params_t) -> ocm_alloc_t {
    guard(std::ptr::null_mut(), || {
        // SAFETY: as the caller promises.
        let spec = unsafe { spec_from(params)? };
        file(session()?.alloc_with(&spec)?)
    })
}

/// `count` allocations as `params` describes them (neither named nor
/// persistent), made together: one call to the master, all or none. On
/// success `out[0..count]` holds their handles, each freed on its own
/// with `ocm_free`; on failure `out` is left as it was. `count` is 1 to
/// 256; otherwise, or for a named or persistent `params`, or a NULL or
/// misaligned `out`, `OCM_E_INVALID`. `params` is checked as
/// `ocm_alloc_ex` checks it.
///
/// # Safety
/// `params` as for `ocm_alloc_ex`; `out` is NULL, misaligned, or has room
/// for `count` handles, writable for the call.
#[no_mangle]
pub unsafe extern "C" fn ocm_alloc_many(
    params: *const ocm_params_t,
    count: usize,
    out: *mut ocm_alloc_t,
) -> c_int {
    status(|| {
        // SAFETY: as the caller promises.
        let spec = unsafe { spec_from(params)? };
        aligned(out.cast_const(), "out")?;
        let made = session()?.alloc_many(&spec, count)?;
        // `file` fails only when a concurrent `ocm_tini` ended the context:
        // what was filed went with it, the rest is freed as it drops.
        let handles = made.into_iter().map(file).collect::<Result<Vec<_>, _>>()?;
        for (i, h) in handles.into_iter().enumerate() {
            // SAFETY: `out` is aligned (checked) and has room for `count`
            // handles per the caller; `alloc_many` made exactly `count`.
            unsafe { *out.add(i) = h };
        }
        Ok(())
    })
}

/// The spec `params` describes, checked.
///
/// # Safety
/// As for `ocm_alloc_ex`'s `params`.
unsafe fn spec_from(params: *const ocm_params_t) -> Result<AllocSpec, Fail> {
    // SAFETY: as the caller promises.
    let p = unsafe { params_from(params)? };
    let p = &p;
    let mut spec = AllocSpec::new(p.size, kind_from(p.kind)?);
    spec = spec.policy(policy_from(p.policy)?);
    let persistent = flag(p.persistent, "persistent")?;
    let fabric = fabric_from(p.fabric)?;
    if p.n_nodes > OCM_MAX_NODES {
        return Err(invalid(format!(
            "n_nodes {} is more than {OCM_MAX_NODES}",
            p.n_nodes
        )));
    }
    if p.n_nodes > 0 {
        aligned(p.nodes, "nodes")?;
        if !p.weights.is_null() {
            aligned(p.weights, "weights")?;
        }
        let mut named = Vec::with_capacity(p.n_nodes);
        for i in 0..p.n_nodes {
            // SAFETY: `nodes` is aligned (checked) and holds `n_nodes`
            // entries per the caller.
            let node = unsafe { text(*p.nodes.add(i), "a node name")? };
            let weight = if p.weights.is_null() {
                1
            } else {
                // SAFETY: `weights` is aligned (checked) and holds
                // `n_nodes` entries per the caller.
                unsafe { *p.weights.add(i) }
            };
            named.push((node.to_string(), weight));
        }
        spec = spec.on_weighted_nodes(named);
    }
    if p.stripe > 0 {
        spec = spec.stripe(p.stripe);
    }
    if !p.name.is_null() {
        // SAFETY: NUL-terminated per the caller.
        spec = spec.named(unsafe { text(p.name, "name")? });
    }
    if persistent {
        spec = spec.persistent();
    }
    spec = spec.fabric(fabric);
    if p.gpu >= 0 {
        spec = spec.gpu(p.gpu.unsigned_abs());
    }
    spec = spec.replicas(p.replicas);
    Ok(spec)
}

/// The most of a newer program's `ocm_params_t` read: a page.
const PARAMS_MAX: usize = 4096;

/// `*params`, as much of it as its `struct_size` says the program knows
/// (only this version's fields exist yet: a smaller struct is refused),
/// after checking that what a newer program added is zero.
///
/// # Safety
/// As for `ocm_alloc_ex`'s `params`: `struct_size` bytes readable at it.
unsafe fn params_from(params: *const ocm_params_t) -> Result<ocm_params_t, Fail> {
    aligned(params, "params")?;
    // SAFETY: not NULL and aligned (checked); `struct_size` is the first
    // field of every version, readable per the caller.
    let declared = unsafe { std::ptr::addr_of!((*params).struct_size).read() };
    let known = struct_size_checked(declared)?;
    // SAFETY: `declared` bytes are readable at `params` per the caller,
    // and `known <= declared`.
    let newer =
        unsafe { std::slice::from_raw_parts(params.cast::<u8>().add(known), declared - known) };
    if let Some(at) = newer.iter().position(|b| *b != 0) {
        return Err(invalid(format!(
            "params sets byte {} of a newer ocm_params_t ({declared} bytes) that this library ({}) does not know; it cannot do what that field asks",
            known + at,
            env!("CARGO_PKG_VERSION")
        )));
    }
    // SAFETY: aligned, and `known` bytes readable (checked above).
    Ok(unsafe { params.read() })
}

/// The named allocation `name`, made by any process on any node. NULL on
/// failure.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string readable for the call.
#[no_mangle]
pub unsafe extern "C" fn ocm_attach(name: *const c_char) -> ocm_alloc_t {
    guard(std::ptr::null_mut(), || {
        // SAFETY: as the caller promises.
        let name = unsafe { text(name, "name")? };
        file(session()?.attach(name)?)
    })
}

/// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`,
/// any pair of kinds; returns when the bytes are in place.
#[no_mangle]
pub extern "C" fn ocm_copy(
    dst: ocm_alloc_t,
    dst_offset: u64,
    src: ocm_alloc_t,
    src_offset: u64,
    len: u64,
) -> c_int {
    status(|| {
        let (d, s) = (handle(dst)?, handle(src)?);
        session()?.copy(&d.alloc, dst_offset, &s.alloc, src_offset, len)?;
        Ok(())
    })
}

/// Writes `len` bytes from `src` (this process's memory) to `a` at
/// `offset`.
///
/// # Safety
/// `src` is NULL or points at `len` readable bytes for the call.
#[no_mangle]
pub unsafe extern "C" fn ocm_copy_in(
    a: ocm_alloc_t,
    offset: u64,
    src: *const c_void,
    len: u64,
) -> c_int {
    status(|| {
        let h = handle(a)?;
        // SAFETY: NULL (refused unless `len` is 0) or `len` readable bytes
        // for the call, per the caller.
        let bytes = unsafe { bytes(src.cast::<u8>(), len, "src")? };
        h.alloc.copy_in(offset, bytes)?;
        Ok(())
    })
}

/// Reads `len` bytes of `a` at `offset` into `dst` (this process's memory).
///
/// # Safety
/// `dst` is NULL or points at `len` writable bytes that nothing else
/// touches during the call.
#[no_mangle]
pub unsafe extern "C" fn ocm_copy_out(
    a: ocm_alloc_t,
    offset: u64,
    dst: *mut c_void,
    len: u64,
) -> c_int {
    status(|| {
        let h = handle(a)?;
        // SAFETY: NULL (refused unless `len` is 0) or `len` writable bytes
        // nothing else touches during the call, per the caller.
        let bytes = unsafe { bytes_mut(dst.cast::<u8>(), len, "dst")? };
        h.alloc.copy_out(offset, bytes)?;
        Ok(())
    })
}

/// The bytes of a local host allocation as plain memory of this process
/// (shared with the agent: no copy), valid until `ocm_free`. NULL for
/// other kinds, or allocations not mapped in one piece (use
/// `ocm_copy_in`/`ocm_copy_out`).
#[no_mangle]
pub extern "C" fn ocm_localbuf(a: ocm_alloc_t) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let h = handle(a)?;
        if h.local == 0 {
            return Err(invalid(format!(
                "allocation {} is not local host memory mapped in one piece; use ocm_copy_in/ocm_copy_out",
                h.alloc.id()
            )));
        }
        Ok(h.local as *mut c_void)
    })
}

/// 1 when any byte of `a` is on another node or in a GPU an agent holds,
/// 0 when all is in this node's host memory or this process's GPU, -1 for
/// a bad handle.
#[no_mangle]
pub extern "C" fn ocm_is_remote(a: ocm_alloc_t) -> c_int {
    guard(-1, || Ok(c_int::from(handle(a)?.alloc.is_remote())))
}

/// The size of `a` in bytes (0 for a bad handle).
#[no_mangle]
pub extern "C" fn ocm_remote_sz(a: ocm_alloc_t) -> u64 {
    guard(0, || Ok(handle(a)?.alloc.size()))
}

/// The kind of `a` (`OCM_KIND_INVALID` for a bad handle).
#[no_mangle]
pub extern "C" fn ocm_kind(a: ocm_alloc_t) -> ocm_kind_t {
    guard(ocm_kind_t::OCM_KIND_INVALID, || {
        Ok(match handle(a)?.alloc.kind() {
            Kind::LocalHost => ocm_kind_t::OCM_LOCAL_HOST,
            Kind::RemoteHost => ocm_kind_t::OCM_REMOTE_HOST,
            Kind::LocalGpu => ocm_kind_t::OCM_LOCAL_GPU,
            Kind::RemoteGpu => ocm_kind_t::OCM_REMOTE_GPU,
        })
    })
}

/// What a status code means, as a static string (any `code` is fine).
#[no_mangle]
pub extern "C" fn ocm_strerror(code: c_int) -> *const c_char {
    // Under catch_unwind like every entry, though a match cannot panic; it
    // leaves the thread's last error alone.
    catch_unwind(|| liboncilla::ffi::strerror(code).as_ptr()).unwrap_or(c"internal error".as_ptr())
}

/// The status of this thread's last call (0 when it succeeded).
#[no_mangle]
pub extern "C" fn ocm_last_error() -> c_int {
    liboncilla::ffi::last_code()
}

/// The full message of this thread's last failure ("" after a success),
/// valid until this thread's next call into liboncilla.
#[no_mangle]
pub extern "C" fn ocm_last_error_message() -> *const c_char {
    liboncilla::ffi::last_message()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header's version constants are this crate's version, and
    /// `ocm_version()` says the same.
    #[test]
    fn the_version_constants_are_the_crates() {
        let parts: Vec<u32> = env!("CARGO_PKG_VERSION")
            .split('.')
            .map(|p| p.parse().unwrap_or(u32::MAX))
            .collect();
        assert_eq!(
            parts,
            [OCM_VERSION_MAJOR, OCM_VERSION_MINOR, OCM_VERSION_PATCH]
        );
        // SAFETY: ocm_version returns a NUL-terminated static string.
        let v = unsafe { std::ffi::CStr::from_ptr(ocm_version()) };
        assert_eq!(v.to_str().ok(), Some(env!("CARGO_PKG_VERSION")));
    }
}
