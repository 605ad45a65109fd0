//! Zero-copy views of an allocation's memory in this process: a
//! `memoryview` and NumPy's array interface for local host memory (the
//! agent's pool, mapped here), DLPack for both (`kDLCPU` / `kDLCUDA`), and
//! the CUDA array interface for local GPU memory.
//!
//! Every view holds a [`ViewLease`], which holds the Python `Allocation`
//! (the memoryview through the ctypes array it wraps, NumPy arrays as
//! their base, DLPack through the capsule's context) and counts in it
//! from before the view's address is read until the lease is collected:
//! the allocation never releases the memory while a view remains, and
//! may again once they are gone. `alloc.cuda_view()` is such a lease with
//! the CUDA array interface: its consumers (CuPy, Numba, PyTorch) keep the
//! object they read the interface from. The allocation's own
//! `__cuda_array_interface__` is read off the allocation itself, whose
//! consumers' lives it cannot see, so it pins the memory for the object's
//! life instead ([`Allocation::pin`]). It never copies (but for
//! `numpy.asarray(alloc, copy=True)`).

use std::ffi::{c_void, CStr};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::allocation::Allocation;
use crate::errors::{err, to_py, Class};

/// DLPack's device types.
const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;

/// Where the memory is in this process.
enum Memory {
    Host { ptr: usize, len: usize },
    Device { ptr: u64, len: usize, index: u32 },
}

impl Memory {
    fn device(&self) -> (i32, i32) {
        match self {
            Memory::Host { .. } => (KDL_CPU, 0),
            Memory::Device { index, .. } => (KDL_CUDA, i32::try_from(*index).unwrap_or(i32::MAX)),
        }
    }
}

/// What a view needs: host or device memory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Host,
    Device,
    Either,
}

/// Finds `a`'s memory for a view of the kind `want`; marks nothing.
fn locate(a: &Allocation, want: Want, what: &str) -> PyResult<Memory> {
    let h = a.handle()?;
    if let Some(dev) = h.device_mem() {
        if want == Want::Host {
            return Err(err(Class::InvalidArgument, format!(
                "allocation {} is GPU memory: it has no {what}; use __dlpack__ or __cuda_array_interface__",
                h.id()
            )));
        }
        let ptr = dev.device_ptr(0).map_err(|e| to_py(e.into()))?;
        let len = usize::try_from(dev.len()).unwrap_or(usize::MAX);
        return Ok(Memory::Device {
            ptr,
            len,
            index: dev.gpu().index(),
        });
    }
    if want == Want::Device {
        return Err(err(Class::InvalidArgument, format!(
            "allocation {} is not local GPU memory: it has no {what}; local host memory has __array_interface__ and view()",
            h.id()
        )));
    }
    let (ptr, len) = h.local_range().map_err(to_py)?;
    Ok(Memory::Host {
        ptr: ptr as usize,
        len,
    })
}

/// What a view holds instead of the allocation itself: the allocation
/// (alive as long as the view), counted in it as a view while this lives
/// (see the module docs), and the memory's place, which NumPy reads
/// through its array interface (host memory) and CUDA consumers through
/// theirs (GPU memory).
#[pyclass(module = "oncilla", name = "_ViewLease", frozen)]
pub struct ViewLease {
    alloc: Py<Allocation>,
    ptr: usize,
    len: usize,
    device: bool,
}

#[pymethods]
impl ViewLease {
    /// NumPy's array interface (version 3) of host memory, uint8.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.device {
            return Err(err(
                Class::InvalidArgument,
                "a view of GPU memory has no __array_interface__; use __cuda_array_interface__",
            ));
        }
        interface(py, self.ptr as u64, self.len)
    }

    /// The CUDA array interface (version 3) of GPU memory, uint8.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if !self.device {
            return Err(err(
                Class::InvalidArgument,
                "a view of host memory has no __cuda_array_interface__; use __array_interface__",
            ));
        }
        cuda_interface(py, self.ptr as u64, self.len)
    }
}

impl Drop for ViewLease {
    fn drop(&mut self) {
        self.alloc.get().view_closed();
    }
}

/// [`locate`], for a view about to be handed out: once every check has
/// passed, the view is counted in `slf` (nothing frees the memory under
/// it from then on), and the address read after that. The GIL is held
/// from here until the view is returned. The lease ends the count when
/// it is collected.
fn leased<'py>(
    slf: &Bound<'py, Allocation>,
    want: Want,
    what: &str,
) -> PyResult<(Bound<'py, ViewLease>, Memory)> {
    let a = slf.get();
    locate(a, want, what)?;
    a.view_opened();
    let memory = match locate(a, want, what) {
        Ok(m) => m,
        Err(e) => {
            a.view_closed();
            return Err(e);
        }
    };
    let (ptr, len, device) = match memory {
        Memory::Host { ptr, len } => (ptr, len, false),
        Memory::Device { ptr, len, .. } => (usize::try_from(ptr).unwrap_or(usize::MAX), len, true),
    };
    // A lease that cannot be made is dropped, ending the count.
    let lease = Bound::new(
        slf.py(),
        ViewLease {
            alloc: slf.clone().unbind(),
            ptr,
            len,
            device,
        },
    )?;
    Ok((lease, memory))
}

fn host_only<'py>(
    slf: &Bound<'py, Allocation>,
    what: &str,
) -> PyResult<(Bound<'py, ViewLease>, usize, usize)> {
    match leased(slf, Want::Host, what)? {
        (lease, Memory::Host { ptr, len }) => Ok((lease, ptr, len)),
        (_, Memory::Device { .. }) => Err(err(
            Class::InvalidArgument,
            format!("no {what} for GPU memory"),
        )),
    }
}

/// A writable `memoryview` over local host memory: a ctypes array at the
/// mapping's address that holds a lease on the allocation.
pub fn memoryview<'py>(slf: &Bound<'py, Allocation>) -> PyResult<Bound<'py, PyAny>> {
    let (lease, ptr, len) = host_only(slf, "memoryview")?;
    memoryview_of(lease.as_any(), ptr, len)
}

/// A writable `memoryview` of the `len` bytes at `ptr`, which live as long
/// as `owner`: a ctypes array at that address that holds `owner`.
pub fn memoryview_of<'py>(
    owner: &Bound<'py, PyAny>,
    ptr: usize,
    len: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let py = owner.py();
    let ctypes = py.import("ctypes")?;
    let array = ctypes
        .getattr("c_ubyte")?
        .mul(len)?
        .call_method1("from_address", (ptr,))?;
    array.setattr("_oncilla_owner", owner)?;
    // ctypes says "<B"; cast to plain "B" so slices can be assigned.
    py.import("builtins")?
        .getattr("memoryview")?
        .call1((array,))?
        .call_method1("cast", ("B",))
}

/// `numpy.asarray(alloc)`: an array over local host memory whose base is
/// a lease on the allocation (or, `copy=True`, a copy of it).
pub fn numpy_array<'py>(
    slf: &Bound<'py, Allocation>,
    dtype: Option<Bound<'py, PyAny>>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let (lease, _, _) = host_only(slf, "NumPy array")?;
    let numpy = slf.py().import("numpy")?;
    let kwargs = PyDict::new(slf.py());
    kwargs.set_item("dtype", dtype)?;
    if copy == Some(true) {
        kwargs.set_item("copy", true)?;
        return numpy.call_method("array", (lease,), Some(&kwargs));
    }
    numpy.call_method("asarray", (lease,), Some(&kwargs))
}

/// The array interface (NumPy's, and the CUDA one's common part; version
/// 3) of `len` writable bytes (uint8) at `ptr`.
pub fn interface(py: Python<'_>, ptr: u64, len: usize) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", (len,))?;
    d.set_item("typestr", "|u1")?;
    d.set_item("data", (ptr, false))?;
    d.set_item("strides", py.None())?;
    d.set_item("version", 3)?;
    Ok(d)
}

/// The CUDA array interface (version 3) of `len` bytes of device memory
/// at `ptr`. Copies into it are synchronous, so no stream needs waiting on.
fn cuda_interface(py: Python<'_>, ptr: u64, len: usize) -> PyResult<Bound<'_, PyDict>> {
    let d = interface(py, ptr, len)?;
    d.set_item("stream", py.None())?;
    Ok(d)
}

/// `alloc.cuda_view()`: a lease on local GPU memory that carries the CUDA
/// array interface; the allocation may be freed once it is collected.
pub fn cuda_view<'py>(slf: &Bound<'py, Allocation>) -> PyResult<Bound<'py, ViewLease>> {
    Ok(leased(slf, Want::Device, "CUDA array interface")?.0)
}

/// The CUDA array interface (version 3) over local GPU memory, read off
/// the allocation itself: it pins the memory for the object's life.
pub fn cuda_array_interface<'py>(slf: &Bound<'py, Allocation>) -> PyResult<Bound<'py, PyDict>> {
    let a = slf.get();
    locate(a, Want::Device, "CUDA array interface")?;
    a.pin();
    let Memory::Device { ptr, len, .. } = locate(a, Want::Device, "CUDA array interface")? else {
        return Err(err(
            Class::InvalidArgument,
            "only a local GPU allocation has a CUDA array interface",
        ));
    };
    cuda_interface(slf.py(), ptr, len)
}

/// `__dlpack_device__`.
pub fn dlpack_device(slf: &Bound<'_, Allocation>) -> PyResult<(i32, i32)> {
    // A query: it hands out nothing, so it marks nothing.
    Ok(locate(slf.get(), Want::Either, "DLPack device")?.device())
}

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// A DLPack tensor with what it points at: its shape and the allocation
/// it keeps alive. `tensor` first, so the tensor's address is the box's.
#[repr(C)]
struct Managed {
    tensor: DLManagedTensor,
    shape: [i64; 1],
    owner: Option<Py<ViewLease>>,
}

const DLTENSOR: &CStr = c"dltensor";
/// DLPack's unsigned integer type code.
const KDL_UINT: u8 = 1;

/// `__dlpack__`: a "dltensor" capsule over the memory (uint8, one
/// dimension), never a copy.
pub fn dlpack<'py>(
    slf: &Bound<'py, Allocation>,
    dl_device: Option<Bound<'py, PyAny>>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    if copy == Some(true) {
        return Err(PyBufferError::new_err(
            "oncilla exports its memory without copying; copy=True is not supported",
        ));
    }
    if let Some(want) = dl_device {
        let want: (i32, i32) = want.extract()?;
        let here = locate(slf.get(), Want::Either, "DLPack tensor")?.device();
        if want != here {
            return Err(PyBufferError::new_err(format!(
                "allocation is on DLPack device {here:?}, asked for {want:?}; copy it with oncilla.copy first"
            )));
        }
    }
    let (lease, memory) = leased(slf, Want::Either, "DLPack tensor")?;
    let (data, len) = match memory {
        Memory::Host { ptr, len } => (ptr as *mut c_void, len),
        // A device address, carried as a pointer as DLPack does.
        Memory::Device { ptr, len, .. } => (ptr as usize as *mut c_void, len),
    };
    let (device_type, device_id) = memory.device();
    let mut managed = Box::new(Managed {
        tensor: DLManagedTensor {
            dl_tensor: DLTensor {
                data,
                device: DLDevice {
                    device_type,
                    device_id,
                },
                ndim: 1,
                dtype: DLDataType {
                    code: KDL_UINT,
                    bits: 8,
                    lanes: 1,
                },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_managed),
        },
        shape: [i64::try_from(len).unwrap_or(i64::MAX)],
        owner: Some(lease.unbind()),
    });
    // The box's contents never move: these point into it.
    managed.tensor.dl_tensor.shape = managed.shape.as_mut_ptr();
    let raw = Box::into_raw(managed);
    // SAFETY: `raw` is a live, exclusively owned box.
    unsafe { (*raw).tensor.manager_ctx = raw.cast() };
    // SAFETY: the GIL is held; `raw` points at a `Managed` whose first
    // field is the `DLManagedTensor` DLPack consumers read; the name is a
    // static C string; the destructor frees it unless a consumer took it
    // (renamed "used_dltensor", whose deleter the consumer calls).
    let capsule =
        unsafe { ffi::PyCapsule_New(raw.cast(), DLTENSOR.as_ptr(), Some(capsule_destructor)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so the box is still ours.
        drop(unsafe { Box::from_raw(raw) });
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new, owned reference returned by PyCapsule_New.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

/// The tensor's deleter: drops the box (and with it the reference to the
/// allocation) with the GIL held; consumers call it from any thread. After
/// the interpreter has finalized (a consumer's tensor freed at exit) the
/// box is leaked: there is no Python left to release the reference to.
unsafe extern "C" fn delete_managed(tensor: *mut DLManagedTensor) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: every tensor handed out is the first field of a `Managed`
    // boxed in `dlpack`, whose address `manager_ctx` holds; DLPack calls the
    // deleter once.
    let managed = unsafe { Box::from_raw((*tensor).manager_ctx.cast::<Managed>()) };
    // SAFETY: a query the C API allows at any time, GIL or not.
    if unsafe { ffi::Py_IsInitialized() } == 0 {
        std::mem::forget(managed);
        return;
    }
    // No panic may leave this C callback.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Python::with_gil(|_| drop(managed));
    }));
}

/// The capsule's destructor: a capsule no consumer took still owns its
/// tensor.
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by the interpreter with the GIL held on a capsule;
    // only an untaken one still carries the name "dltensor", and then its
    // pointer is the tensor `dlpack` made.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let tensor =
                ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr()).cast::<DLManagedTensor>();
            if !tensor.is_null() {
                if let Some(delete) = (*tensor).deleter {
                    delete(tensor);
                }
            }
        }
    }
}
