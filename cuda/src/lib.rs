//! GPU support for Oncilla. The CUDA driver is loaded at run time (cudarc's
//! dynamic loading), so every binary runs on machines without a GPU and
//! reports that plainly instead of failing to start.
//!
//! This crate owns every call into the CUDA driver; nothing else in the
//! workspace touches cudarc. It must never call the driver before checking
//! that the driver library is present (cudarc panics otherwise).

/// Why GPU memory is not available.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no GPU: the CUDA driver library (libcuda.so) is not installed on this node")]
    NoDriver,
    #[error("no GPU: the CUDA driver failed to start: {0}")]
    Init(String),
}

/// Number of CUDA devices on this node.
///
/// # Errors
/// [`CudaError::NoDriver`] where there is no driver, [`CudaError::Init`]
/// when the driver is present but cannot be initialised (no device, driver
/// and library mismatch, ...).
pub fn device_count() -> Result<u32, CudaError> {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library and
    // reports whether it succeeded; it calls no driver function.
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !present {
        return Err(CudaError::NoDriver);
    }
    cudarc::driver::result::init().map_err(|e| CudaError::Init(e.to_string()))?;
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
