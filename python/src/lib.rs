//! `oncilla._oncilla`: the Python extension under the `oncilla` package
//! (`python/oncilla/__init__.py` re-exports it and adds the pure-Python
//! parts: the `Kind`/`Policy` enums, batches as futures).
//!
//! - [`session`]: `Session` (connect, alloc, attach, copy).
//! - [`allocation`]: `Allocation` (copies, free, views, placement).
//! - [`views`]: zero-copy views of an allocation's memory: NumPy's array
//!   interface, DLPack and the CUDA array interface, each keeping the
//!   allocation alive.
//! - [`buffer`]: reading and filling any buffer-protocol object in place.
//! - [`errors`]: the exception hierarchy, one class per error kind.
//! - [`spec`]: keyword arguments into an `AllocSpec`, checked once.
//! - [`bench`]: the Rust side of the Python benchmark.
//!
//! Every copy and wait runs with the GIL released. No panic crosses into
//! Python: PyO3 turns one into `PanicException`, and no code here unwraps.

mod allocation;
mod bench;
mod buffer;
mod errors;
mod mapping;
mod session;
mod spec;
mod views;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _oncilla(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<session::Session>()?;
    m.add_class::<allocation::Allocation>()?;
    m.add_class::<mapping::Mapping>()?;
    m.add_function(wrap_pyfunction!(session::connect, m)?)?;
    m.add_function(wrap_pyfunction!(bench::_rust_copy_out_seconds, m)?)?;
    m.add_function(wrap_pyfunction!(bench::_rust_copy_seconds, m)?)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
