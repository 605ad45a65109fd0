//! The Rust side of `python/bench/copy_bench.py`: `copy_out` of the same
//! allocation through the Rust API, timed in Rust, so the benchmark puts
//! Python's `copy_out_into` beside it in one run. Measurement only.

use std::time::Instant;

use pyo3::prelude::*;

use crate::allocation::Allocation;
use crate::errors::to_py;

/// Seconds each of `repeat` Rust `copy_out`s of `n` bytes at `offset` of
/// `alloc` took, into one buffer that an untimed first copy faulted in
/// (as Python's reused array is), GIL released.
#[pyfunction]
pub fn _rust_copy_out_seconds(
    py: Python<'_>,
    alloc: &Allocation,
    offset: u64,
    n: usize,
    repeat: usize,
) -> PyResult<Vec<f64>> {
    let h = alloc.handle()?;
    py.allow_threads(move || {
        let mut buf = vec![0u8; n];
        h.copy_out(offset, &mut buf)?;
        let mut out = Vec::with_capacity(repeat);
        for _ in 0..repeat {
            let started = Instant::now();
            h.copy_out(offset, &mut buf)?;
            out.push(started.elapsed().as_secs_f64());
        }
        Ok(out)
    })
    .map_err(to_py)
}

/// Seconds each of `repeat` Rust `Oncilla::copy`s of `n` bytes from `src`
/// to `dst` (offset 0) took, GIL released.
#[pyfunction]
pub fn _rust_copy_seconds(
    py: Python<'_>,
    dst: &Allocation,
    src: &Allocation,
    n: u64,
    repeat: usize,
) -> PyResult<Vec<f64>> {
    let (d, s) = (dst.handle()?, src.handle()?);
    let session = dst.session().clone();
    py.allow_threads(move || {
        let mut out = Vec::with_capacity(repeat);
        for _ in 0..repeat {
            let started = Instant::now();
            session.copy(&d, 0, &s, 0, n)?;
            out.push(started.elapsed().as_secs_f64());
        }
        Ok(out)
    })
    .map_err(to_py)
}
