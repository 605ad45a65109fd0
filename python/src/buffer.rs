//! Reading from and filling any object that exports the buffer protocol
//! (bytes, bytearray, memoryview, NumPy arrays, mmap, ...) in place: the
//! copy goes straight between the object's memory and the fabric.
//!
//! The stable ABI names `PyObject_GetBuffer` and `Py_buffer` only from
//! CPython 3.11, but both exist, with this layout, in every CPython since
//! 3.3, so one abi3 wheel for 3.9+ declares them here. Only C-contiguous
//! buffers are taken (`PyBUF_SIMPLE`): a strided NumPy view is refused by
//! its exporter with `BufferError`. This module never copies and never
//! holds a buffer past the [`Held`] that owns it.

use std::ffi::{c_char, c_int, c_void};

use pyo3::ffi;
use pyo3::prelude::*;

/// CPython's `Py_buffer` (unchanged since 3.3).
#[repr(C)]
struct PyBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

/// Contiguous bytes, no format or shape asked for.
const PYBUF_SIMPLE: c_int = 0;
/// ... and writable.
const PYBUF_WRITABLE: c_int = 0x0001;

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut PyBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut PyBuffer);
}

/// A buffer held from its exporter until dropped (with the GIL held: the
/// drop calls back into the interpreter). Not `Send`: it is made and
/// dropped on the thread that holds the GIL; only its address and length
/// travel into a GIL-free copy ([`Held::range`]).
pub struct Held<'py> {
    view: PyBuffer,
    _py: Python<'py>,
}

impl<'py> Held<'py> {
    /// Holds `obj`'s bytes to read from.
    ///
    /// # Errors
    /// `TypeError` when `obj` exports no buffer; `BufferError` when it is
    /// not contiguous.
    pub fn read(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        Self::get(obj, PYBUF_SIMPLE)
    }

    /// Holds `obj`'s bytes to fill.
    ///
    /// # Errors
    /// As [`Held::read`]; `BufferError` for a read-only object.
    pub fn write(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        Self::get(obj, PYBUF_SIMPLE | PYBUF_WRITABLE)
    }

    fn get(obj: &Bound<'py, PyAny>, flags: c_int) -> PyResult<Self> {
        let mut view = PyBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        };
        // SAFETY: `obj` is a live object and the GIL is held (`obj` is a
        // `Bound<'py, _>`); `view` is a properly laid out, writable
        // `Py_buffer` that the call fills, or leaves unowned on failure
        // (-1 with an exception set, fetched below).
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut view, flags) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(Self {
            view,
            _py: obj.py(),
        })
    }

    /// The held bytes: their address and length.
    pub fn range(&self) -> (*mut u8, usize) {
        (
            self.view.buf.cast(),
            usize::try_from(self.view.len).unwrap_or(0),
        )
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // SAFETY: `view` was filled by a successful `PyObject_GetBuffer`
        // and is released exactly once, here, with the GIL held (`Held`
        // lives inside the `'py` scope and is not `Send`).
        unsafe { PyBuffer_Release(&mut self.view) };
    }
}

/// An address and length that may cross into a GIL-free closure: the
/// caller keeps the memory alive (a [`Held`] buffer, or an allocation's
/// mapping) and unshared for the closure's whole run.
#[derive(Clone, Copy)]
pub struct Raw {
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: `Raw` is only an address; whoever makes one keeps the memory it
// names alive and out of reach of other Rust references until the closure
// that carries it returns (see each use).
unsafe impl Send for Raw {}

impl Raw {
    /// The bytes, to read.
    ///
    /// # Safety
    /// The memory must be live and not written through any Rust reference
    /// for `'a`.
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: as the caller promises.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, to fill.
    ///
    /// # Safety
    /// The memory must be live, writable, and reached through no other
    /// Rust reference for `'a`.
    pub unsafe fn bytes_mut<'a>(self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as the caller promises.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
