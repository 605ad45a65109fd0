//! `oncilla.Allocation`: one allocation as Python holds it: copies from
//! and into any buffer-protocol object with the GIL released, free and
//! detach, the context manager, placement (`kind`, `nodes`, `extents`,
//! `repr`) and the zero-copy views ([`crate::views`]).
//!
//! Lifetimes: every view keeps this object alive (through a
//! [`views::ViewLease`]), and this object keeps the memory. While a view
//! may be alive, leaving a `with` block only closes the handle and the
//! memory is released with the object (when the last view goes), and an
//! explicit `free()` is refused rather than pull memory from under a view;
//! once the views are gone, `free()` works again. A CUDA array interface
//! cannot be followed (its consumers hold this object itself), so after
//! one only closing is left. It never frees what it did not open.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use liboncilla::{Descriptor, Oncilla};
use oncilla_model::size::HumanBytes;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::buffer::{Held, Raw};
use crate::errors::{err, to_py, Class};
use crate::mapping::Mapping;
use crate::views;

/// An allocation (see the module docs).
#[pyclass(module = "oncilla", name = "Allocation", frozen, weakref)]
pub struct Allocation {
    /// The handle; `None` once freed or detached through this object.
    slot: Mutex<Option<Arc<liboncilla::Allocation>>>,
    /// The session, for copies between allocations.
    session: Oncilla,
    /// Where the bytes are (kept for `repr` and `extents` after a free).
    desc: Descriptor,
    /// Views of the memory that may be alive ([`views::ViewLease`]s).
    views: AtomicUsize,
    /// A view whose end cannot be seen was handed out (the CUDA array
    /// interface): the memory lives as long as this object.
    pinned: AtomicBool,
    /// Freed, detached or closed through this object.
    closed: AtomicBool,
    /// A free or detach is running (the GIL released, the handle taken).
    releasing: AtomicBool,
    /// Live `Mapping`s of it (each unmapped before the memory can go).
    mappings: AtomicUsize,
}

impl Allocation {
    pub fn new(session: Oncilla, inner: liboncilla::Allocation) -> Self {
        Self {
            desc: inner.descriptor().clone(),
            slot: Mutex::new(Some(Arc::new(inner))),
            session,
            views: AtomicUsize::new(0),
            pinned: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            releasing: AtomicBool::new(false),
            mappings: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Arc<liboncilla::Allocation>>> {
        // Holds only an `Option<Arc>`: a panic elsewhere cannot leave it
        // half-written.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The open handle.
    ///
    /// # Errors
    /// `NotFound` once freed or detached through this object.
    pub fn handle(&self) -> PyResult<Arc<liboncilla::Allocation>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(self.gone());
        }
        match self.lock().clone() {
            Some(h) => Ok(h),
            None if self.releasing.load(Ordering::Acquire) => Err(err(
                Class::InUse,
                format!(
                    "allocation {} is being freed on another thread",
                    self.desc.id
                ),
            )),
            None => Err(self.gone()),
        }
    }

    fn gone(&self) -> PyErr {
        err(
            Class::NotFound,
            format!(
                "no such allocation: {} was freed or detached through this handle",
                self.desc.id
            ),
        )
    }

    /// Runs `copy` on the open handle and the bytes of `held` with the GIL
    /// released; `held` is released (the GIL back) only after it returns.
    /// A buffer that is this allocation's own memory is refused first.
    fn with_buffer(
        &self,
        py: Python<'_>,
        held: Held<'_>,
        copy: impl FnOnce(&liboncilla::Allocation, Raw) -> liboncilla::Result<()> + Send,
    ) -> PyResult<()> {
        let (ptr, len) = held.range();
        let raw = Raw { ptr, len };
        let h = self.handle()?;
        refuse_own_memory(&h, raw)?;
        let outcome = py.allow_threads(move || copy(&h, raw));
        drop(held);
        outcome.map_err(to_py)
    }

    /// The session it was opened in.
    pub fn session(&self) -> &Oncilla {
        &self.session
    }

    /// A view of the memory is about to be handed out: counted before its
    /// address is read, so nothing frees the memory under it.
    pub fn view_opened(&self) {
        self.views.fetch_add(1, Ordering::AcqRel);
    }

    /// A view's lease ended.
    pub fn view_closed(&self) {
        self.views.fetch_sub(1, Ordering::AcqRel);
    }

    /// A view whose end cannot be seen is about to be handed out: from
    /// now on the memory lives as long as this object.
    pub fn pin(&self) {
        self.pinned.store(true, Ordering::Release);
    }

    /// A `Mapping` of it was made: it is not freed until that is gone.
    pub fn mapped(&self) {
        self.mappings.fetch_add(1, Ordering::AcqRel);
    }

    /// A `Mapping` of it was unmapped.
    pub fn unmapped(&self) {
        self.mappings.fetch_sub(1, Ordering::AcqRel);
    }

    /// Frees (`force`) or detaches, or only closes the handle when views
    /// were handed out.
    fn release(&self, py: Python<'_>, how: Release) -> PyResult<()> {
        let views = self.views.load(Ordering::Acquire) > 0 || self.pinned.load(Ordering::Acquire);
        if views && how == Release::Close && self.mappings.load(Ordering::Acquire) == 0 {
            self.closed.store(true, Ordering::Release);
            return Ok(());
        }
        let inner = self.take()?;
        let persistent = inner.descriptor().owner.is_none();
        let (outcome, inner) = py.allow_threads(move || {
            let mut inner = inner;
            let outcome = match how {
                Release::Free => inner.try_free(false),
                Release::ForceFree => inner.try_free(true),
                Release::Close if persistent => return (inner.detach(), None),
                Release::Close => inner.try_free(false),
            };
            (outcome, Some(inner))
        });
        self.settle(outcome, inner)
    }

    /// The handle, taken out to be freed or detached (here, or with
    /// others by `Oncilla.free_many`): refused while it is mapped, has
    /// views, or is being copied on another thread. Hand it back with
    /// [`Self::settle`].
    ///
    /// # Errors
    /// `InUse`; `NotFound` once freed or detached through this object.
    pub fn take(&self) -> PyResult<liboncilla::Allocation> {
        if self.mappings.load(Ordering::Acquire) > 0 {
            return Err(err(Class::InUse, format!(
                "allocation {} is mapped (Allocation.map): unmap() the mapping, or let it and its views go, first",
                self.desc.id
            )));
        }
        if self.views.load(Ordering::Acquire) > 0 || self.pinned.load(Ordering::Acquire) {
            return Err(err(Class::InUse, format!(
                "allocation {} has views (NumPy, memoryview, DLPack, cuda_view) that are still alive, or handed out its own __cuda_array_interface__ (cuda_view() gives one that ends); free it once they are gone, or leave its `with` block (it is then released with this object)",
                self.desc.id
            )));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(self.gone());
        }
        let mut slot = self.lock();
        let Some(arc) = slot.take() else {
            return Err(self.gone());
        };
        match Arc::try_unwrap(arc) {
            Ok(inner) => {
                self.releasing.store(true, Ordering::Release);
                Ok(inner)
            }
            Err(arc) => {
                *slot = Some(arc);
                Err(err(Class::InUse, format!(
                    "allocation {} is being copied on another thread; free it once that copy returns",
                    self.desc.id
                )))
            }
        }
    }

    /// The handle [`Self::take`] gave, back unchanged (a batch it was in
    /// was refused): usable again.
    pub fn restore(&self, inner: liboncilla::Allocation) {
        *self.lock() = Some(Arc::new(inner));
        self.releasing.store(false, Ordering::Release);
    }

    /// A free or detach of the handle [`Self::take`] gave ended with
    /// `outcome`; `inner` is the handle where it is still open.
    pub fn settle(
        &self,
        outcome: liboncilla::Result<()>,
        inner: Option<liboncilla::Allocation>,
    ) -> PyResult<()> {
        let result = match outcome {
            Ok(()) => {
                self.closed.store(true, Ordering::Release);
                Ok(())
            }
            // Gone already (someone freed it): nothing left to keep.
            Err(e @ liboncilla::Error::NotFound(_)) => {
                self.closed.store(true, Ordering::Release);
                Err(to_py(e))
            }
            Err(e) => {
                // Refused (in use, unreachable): the handle stays usable;
                // a failed detach leaves nothing to keep.
                match inner {
                    Some(inner) => *self.lock() = Some(Arc::new(inner)),
                    None => self.closed.store(true, Ordering::Release),
                }
                Err(to_py(e))
            }
        };
        self.releasing.store(false, Ordering::Release);
        result
    }
}

impl Drop for Allocation {
    /// The last reference went (the object, or the last view of it): the
    /// allocation is freed (or detached) as liboncilla's drop does, on a
    /// thread of its own so the interpreter does not wait on the network
    /// with the GIL held.
    fn drop(&mut self) {
        let Some(handle) = self.lock().take() else {
            return;
        };
        // Where no thread can be started, the refused closure (and the
        // handle in it) is dropped right here instead.
        let _ = std::thread::Builder::new()
            .name("oncilla-release".into())
            .spawn(move || drop(handle));
    }
}

/// Copies `n` bytes from `src` at `src_offset` to `dst` at `dst_offset`
/// through `session`, with the GIL released (`Allocation.copy_from`,
/// `Session.copy`, `oncilla.copy`).
pub fn copy_between(
    py: Python<'_>,
    session: &Oncilla,
    dst: &Allocation,
    dst_offset: u64,
    src: &Allocation,
    src_offset: u64,
    n: u64,
) -> PyResult<()> {
    let (d, s) = (dst.handle()?, src.handle()?);
    let session = session.clone();
    py.allow_threads(move || session.copy(&d, dst_offset, &s, src_offset, n))
        .map_err(to_py)
}

/// Refuses a buffer that is memory of `h` itself (a view of it): the copy
/// would read and write the same bytes at once.
fn refuse_own_memory(h: &liboncilla::Allocation, buf: Raw) -> PyResult<()> {
    let Ok((ptr, len)) = h.local_range() else {
        // Not mapped in one piece: no view of it exists.
        return Ok(());
    };
    let (mine, theirs) = (ptr as usize, buf.ptr as usize);
    if buf.len > 0 && theirs < mine + len && mine < theirs + buf.len {
        return Err(err(Class::InvalidArgument, format!(
            "the buffer is memory of allocation {} itself (a view of it); copy within an allocation through a separate buffer",
            h.id()
        )));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Release {
    Free,
    ForceFree,
    /// The end of a `with` block: free a session allocation, detach a
    /// persistent one.
    Close,
}

#[pymethods]
impl Allocation {
    /// The allocation's id.
    #[getter]
    fn id(&self) -> u64 {
        self.desc.id
    }

    /// Its size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.desc.size
    }

    fn __len__(&self) -> usize {
        usize::try_from(self.desc.size).unwrap_or(usize::MAX)
    }

    /// Its kind, as an `oncilla.Kind` member.
    #[getter]
    fn kind<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("oncilla")?
            .getattr("Kind")?
            .call1((self.desc.kind.name(),))
    }

    /// Its name, for a named allocation.
    #[getter]
    fn name(&self) -> Option<String> {
        self.desc.name.clone()
    }

    /// True for a persistent (or named) allocation: it outlives this
    /// session, and leaving a `with` block detaches instead of freeing.
    #[getter]
    fn persistent(&self) -> bool {
        self.desc.owner.is_none()
    }

    /// The nodes holding its bytes, in the order of the bytes.
    #[getter]
    fn nodes(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for e in &self.desc.extents {
            if !out.contains(&e.node) {
                out.push(e.node.clone());
            }
        }
        out
    }

    /// Every extent: `offset` and `len` in the allocation, `node`, `gpu`
    /// (the device index, or None for host memory) and the `fabric` this
    /// process uses for it.
    #[getter]
    fn extents<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let fabrics = self.handle().map(|h| h.fabrics()).unwrap_or_default();
        let list = PyList::empty(py);
        for (i, e) in self.desc.extents.iter().enumerate() {
            let d = PyDict::new(py);
            d.set_item("offset", e.alloc_offset)?;
            d.set_item("len", e.len)?;
            d.set_item("node", &e.node)?;
            d.set_item("gpu", e.gpu)?;
            d.set_item("fabric", fabrics.get(i).map(ToString::to_string))?;
            list.append(d)?;
        }
        Ok(list)
    }

    fn __repr__(&self) -> String {
        let state = if self.closed.load(Ordering::Acquire) {
            ", closed"
        } else {
            ""
        };
        let name = self
            .desc
            .name
            .as_ref()
            .map_or(String::new(), |n| format!(", name={n:?}"));
        format!(
            "Allocation(id={}, size={} ({}), kind={}{name}, nodes={:?}, extents={}{state})",
            self.desc.id,
            self.desc.size,
            HumanBytes(self.desc.size),
            self.desc.kind.name(),
            self.nodes(),
            self.desc.extents.len(),
        )
    }

    /// Writes the bytes of `data` (any object with the buffer protocol)
    /// at `offset`; returns once they are visible to every later reader.
    fn copy_in(&self, py: Python<'_>, offset: u64, data: &Bound<'_, PyAny>) -> PyResult<()> {
        self.with_buffer(py, Held::read(data)?, move |h, raw| {
            // SAFETY: `with_buffer` keeps the exporter's buffer alive and
            // in place until the copy has returned; the copy only reads it.
            let bytes = unsafe { raw.bytes() };
            h.copy_in(offset, bytes)
        })
    }

    /// Reads `n` bytes at `offset` into new `bytes`.
    fn copy_out<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        n: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let h = self.handle()?;
        // Checked before the bytes object is made: a huge `n` is an error,
        // not an allocation.
        h.descriptor()
            .check_range(offset, n as u64)
            .map_err(to_py)?;
        PyBytes::new_with(py, n, |buf| {
            py.allow_threads(|| h.copy_out(offset, buf)).map_err(to_py)
        })
    }

    /// Reads `len(buffer)` bytes at `offset` into `buffer` (any writable
    /// object with the buffer protocol: bytearray, a NumPy array, ...).
    fn copy_out_into(
        &self,
        py: Python<'_>,
        offset: u64,
        buffer: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.with_buffer(py, Held::write(buffer)?, move |h, raw| {
            // SAFETY: `with_buffer` keeps the writable buffer alive and in
            // place until the copy has returned; nothing in Rust refers to
            // it meanwhile (other Python threads touching it race as they
            // would with any C extension that fills a buffer).
            let bytes = unsafe { raw.bytes_mut() };
            h.copy_out(offset, bytes)
        })
    }

    /// Copies `n` bytes from `src` at `src_offset` to this allocation at
    /// `offset`, between any two kinds (`oncilla.copy`).
    fn copy_from(
        &self,
        py: Python<'_>,
        offset: u64,
        src: &Allocation,
        src_offset: u64,
        n: u64,
    ) -> PyResult<()> {
        copy_between(py, &self.session, self, offset, src, src_offset, n)
    }

    /// Frees it now. Refused (`InUse`) while views of it may be alive, and
    /// for a persistent allocation other processes are attached to.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        self.release(py, Release::Free)
    }

    /// Frees it even while other processes are attached.
    fn force_free(&self, py: Python<'_>) -> PyResult<()> {
        self.release(py, Release::ForceFree)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Frees a session allocation, detaches a persistent one; with views
    /// alive, only closes the handle (the memory goes with the last view).
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        if self.closed.load(Ordering::Acquire) {
            return Ok(false);
        }
        self.release(py, Release::Close)?;
        Ok(false)
    }

    /// Maps the allocation into this process (remote memory is fetched in
    /// blocks as it is touched; see `Mapping`). Keyword arguments override
    /// liboncilla's defaults: `block` and `read_ahead` and `budget` in
    /// bytes, `timeout` in seconds, `threads`. While mapped, the allocation
    /// cannot be freed.
    #[pyo3(signature = (*, block=None, read_ahead=None, budget=None, timeout=None, threads=None))]
    fn map(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        block: Option<u64>,
        read_ahead: Option<u64>,
        budget: Option<u64>,
        timeout: Option<f64>,
        threads: Option<usize>,
    ) -> PyResult<Mapping> {
        let mut o = liboncilla::MapOptions::default();
        if let Some(b) = block {
            o = o.block(b);
        }
        if let Some(r) = read_ahead {
            o = o.read_ahead(r);
        }
        if let Some(b) = budget {
            o = o.budget(b);
        }
        if let Some(t) = timeout {
            let t = std::time::Duration::try_from_secs_f64(t).map_err(|_| {
                err(
                    Class::InvalidArgument,
                    format!("timeout {t} is not a duration in seconds"),
                )
            })?;
            o = o.timeout(t);
        }
        if let Some(n) = threads {
            o = o.threads(n);
        }
        Mapping::open(py, slf, o)
    }

    /// A writable `memoryview` of a local host allocation's memory, with
    /// no copy (the agent's pool, mapped here); it keeps the allocation
    /// alive.
    fn view<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        views::memoryview(slf)
    }

    /// PEP 688 (CPython 3.12 and later): `memoryview(alloc)` of a local
    /// host allocation, as [`Allocation::view`].
    fn __buffer__<'py>(slf: &Bound<'py, Self>, flags: i32) -> PyResult<Bound<'py, PyAny>> {
        let _ = flags;
        views::memoryview(slf)
    }

    /// PEP 688: the memoryview `__buffer__` returned is released on its own.
    fn __release_buffer__(&self, view: &Bound<'_, PyAny>) {
        let _ = view;
    }

    /// NumPy: `numpy.asarray(alloc)` is a view of a local host
    /// allocation's memory (uint8), no copy (`copy=True` copies).
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        views::numpy_array(slf, dtype, copy)
    }

    /// DLPack: `torch.from_dlpack(alloc)` (GPU memory of this process) or
    /// `numpy.from_dlpack(alloc)` (local host memory), no copy.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, max_version);
        views::dlpack(slf, dl_device, copy)
    }

    /// `(device type, device id)` as DLPack names them.
    fn __dlpack_device__(slf: &Bound<'_, Self>) -> PyResult<(i32, i32)> {
        views::dlpack_device(slf)
    }

    /// A view of a local GPU allocation's memory for CUDA consumers (CuPy,
    /// Numba, `torch.as_tensor`): an object with the CUDA array interface
    /// (uint8, no copy) that those consumers keep. The allocation can be
    /// freed once the view and what was made from it are gone.
    fn cuda_view<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, views::ViewLease>> {
        views::cuda_view(slf)
    }

    /// The CUDA array interface of a local GPU allocation (CuPy, Numba,
    /// PyTorch): its device memory as uint8, no copy. Nothing says when
    /// its consumers are done, so the memory is then kept as long as this
    /// object; `cuda_view()` gives a view that ends.
    #[getter]
    fn __cuda_array_interface__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        views::cuda_array_interface(slf)
    }
}
