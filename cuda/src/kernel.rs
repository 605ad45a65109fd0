//! Kernels compiled at run time with NVRTC (loaded at run time like the
//! driver) and launched on a stream.
//!
//! Every kernel parameter is passed as a 64-bit value (`unsigned long
//! long` in the source; device pointers are cast inside the kernel), so
//! one launch path serves every kernel without per-kernel glue. This
//! module never decides what a kernel computes.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::gpu::Gpu;
use crate::CudaError;

/// A compiled kernel, ready to launch on its device.
pub struct Kernel {
    gpu: Gpu,
    func: CudaFunction,
    name: String,
}

impl Kernel {
    /// Compiles `source` (CUDA C++) and loads `name` from it.
    ///
    /// # Errors
    /// [`CudaError::Init`] when NVRTC is not installed; a compile error
    /// with NVRTC's log; driver failures.
    pub fn compile(gpu: &Gpu, source: &str, name: &str) -> Result<Self, CudaError> {
        // SAFETY: `is_culib_present` only tries to dlopen libnvrtc and
        // reports whether that worked; it calls no NVRTC function.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CudaError::Init(
                "NVRTC (libnvrtc.so) is not installed: kernels cannot be compiled".into(),
            ));
        }
        gpu.bind()?;
        let ptx = cudarc::nvrtc::compile_ptx(source)
            .map_err(|e| CudaError::Pipeline(format!("kernel {name} does not compile: {e:?}")))?;
        let module = gpu
            .context()
            .load_module(ptx)
            .map_err(|e| gpu.fail("cuModuleLoadData", e))?;
        let func = module
            .load_function(name)
            .map_err(|e| gpu.fail("cuModuleGetFunction", e))?;
        Ok(Self {
            gpu: gpu.clone(),
            func,
            name: name.to_string(),
        })
    }

    /// Queues the kernel on `stream` with `blocks` x `threads` (rounded to
    /// whole warps, at most 1024) and `args`.
    ///
    /// # Safety
    /// The kernel must take exactly `args.len()` parameters, each a 64-bit
    /// integer, and every device address among them must stay valid (and
    /// not be written by anything else) until the launch has run on
    /// `stream`.
    ///
    /// # Errors
    /// Driver failures.
    pub unsafe fn launch(
        &self,
        stream: &Arc<CudaStream>,
        blocks: u32,
        threads: u32,
        args: &[u64],
    ) -> Result<(), CudaError> {
        self.gpu.bind()?;
        let mut b = stream.launch_builder(&self.func);
        for a in args {
            b.arg(a);
        }
        // Whole warps: kernels may reduce with full-warp shuffles.
        let threads = threads.clamp(32, 1024).div_ceil(32) * 32;
        let cfg = LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the caller guarantees the parameter list matches the
        // kernel and that the addresses stay valid until it runs; `args`
        // outlives this call, which is all the driver needs of the host
        // side (it copies parameter values at launch).
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| self.gpu.fail("cuLaunchKernel", e))
            .map_err(|e| match e {
                CudaError::Driver { device, detail, .. } => CudaError::Driver {
                    device,
                    op: "cuLaunchKernel",
                    detail: format!("{}: {detail}", self.name),
                },
                other => other,
            })
    }
}
