//! `Allocation.map()`: a remote allocation in this process's address space
//! (liboncilla's demand paging), with `flush`, `invalidate`, `unmap`, and
//! zero-copy views of it: `view()` (a memoryview), NumPy's array interface,
//! and `memoryview(m)` on CPython 3.12 and later.
//!
//! A `Mapping` holds a share of its allocation (the allocation counts
//! its live mappings: it cannot be freed while mapped), and every view of the
//! mapping keeps the `Mapping` alive, which is unmapped only when no view
//! can remain. Touching the memory never needs the GIL from the pager: its
//! threads are liboncilla's. It never pages anything itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::allocation::Allocation;
use crate::errors::{err, to_py, Class};

/// A mapped allocation (`Allocation.map()`).
#[pyclass(module = "oncilla", name = "Mapping", frozen)]
pub struct Mapping {
    /// The mapping, holding a share of the allocation until it is unmapped
    /// (then let go, so the allocation can be freed while this object
    /// lives). `None` once unmapped. Shared with a flush or invalidate
    /// running without the GIL (the lock is never held across one: a
    /// thread holding the GIL could wait on it while that call waits for
    /// the GIL).
    mapped: Mutex<Option<Arc<liboncilla::OwnedMapping>>>,
    /// The allocation's id, for messages.
    id: u64,
    /// The Python allocation, which counts this mapping as a view.
    owner: Py<Allocation>,
    /// A view of the mapped memory was handed out: it stays mapped as long
    /// as this object lives.
    exported: AtomicBool,
    /// Counted in the allocation's live mappings (until unmapped).
    counted: AtomicBool,
    len: usize,
}

impl Mapping {
    /// Maps `owner`'s allocation with `options`.
    pub fn open(
        py: Python<'_>,
        owner: &Bound<'_, Allocation>,
        options: liboncilla::MapOptions,
    ) -> PyResult<Self> {
        let handle = owner.get().handle()?;
        let id = handle.id();
        let mapped = py
            .allow_threads(move || liboncilla::OwnedMapping::new(handle, options))
            .map_err(to_py)?;
        // The allocation is not freed while this is mapped.
        owner.get().mapped();
        let len = mapped.len();
        Ok(Self {
            mapped: Mutex::new(Some(Arc::new(mapped))),
            id,
            owner: owner.clone().unbind(),
            exported: AtomicBool::new(false),
            counted: AtomicBool::new(true),
            len,
        })
    }

    /// No longer counted as a live mapping of the allocation (once).
    fn uncount(&self) {
        if self.counted.swap(false, Ordering::AcqRel) {
            self.owner.get().unmapped();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Arc<liboncilla::OwnedMapping>>> {
        // Holds only an Option: a panic elsewhere cannot leave it half-written.
        self.mapped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `(address, length)` of the mapped memory, once marked exported.
    fn exported_range(&self) -> PyResult<(usize, usize)> {
        let slot = self.lock();
        let m = slot.as_ref().ok_or_else(|| self.unmapped())?;
        self.exported.store(true, Ordering::Release);
        Ok((m.as_ptr() as usize, m.len()))
    }

    fn unmapped(&self) -> PyErr {
        err(
            Class::NotFound,
            format!(
                "allocation {} is not mapped any more (unmap() was called)",
                self.id
            ),
        )
    }

    /// `[offset, offset + length)`, `length` defaulting to the rest.
    fn span(&self, offset: u64, length: Option<u64>) -> PyResult<(u64, u64)> {
        let size = self.len as u64;
        let len = length.unwrap_or_else(|| size.saturating_sub(offset));
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(err(
                Class::InvalidArgument,
                format!("{len} bytes at offset {offset} do not fit in a mapping of {size} bytes"),
            ));
        }
        Ok((offset, len))
    }

    fn run(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&liboncilla::OwnedMapping) -> liboncilla::Result<()> + Send,
    ) -> PyResult<()> {
        let m = self.lock().clone().ok_or_else(|| self.unmapped())?;
        py.allow_threads(move || f(&m)).map_err(to_py)
    }
}

#[pymethods]
impl Mapping {
    /// Bytes mapped (the allocation's size).
    fn __len__(&self) -> usize {
        self.len
    }

    /// Writes what was written through the mapping in `[offset, offset +
    /// length)` back to the allocation: other processes see it from now on.
    #[pyo3(signature = (offset = 0, length = None))]
    fn flush(&self, py: Python<'_>, offset: u64, length: Option<u64>) -> PyResult<()> {
        let (offset, len) = self.span(offset, length)?;
        self.run(py, |m| m.flush(offset, len))
    }

    /// Drops the clean cached blocks of `[offset, offset + length)`: the
    /// next touch reads what the allocation holds then.
    #[pyo3(signature = (offset = 0, length = None))]
    fn invalidate(&self, py: Python<'_>, offset: u64, length: Option<u64>) -> PyResult<()> {
        let (offset, len) = self.span(offset, length)?;
        self.run(py, |m| m.invalidate(offset, len))
    }

    /// Writes back and unmaps now. Refused (`InUse`) once a view was handed
    /// out: the mapping then goes with this object, after its last view.
    fn unmap(&self, py: Python<'_>) -> PyResult<()> {
        if self.exported.load(Ordering::Acquire) {
            return Err(err(Class::InUse, format!(
                "the mapping of allocation {} has views (NumPy, memoryview) that may still be alive; it is unmapped with this object once they are gone",
                self.id
            )));
        }
        let mut slot = self.lock();
        let shared = slot.take().ok_or_else(|| self.unmapped())?;
        let m = match Arc::try_unwrap(shared) {
            Ok(m) => m,
            Err(shared) => {
                *slot = Some(shared);
                return Err(err(Class::InUse, format!(
                    "the mapping of allocation {} is being flushed or invalidated on another thread; unmap it once that returns",
                    self.id
                )));
            }
        };
        drop(slot);
        let outcome = py.allow_threads(move || m.unmap()).map_err(to_py);
        self.uncount();
        outcome
    }

    /// What paging has done: faults, bytes fetched and written back, blocks
    /// evicted, bytes held now.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let slot = self.lock();
        let s = slot.as_ref().map(|m| m.stats()).unwrap_or_default();
        let d = PyDict::new(py);
        d.set_item("faults", s.faults)?;
        d.set_item("fetched", s.fetched)?;
        d.set_item("written_back", s.written_back)?;
        d.set_item("evicted", s.evicted)?;
        d.set_item("resident", s.resident)?;
        Ok(d)
    }

    /// The last paging failure, or None.
    #[getter]
    fn last_error(&self) -> Option<String> {
        self.lock().as_ref().and_then(|m| m.last_error())
    }

    /// A writable memoryview of the mapped memory, with no copy; it keeps
    /// the mapping alive.
    fn view<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        memoryview(slf)
    }

    /// PEP 688 (CPython 3.12 and later): `memoryview(m)`, as `view()`.
    fn __buffer__<'py>(slf: &Bound<'py, Self>, flags: i32) -> PyResult<Bound<'py, PyAny>> {
        let _ = flags;
        memoryview(slf)
    }

    /// PEP 688: the memoryview `__buffer__` returned is released on its own.
    fn __release_buffer__(&self, view: &Bound<'_, PyAny>) {
        let _ = view;
    }

    /// NumPy's array interface: `numpy.asarray(m)` is the mapped memory
    /// (uint8), no copy; NumPy keeps this object as the array's base.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (ptr, len) = self.exported_range()?;
        crate::views::interface(py, ptr as u64, len)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Unmaps (written back), unless views were handed out: then it goes
    /// with this object.
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        if self.exported.load(Ordering::Acquire) || self.lock().is_none() {
            return Ok(false);
        }
        self.unmap(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.lock().is_some() {
            "mapped"
        } else {
            "unmapped"
        };
        format!(
            "<oncilla.Mapping of allocation {}, {} bytes, {state}>",
            self.id, self.len
        )
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Unmapped (written back), and its share of the allocation let go,
        // before the allocation may be freed.
        drop(self.lock().take());
        self.uncount();
    }
}

/// A writable memoryview over the mapped memory that holds the mapping.
fn memoryview<'py>(slf: &Bound<'py, Mapping>) -> PyResult<Bound<'py, PyAny>> {
    let (ptr, len) = slf.get().exported_range()?;
    crate::views::memoryview_of(slf.as_any(), ptr, len)
}
