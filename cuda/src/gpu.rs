//! The node's CUDA devices and memory on them.
//!
//! A [`Gpu`] is one device's primary context; [`DeviceMem`] is a range of
//! its memory, freed when dropped, with synchronous copies to and from host
//! memory and other device memory. Every call makes the device's context
//! current on the calling thread first, so any thread may use any value.
//! This module never calls the driver before [`crate::driver`] succeeded
//! (every way in goes through [`crate::device_count`]).

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};

use crate::CudaError;

/// One device as `ocmctl nodes` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    /// Device memory in bytes.
    pub total: u64,
    /// Free device memory in bytes when asked.
    pub free: u64,
}

/// Every device of this node with its memory.
///
/// # Errors
/// As [`crate::driver`]; a device that cannot be opened.
pub fn gpus() -> Result<Vec<GpuInfo>, CudaError> {
    let n = crate::device_count()?;
    (0..n).map(|i| Gpu::open(i)?.info()).collect()
}

/// One device (its primary context). Cheap to clone.
#[derive(Clone)]
pub struct Gpu {
    index: u32,
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("index", &self.index).finish()
    }
}

impl Gpu {
    /// Opens device `index`.
    ///
    /// # Errors
    /// As [`crate::driver`]; [`CudaError::NoSuchDevice`].
    pub fn open(index: u32) -> Result<Self, CudaError> {
        let count = crate::device_count()?;
        if index >= count {
            return Err(CudaError::NoSuchDevice { index, count });
        }
        let ctx = CudaContext::new(index as usize)
            .map_err(|e| fail(index, "cuDevicePrimaryCtxRetain", e))?;
        Ok(Self { index, ctx })
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    /// The context, for code that launches kernels on this device.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Makes this device's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| fail(self.index, "cuCtxSetCurrent", e))
    }

    pub(crate) fn fail(&self, op: &'static str, e: DriverError) -> CudaError {
        fail(self.index, op, e)
    }

    /// Name and memory of the device.
    ///
    /// # Errors
    /// Driver failures.
    pub fn info(&self) -> Result<GpuInfo, CudaError> {
        let name = self
            .ctx
            .name()
            .map_err(|e| self.fail("cuDeviceGetName", e))?;
        let (free, total) = self
            .ctx
            .mem_get_info()
            .map_err(|e| self.fail("cuMemGetInfo", e))?;
        Ok(GpuInfo {
            index: self.index,
            name,
            total: total as u64,
            free: free as u64,
        })
    }

    /// `len` bytes of device memory, zeroed (memory handed to a tenant never
    /// shows a previous tenant's bytes).
    ///
    /// # Errors
    /// [`CudaError::OutOfMemory`] with what is free; driver failures.
    pub fn alloc(&self, len: u64) -> Result<DeviceMem, CudaError> {
        let bytes = usize::try_from(len.max(1)).map_err(|_| CudaError::OutOfMemory {
            device: self.index,
            requested: len,
            free: 0,
        })?;
        self.bind()?;
        // SAFETY: the context is current on this thread (bind); cuMemAlloc
        // only returns a new device address or an error.
        let ptr = match unsafe { result::malloc_sync(bytes) } {
            Ok(p) => p,
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let free = self.info().map_or(0, |i| i.free);
                return Err(CudaError::OutOfMemory {
                    device: self.index,
                    requested: len,
                    free,
                });
            }
            Err(e) => return Err(self.fail("cuMemAlloc", e)),
        };
        let mem = DeviceMem {
            gpu: self.clone(),
            ptr,
            len,
        };
        // SAFETY: `ptr` is a fresh allocation of `bytes` bytes in this
        // context, which is current. cuMemsetD8 may return before it ends:
        // wait, so nothing (on any stream) sees the old bytes.
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }
            .and_then(|()| null_sync())
            .map_err(|e| self.fail("cuMemsetD8", e))?;
        Ok(mem)
    }
}

/// Waits for the current context's legacy default stream: the "sync"
/// driver copies and memsets may return before the device is done (from
/// pageable memory, device to device), and a copy on another stream must
/// never overtake them.
fn null_sync() -> Result<(), DriverError> {
    // SAFETY: the null stream of the current context always exists;
    // waiting for it has no other effect.
    unsafe { result::stream::synchronize(result::stream::null()) }
}

fn fail(device: u32, op: &'static str, e: DriverError) -> CudaError {
    CudaError::Driver {
        device,
        op,
        detail: format!("{e:?}"),
    }
}

/// A range of device memory, freed on drop.
pub struct DeviceMem {
    gpu: Gpu,
    ptr: sys::CUdeviceptr,
    len: u64,
}

impl std::fmt::Debug for DeviceMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMem")
            .field("device", &self.gpu.index)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl DeviceMem {
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The device address of byte `offset` (for kernel arguments).
    ///
    /// # Errors
    /// [`CudaError::OutOfBounds`] past the end.
    pub fn device_ptr(&self, offset: u64) -> Result<sys::CUdeviceptr, CudaError> {
        self.check(offset, 0)?;
        Ok(self.ptr + offset)
    }

    /// What to register with an HCA for GPUDirect RDMA: the device address
    /// of the allocation and its length rounded up to the host page
    /// (cuMemAlloc hands out whole 2 MiB device pages, so the rounding
    /// stays inside memory this allocation owns).
    pub fn rdma_range(&self) -> (u64, usize) {
        let len = usize::try_from(self.len.max(1).next_multiple_of(4096)).unwrap_or(usize::MAX);
        (self.ptr, len)
    }

    /// A dma-buf exporting [`DeviceMem::rdma_range`], for HCAs that register
    /// device memory that way (`ibv_reg_dmabuf_mr`) instead of through
    /// nvidia-peermem.
    ///
    /// # Errors
    /// The driver or the device cannot export dma-bufs (CUDA before 11.7,
    /// a kernel without dma-buf support, an unsupported device).
    pub fn dmabuf(&self) -> Result<std::os::fd::OwnedFd, CudaError> {
        use std::os::fd::FromRawFd;
        self.gpu.bind()?;
        let (addr, len) = self.rdma_range();
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: the range is this live allocation (page-rounded inside
        // its device pages), its context is current, and `fd` is a valid
        // place for the driver to write one file descriptor.
        unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&raw mut fd).cast(),
                addr,
                len,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        }
        .result()
        .map_err(|e| self.gpu.fail("cuMemGetHandleForAddressRange", e))?;
        if fd < 0 {
            return Err(self.gpu.fail(
                "cuMemGetHandleForAddressRange",
                DriverError(sys::CUresult::CUDA_ERROR_UNKNOWN),
            ));
        }
        // SAFETY: the driver just opened `fd` for us and nothing else owns it.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    /// Checks that `[offset, offset + len)` lies inside.
    pub fn check(&self, offset: u64, len: u64) -> Result<(), CudaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(CudaError::OutOfBounds {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// Copies `src` to `offset`; returns when the bytes are on the device.
    ///
    /// # Errors
    /// Out of bounds; driver failures.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), CudaError> {
        // SAFETY: `src` is a live host slice of exactly the length copied,
        // borrowed for the whole call.
        unsafe { self.write_from(offset, src.as_ptr(), src.len()) }
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    ///
    /// # Errors
    /// Out of bounds; driver failures.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), CudaError> {
        // SAFETY: `dst` is a live host slice of exactly the length copied,
        // exclusively borrowed for the whole call.
        unsafe { self.read_into(offset, dst.as_mut_ptr(), dst.len()) }
    }

    /// Copies `len` bytes of host memory at `src` to `offset`; returns when
    /// the bytes are on the device. From memory registered with the driver
    /// ([`crate::hostreg`]) or page-locked this is one DMA; from pageable
    /// memory the driver stages it.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes until this returns
    /// (memory other processes write meanwhile yields some mix of their
    /// bytes, as any copy of shared memory does).
    ///
    /// # Errors
    /// Out of bounds; driver failures.
    pub unsafe fn write_from(
        &self,
        offset: u64,
        src: *const u8,
        len: usize,
    ) -> Result<(), CudaError> {
        self.check(offset, len as u64)?;
        self.gpu.bind()?;
        // SAFETY: the destination range lies inside this allocation
        // (checked) and the context that owns it is current; `src` is
        // readable for `len` bytes until we return (the caller's
        // contract), and we return only once the copy has ended.
        unsafe { sys::cuMemcpyHtoD_v2(self.ptr + offset, src.cast(), len) }
            .result()
            .and_then(|()| null_sync())
            .map_err(|e| self.gpu.fail("cuMemcpyHtoD", e))
    }

    /// Copies `len` bytes from `offset` into host memory at `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes until this returns,
    /// and not read through a Rust reference meanwhile.
    ///
    /// # Errors
    /// Out of bounds; driver failures.
    pub unsafe fn read_into(&self, offset: u64, dst: *mut u8, len: usize) -> Result<(), CudaError> {
        self.check(offset, len as u64)?;
        self.gpu.bind()?;
        // SAFETY: the source range lies inside this allocation (checked),
        // its context is current, and `dst` is writable for `len` bytes
        // until we return (the caller's contract); cuMemcpyDtoH returns
        // once the bytes are in host memory.
        unsafe { sys::cuMemcpyDtoH_v2(dst.cast(), self.ptr + offset, len) }
            .result()
            .map_err(|e| self.gpu.fail("cuMemcpyDtoH", e))
    }

    /// Copies `len` bytes from `src` at `src_offset` to `dst_offset` here,
    /// on the device (or between devices, peer to peer through the driver).
    ///
    /// # Errors
    /// Out of bounds; overlapping ranges of one allocation (the driver's
    /// copy is undefined for those); driver failures.
    pub fn copy_from(
        &self,
        dst_offset: u64,
        src: &DeviceMem,
        src_offset: u64,
        len: u64,
    ) -> Result<(), CudaError> {
        self.check(dst_offset, len)?;
        src.check(src_offset, len)?;
        let bytes = usize::try_from(len).map_err(|_| CudaError::OutOfBounds {
            offset: dst_offset,
            len,
            size: self.len,
        })?;
        let (d, s) = (self.ptr + dst_offset, src.ptr + src_offset);
        if d < s + len && s < d + len && len > 0 && self.gpu.index == src.gpu.index {
            return Err(CudaError::Overlap {
                dst: dst_offset,
                src: src_offset,
                len,
            });
        }
        self.gpu.bind()?;
        if self.gpu.index == src.gpu.index {
            // SAFETY: both ranges lie inside live allocations of the current
            // context (checked above) and do not overlap (checked above).
            unsafe { result::memcpy_dtod_sync(d, s, bytes) }
                .and_then(|()| null_sync())
                .map_err(|e| self.gpu.fail("cuMemcpyDtoD", e))
        } else {
            let stream = result::stream::null();
            // SAFETY: both ranges lie inside live allocations of their own
            // contexts (checked above); the copy is on the null stream of
            // the current context and is waited for before returning, so
            // neither allocation can be freed while it runs.
            unsafe {
                result::memcpy_peer_async(
                    self.gpu.ctx.cu_ctx(),
                    self.ptr + dst_offset,
                    src.gpu.ctx.cu_ctx(),
                    src.ptr + src_offset,
                    bytes,
                    stream,
                )
                .and_then(|()| result::stream::synchronize(stream))
            }
            .map_err(|e| self.gpu.fail("cuMemcpyPeer", e))
        }
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.bind() {
            tracing::warn!(error = %e, "cannot free device memory");
            return;
        }
        // SAFETY: `ptr` came from cuMemAlloc in this context and is freed
        // once; cuMemFree waits for work still using it.
        if let Err(e) = unsafe { result::free_sync(self.ptr) } {
            tracing::warn!(error = %self.gpu.fail("cuMemFree", e), "cannot free device memory");
        }
    }
}
