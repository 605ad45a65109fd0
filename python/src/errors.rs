//! The exceptions Python sees: `OncillaError` and one subclass per
//! `liboncilla::Error` kind, so callers catch exactly what they handle
//! (`except oncilla.CapacityExhausted`), and each also a subclass of the
//! builtin that means the same (`InvalidArgument` is a `ValueError`,
//! `CapacityExhausted` a `MemoryError`, `PermissionDenied` a
//! `PermissionError`...), so code that knows nothing of Oncilla still
//! catches them. The classes are made when the module is imported (a
//! Rust-declared exception has one base only). The message is
//! liboncilla's, verbatim. It never decides what failed; it only names it.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyTuple, PyType};

/// Every class, in the order of [`CLASSES`].
#[derive(Debug, Clone, Copy)]
pub enum Class {
    OncillaError,
    AgentUnreachable,
    Unavailable,
    NotFound,
    CapacityExhausted,
    QuotaExceeded,
    PermissionDenied,
    InvalidArgument,
    NodeDown,
    AlreadyExists,
    InUse,
    OutOfBounds,
    NodeUnreachable,
    FabricError,
    NoGpu,
    GpuError,
    TokenError,
    InternalError,
    MapError,
}

/// Each class: its name, its Oncilla parent (`None`: the root), the
/// builtin it also is (`None`: only its Oncilla parent), and its doc.
const CLASSES: [(&str, Option<Class>, Option<&str>, &str); 19] = [
    ("OncillaError", None, Some("Exception"), "Base class of every Oncilla error."),
    ("AgentUnreachable", Some(Class::OncillaError), Some("ConnectionError"), "The local agent's socket cannot be reached (is oncillad running? ONCILLA_SOCKET)."),
    ("Unavailable", Some(Class::OncillaError), Some("ConnectionError"), "The master or another daemon could not be reached."),
    ("NotFound", Some(Class::OncillaError), Some("LookupError"), "No such allocation (unknown, or already freed)."),
    ("CapacityExhausted", Some(Class::OncillaError), Some("MemoryError"), "Not enough free memory; the message says where what is free."),
    ("QuotaExceeded", Some(Class::CapacityExhausted), None, "The request would take this user past a quota (the message names it)."),
    ("PermissionDenied", Some(Class::OncillaError), Some("PermissionError"), "Wrong credential or key, or another session's allocation."),
    ("InvalidArgument", Some(Class::OncillaError), Some("ValueError"), "A request that is malformed or cannot be met as asked."),
    ("NodeDown", Some(Class::OncillaError), Some("ConnectionError"), "A named node is down."),
    ("AlreadyExists", Some(Class::OncillaError), Some("FileExistsError"), "The name is taken by another allocation."),
    ("InUse", Some(Class::OncillaError), Some("RuntimeError"), "Other processes are attached; force_free() frees it anyway."),
    ("OutOfBounds", Some(Class::OncillaError), Some("IndexError"), "A copy outside the allocation."),
    ("NodeUnreachable", Some(Class::OncillaError), Some("ConnectionError"), "A node holding bytes of the allocation cannot be reached."),
    ("FabricError", Some(Class::OncillaError), Some("ConnectionError"), "The data path to a node failed."),
    ("NoGpu", Some(Class::OncillaError), None, "GPU memory was asked for where there is none; the message says why."),
    ("GpuError", Some(Class::OncillaError), None, "The CUDA driver failed a copy or an allocation."),
    ("TokenError", Some(Class::OncillaError), None, "A cluster token was given but cannot be used."),
    ("InternalError", Some(Class::OncillaError), Some("RuntimeError"), "A bug or an unexpected answer."),
    ("MapError", Some(Class::OncillaError), None, "Remote memory cannot be mapped here (userfaultfd not allowed, kernel too old, GPU memory), or its paging failed."),
];

/// The classes, made once at import.
static TYPES: GILOnceCell<Vec<Py<PyType>>> = GILOnceCell::new();

/// An exception of `class` saying `msg`. Before the module was imported
/// (which cannot happen from Python), a `RuntimeError`.
pub fn err(class: Class, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::with_gil(|py| match TYPES.get(py) {
        Some(types) => PyErr::from_type(types[class as usize].bind(py).clone(), (msg,)),
        None => PyRuntimeError::new_err(msg),
    })
}

/// `e` as the Python exception of its kind.
pub fn to_py(e: liboncilla::Error) -> PyErr {
    use liboncilla::Error as E;
    let class = match &e {
        E::AgentUnreachable { .. } => Class::AgentUnreachable,
        E::Unavailable(_) => Class::Unavailable,
        E::NotFound(_) => Class::NotFound,
        E::CapacityExhausted(_) => Class::CapacityExhausted,
        E::QuotaExceeded(_) => Class::QuotaExceeded,
        E::PermissionDenied(_) => Class::PermissionDenied,
        E::InvalidArgument(_) => Class::InvalidArgument,
        E::NodeDown(_) => Class::NodeDown,
        E::AlreadyExists(_) => Class::AlreadyExists,
        E::InUse(_) => Class::InUse,
        E::OutOfBounds { .. } => Class::OutOfBounds,
        E::NodeUnreachable { .. } => Class::NodeUnreachable,
        E::Fabric { .. } => Class::FabricError,
        E::NoGpu(_) => Class::NoGpu,
        E::Gpu(_) => Class::GpuError,
        E::Token(_) => Class::TokenError,
        E::Map(_) => Class::MapError,
        E::Internal(_) => Class::InternalError,
        // The enum is non-exhaustive (it may grow without a major
        // version): a kind this list does not name yet is internal.
        _ => Class::InternalError,
    };
    err(class, e.to_string())
}

/// Makes every exception class and adds it to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let builtins = py.import("builtins")?;
    let make = py.get_type::<PyType>();
    let mut made: Vec<Py<PyType>> = Vec::with_capacity(CLASSES.len());
    for (name, parent, builtin, doc) in CLASSES {
        let mut bases: Vec<Bound<'_, PyAny>> = Vec::new();
        if let Some(p) = parent {
            bases.push(made[p as usize].bind(py).clone().into_any());
        }
        if let Some(b) = builtin {
            bases.push(builtins.getattr(b)?);
        }
        let attrs = PyDict::new(py);
        attrs.set_item("__doc__", doc)?;
        attrs.set_item("__module__", "oncilla")?;
        let class = make
            .call1((name, PyTuple::new(py, bases)?, attrs))?
            .downcast_into::<PyType>()?;
        m.add(name, &class)?;
        made.push(class.unbind());
    }
    // Imported once per interpreter; a second import finds them made.
    let _ = TYPES.set(py, made);
    Ok(())
}
