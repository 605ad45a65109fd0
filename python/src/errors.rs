//! The exceptions Python sees: `OncillaError` and one subclass per
//! `liboncilla::Error` kind, so callers catch exactly what they handle
//! (`except oncilla.CapacityExhausted`). The message is liboncilla's,
//! verbatim. It never decides what failed; it only names it.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    oncilla,
    OncillaError,
    PyException,
    "Base class of every Oncilla error."
);
create_exception!(
    oncilla,
    AgentUnreachable,
    OncillaError,
    "The local agent's socket cannot be reached (is oncillad running? ONCILLA_SOCKET)."
);
create_exception!(
    oncilla,
    Unavailable,
    OncillaError,
    "The master or another daemon could not be reached."
);
create_exception!(
    oncilla,
    NotFound,
    OncillaError,
    "No such allocation (unknown, or already freed)."
);
create_exception!(
    oncilla,
    CapacityExhausted,
    OncillaError,
    "Not enough free memory; the message says where what is free."
);
create_exception!(
    oncilla,
    QuotaExceeded,
    CapacityExhausted,
    "The request would take this user past a quota (the message names it)."
);
create_exception!(
    oncilla,
    PermissionDenied,
    OncillaError,
    "Wrong credential or key, or another session's allocation."
);
create_exception!(
    oncilla,
    InvalidArgument,
    OncillaError,
    "A request that is malformed or cannot be met as asked."
);
create_exception!(oncilla, NodeDown, OncillaError, "A named node is down.");
create_exception!(
    oncilla,
    AlreadyExists,
    OncillaError,
    "The name is taken by another allocation."
);
create_exception!(
    oncilla,
    InUse,
    OncillaError,
    "Other processes are attached; force_free() frees it anyway."
);
create_exception!(
    oncilla,
    OutOfBounds,
    OncillaError,
    "A copy outside the allocation."
);
create_exception!(
    oncilla,
    NodeUnreachable,
    OncillaError,
    "A node holding bytes of the allocation cannot be reached."
);
create_exception!(
    oncilla,
    FabricError,
    OncillaError,
    "The data path to a node failed."
);
create_exception!(
    oncilla,
    NoGpu,
    OncillaError,
    "GPU memory was asked for where there is none; the message says why."
);
create_exception!(
    oncilla,
    GpuError,
    OncillaError,
    "The CUDA driver failed a copy or an allocation."
);
create_exception!(
    oncilla,
    TokenError,
    OncillaError,
    "No usable cluster token."
);
create_exception!(
    oncilla,
    InternalError,
    OncillaError,
    "A bug or an unexpected answer."
);

create_exception!(
    oncilla,
    MapError,
    OncillaError,
    "Remote memory cannot be mapped here (userfaultfd not allowed, kernel too old, GPU memory), or its paging failed."
);

/// `e` as the Python exception of its kind.
pub fn to_py(e: liboncilla::Error) -> PyErr {
    use liboncilla::Error as E;
    let msg = e.to_string();
    match e {
        E::AgentUnreachable { .. } => AgentUnreachable::new_err(msg),
        E::Unavailable(_) => Unavailable::new_err(msg),
        E::NotFound(_) => NotFound::new_err(msg),
        E::CapacityExhausted(_) => CapacityExhausted::new_err(msg),
        E::QuotaExceeded(_) => QuotaExceeded::new_err(msg),
        E::PermissionDenied(_) => PermissionDenied::new_err(msg),
        E::InvalidArgument(_) => InvalidArgument::new_err(msg),
        E::NodeDown(_) => NodeDown::new_err(msg),
        E::AlreadyExists(_) => AlreadyExists::new_err(msg),
        E::InUse(_) => InUse::new_err(msg),
        E::OutOfBounds { .. } => OutOfBounds::new_err(msg),
        E::NodeUnreachable { .. } => NodeUnreachable::new_err(msg),
        E::Fabric { .. } => FabricError::new_err(msg),
        E::NoGpu(_) => NoGpu::new_err(msg),
        E::Gpu(_) => GpuError::new_err(msg),
        E::Token(_) => TokenError::new_err(msg),
        E::Map(_) => MapError::new_err(msg),
        E::Internal(_) => InternalError::new_err(msg),
    }
}

/// Adds every exception class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("OncillaError", py.get_type::<OncillaError>())?;
    m.add("AgentUnreachable", py.get_type::<AgentUnreachable>())?;
    m.add("Unavailable", py.get_type::<Unavailable>())?;
    m.add("NotFound", py.get_type::<NotFound>())?;
    m.add("CapacityExhausted", py.get_type::<CapacityExhausted>())?;
    m.add("QuotaExceeded", py.get_type::<QuotaExceeded>())?;
    m.add("PermissionDenied", py.get_type::<PermissionDenied>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("NodeDown", py.get_type::<NodeDown>())?;
    m.add("AlreadyExists", py.get_type::<AlreadyExists>())?;
    m.add("InUse", py.get_type::<InUse>())?;
    m.add("OutOfBounds", py.get_type::<OutOfBounds>())?;
    m.add("NodeUnreachable", py.get_type::<NodeUnreachable>())?;
    m.add("FabricError", py.get_type::<FabricError>())?;
    m.add("NoGpu", py.get_type::<NoGpu>())?;
    m.add("GpuError", py.get_type::<GpuError>())?;
    m.add("TokenError", py.get_type::<TokenError>())?;
    m.add("MapError", py.get_type::<MapError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    Ok(())
}
