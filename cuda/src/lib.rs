//! GPU support for Oncilla. The CUDA driver is loaded at run time (cudarc's
//! dynamic loading), so every binary runs on machines without a GPU and
//! reports that plainly ("no CUDA driver on this node") instead of failing
//! to start.
//!
//! This crate owns every call into the CUDA driver; nothing else in the
//! workspace touches cudarc. It must never call the driver before
//! [`driver`] said the driver library is present (cudarc panics otherwise).
//!
//! - [`gpu`]: the node's devices ([`gpus`], [`Gpu`]) and device memory
//!   ([`DeviceMem`]).
//! - [`pipeline`]: moving a long range through a few reused host staging
//!   buffers, the network filling one while the device drains another.
//! - [`pinned`]: the CUDA side of that pipeline (page-locked buffers, a
//!   stream, an event per buffer).
//! - [`host`]: the host-memory side of the same pipeline (a worker thread
//!   instead of a device), used where there is no GPU.
//! - [`hostreg`]: host memory registered with the driver once and kept
//!   ([`hostreg::PinCache`]), so copies between it and a device are one
//!   DMA.
//! - [`kernel`]: kernels compiled at run time with NVRTC.

pub mod gpu;
pub mod host;
pub mod hostreg;
pub mod kernel;
pub mod pinned;
pub mod pipeline;

use std::sync::OnceLock;

pub use gpu::{gpus, DeviceMem, Gpu, GpuInfo};

/// Why a GPU operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    #[error("no GPU: no CUDA driver on this node (libcuda.so could not be loaded)")]
    NoDriver,
    #[error("no GPU: the CUDA driver failed to start: {0}")]
    Init(String),
    #[error("no GPU {index} on this node ({count} device(s))")]
    NoSuchDevice { index: u32, count: u32 },
    #[error("GPU {device}: out of device memory: {requested} bytes asked, {free} free")]
    OutOfMemory {
        device: u32,
        requested: u64,
        free: u64,
    },
    #[error("GPU {device}: {op} failed: {detail}")]
    Driver {
        device: u32,
        op: &'static str,
        detail: String,
    },
    #[error("GPU copy out of bounds: {len} bytes at {offset} of a {size}-byte buffer")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
    #[error("GPU copy of {len} bytes from offset {src} to offset {dst} of the same memory overlaps; copy through another allocation")]
    Overlap { dst: u64, src: u64, len: u64 },
    #[error("staging pipeline: {0}")]
    Pipeline(String),
}

/// Loads the driver and initialises it, once per process; every later call
/// returns the first outcome.
///
/// # Errors
/// [`CudaError::NoDriver`] where libcuda is not installed,
/// [`CudaError::Init`] when `cuInit` fails (no device, driver and library
/// mismatch, ...).
pub fn driver() -> Result<(), CudaError> {
    static STATE: OnceLock<Result<(), CudaError>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            // SAFETY: `is_culib_present` only tries to dlopen the driver
            // library and reports whether it succeeded; it calls no driver
            // function.
            let present = unsafe { cudarc::driver::sys::is_culib_present() };
            if !present {
                return Err(CudaError::NoDriver);
            }
            cudarc::driver::result::init().map_err(|e| CudaError::Init(e.to_string()))
        })
        .clone()
}

/// Number of CUDA devices on this node.
///
/// # Errors
/// As [`driver`].
pub fn device_count() -> Result<u32, CudaError> {
    driver()?;
    let n =
        cudarc::driver::result::device::get_count().map_err(|e| CudaError::Init(e.to_string()))?;
    u32::try_from(n).map_err(|_| CudaError::Init(format!("driver reported {n} devices")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs everywhere: on a GPU node it counts devices, elsewhere it must
    /// say "no GPU" rather than panic.
    #[test]
    fn counts_or_says_no_gpu() {
        match device_count() {
            Ok(n) => println!("found {n} CUDA device(s)"),
            Err(e) => {
                assert!(e.to_string().starts_with("no GPU"), "{e}");
                println!("skipped GPU check: {e}");
            }
        }
    }
}
