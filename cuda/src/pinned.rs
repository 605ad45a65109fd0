//! The CUDA side of the staging pipeline: a ring of page-locked host
//! buffers (`cuMemHostAlloc`), one CUDA stream, and an event per buffer.
//! A copy between a buffer and device memory is queued on the stream and
//! the buffer's event recorded after it; the buffer is handed out again
//! only once that event has completed, so the network never writes into a
//! buffer the DMA engine is still reading (or reads one it is still
//! writing).
//!
//! Its copies run on the device's legacy default stream, so they are
//! ordered with every other copy and memset of [`DeviceMem`].
//!
//! A ring is made once per device and reused by every copy (allocating
//! page-locked memory costs milliseconds). This module owns those buffers;
//! it never decides chunk order (that is [`crate::pipeline`]).

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaEvent, CudaStream};

use crate::gpu::{DeviceMem, Gpu};
use crate::pipeline::{Chunk, Sink, Source};
use crate::CudaError;

struct Buffer {
    ptr: *mut u8,
    len: usize,
    /// Recorded on the stream after the last copy that uses the buffer.
    done: CudaEvent,
}

/// Page-locked staging buffers on one device's stream.
pub struct PinnedRing {
    gpu: Gpu,
    stream: Arc<CudaStream>,
    bufs: Vec<Buffer>,
}

// SAFETY: the raw buffer pointers are owned by the ring (allocated in `new`,
// freed in `drop`) and only reached through `&mut self`, so moving the ring
// to another thread moves sole access with it; the CUDA handles it holds are
// usable from any thread once their context is bound (every method binds).
unsafe impl Send for PinnedRing {}

impl PinnedRing {
    /// `slots` page-locked buffers of `slot_len` bytes on `gpu`.
    ///
    /// # Errors
    /// Driver failures (page-locked memory is limited by the driver and by
    /// `ulimit -l`).
    pub fn new(gpu: &Gpu, slots: usize, slot_len: usize) -> Result<Self, CudaError> {
        gpu.bind()?;
        // The legacy default stream, not a new non-blocking one: the
        // pipeline needs only host/device overlap, and on this stream its
        // copies stay ordered after every other driver call on the device
        // (zeroing a fresh allocation, DeviceMem's copies).
        let stream = gpu.context().default_stream();
        let mut ring = Self {
            gpu: gpu.clone(),
            stream,
            bufs: Vec::with_capacity(slots.max(1)),
        };
        for _ in 0..slots.max(1) {
            let done = gpu
                .context()
                .new_event(None)
                .map_err(|e| gpu.fail("cuEventCreate", e))?;
            // SAFETY: the device's context is current (bind above);
            // cuMemHostAlloc returns a new page-locked allocation of
            // `slot_len` bytes or an error. The ring frees it in `drop`.
            let ptr = unsafe { result::malloc_host(slot_len.max(1), 0) }
                .map_err(|e| gpu.fail("cuMemHostAlloc", e))?;
            ring.bufs.push(Buffer {
                ptr: ptr.cast(),
                len: slot_len.max(1),
                done,
            });
        }
        Ok(ring)
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The stream the ring's copies run on: work queued on it after a
    /// [`Sink::submit`] runs after that copy (kernels on a staged chunk).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn slots(&self) -> usize {
        self.bufs.len()
    }

    pub fn slot_len(&self) -> usize {
        self.bufs.first().map_or(0, |b| b.len)
    }

    /// Buffer `slot` once every copy queued on it has ended.
    ///
    /// # Errors
    /// Driver failures (a failed copy shows here).
    pub fn wait_slot(&mut self, slot: usize) -> Result<&mut [u8], CudaError> {
        let n = self.bufs.len();
        let b = &self.bufs[slot % n];
        b.done
            .synchronize()
            .map_err(|e| self.gpu.fail("cuEventSynchronize", e))?;
        // SAFETY: the buffer is a live page-locked allocation of `len`
        // bytes owned by the ring; its event completed, so no queued copy
        // reads or writes it any more, and `&mut self` makes this the only
        // reference until the next call.
        Ok(unsafe { std::slice::from_raw_parts_mut(b.ptr, b.len) })
    }

    /// Queues a copy of the first `len` bytes of `slot` to `dst` at `at`;
    /// the slot is handed out again once the copy has run.
    ///
    /// # Errors
    /// Out of bounds; a length above the buffer's; driver failures.
    pub fn upload_slot(
        &mut self,
        slot: usize,
        len: usize,
        dst: &DeviceMem,
        at: u64,
    ) -> Result<(), CudaError> {
        let (b, device) = self.staged(slot, len, dst, at)?;
        // SAFETY: the source is the first `len` bytes of a live page-locked
        // buffer (checked against its length by `staged`); the destination
        // range lies inside `dst` (checked). The buffer is not handed out
        // again before its event, recorded right after this copy, completes
        // (`wait_slot`), and `drop` synchronises the stream before freeing
        // it. `dst` is freed with cuMemFree, which waits for queued work.
        let queued = unsafe {
            let src = std::slice::from_raw_parts(b.ptr, len);
            result::memcpy_htod_async(device, src, self.stream.cu_stream())
        };
        self.record(b, queued, "cuMemcpyHtoDAsync")
    }

    /// Queues a copy of `len` bytes of `src` at `at` into `slot`; the slot
    /// is handed out once the copy has run.
    ///
    /// # Errors
    /// Out of bounds; a length above the buffer's; driver failures.
    pub fn download_slot(
        &mut self,
        slot: usize,
        len: usize,
        src: &DeviceMem,
        at: u64,
    ) -> Result<(), CudaError> {
        let (b, device) = self.staged(slot, len, src, at)?;
        // SAFETY: as in `upload_slot`, with the buffer as the destination:
        // nothing reads it before its event completes (`wait_slot`).
        let queued = unsafe {
            let dst = std::slice::from_raw_parts_mut(b.ptr, len);
            result::memcpy_dtoh_async(dst, device, self.stream.cu_stream())
        };
        self.record(b, queued, "cuMemcpyDtoHAsync")
    }

    /// The checks both copy directions make: `[at, at + len)` inside `mem`,
    /// `len` within the slot's buffer, the context current. Returns the
    /// buffer and the device address of `at`.
    fn staged(
        &self,
        slot: usize,
        len: usize,
        mem: &DeviceMem,
        at: u64,
    ) -> Result<(&Buffer, sys::CUdeviceptr), CudaError> {
        mem.check(at, len as u64)?;
        self.gpu.bind()?;
        let b = &self.bufs[slot % self.bufs.len()];
        if len > b.len {
            return Err(CudaError::Pipeline(format!(
                "{len} bytes do not fit a {}-byte staging buffer",
                b.len
            )));
        }
        Ok((b, mem.device_ptr(at)?))
    }

    /// Records the buffer's event after a copy was queued (or reports why
    /// queueing it failed).
    fn record(
        &self,
        b: &Buffer,
        queued: Result<(), cudarc::driver::DriverError>,
        op: &'static str,
    ) -> Result<(), CudaError> {
        queued.map_err(|e| self.gpu.fail(op, e))?;
        b.done
            .record(&self.stream)
            .map_err(|e| self.gpu.fail("cuEventRecord", e))
    }

    /// Waits for every queued copy.
    ///
    /// # Errors
    /// Driver failures.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(|e| self.gpu.fail("cuStreamSynchronize", e))
    }

    /// A [`Sink`] that copies each chunk to `dst` at `at + chunk.offset`.
    pub fn upload<'a>(&'a mut self, dst: &'a DeviceMem, at: u64) -> Upload<'a> {
        Upload {
            ring: self,
            dst,
            at,
        }
    }

    /// A [`Source`] that copies each chunk from `src` at `at + chunk.offset`.
    pub fn download<'a>(&'a mut self, src: &'a DeviceMem, at: u64) -> Download<'a> {
        Download {
            ring: self,
            src,
            at,
        }
    }
}

impl Drop for PinnedRing {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.bind().and_then(|()| self.synchronize()) {
            // Freeing buffers a copy may still use would be unsound: keep them.
            tracing::warn!(error = %e, "staging ring not drained; leaking its page-locked buffers");
            return;
        }
        for b in &self.bufs {
            // SAFETY: allocated with cuMemHostAlloc in `new`, freed once;
            // the stream is drained, so no copy uses it.
            if let Err(e) = unsafe { result::free_host(b.ptr.cast()) } {
                tracing::warn!(error = %self.gpu.fail("cuMemFreeHost", e), "cannot free a staging buffer");
            }
        }
    }
}

/// Host -> device side of [`crate::pipeline::stream_in`].
pub struct Upload<'a> {
    ring: &'a mut PinnedRing,
    dst: &'a DeviceMem,
    at: u64,
}

impl Sink for Upload<'_> {
    fn slots(&self) -> usize {
        self.ring.slots()
    }

    fn slot_len(&self) -> usize {
        self.ring.slot_len()
    }

    fn slot(&mut self, slot: usize) -> Result<&mut [u8], CudaError> {
        self.ring.wait_slot(slot)
    }

    fn submit(&mut self, slot: usize, chunk: Chunk) -> Result<(), CudaError> {
        self.ring
            .upload_slot(slot, chunk.len, self.dst, self.at + chunk.offset)
    }

    fn finish(&mut self) -> Result<(), CudaError> {
        self.ring.synchronize()
    }
}

/// Device -> host side of [`crate::pipeline::stream_out`].
pub struct Download<'a> {
    ring: &'a mut PinnedRing,
    src: &'a DeviceMem,
    at: u64,
}

impl Source for Download<'_> {
    fn slots(&self) -> usize {
        self.ring.slots()
    }

    fn slot_len(&self) -> usize {
        self.ring.slot_len()
    }

    fn start(&mut self, slot: usize, chunk: Chunk) -> Result<(), CudaError> {
        self.ring
            .download_slot(slot, chunk.len, self.src, self.at + chunk.offset)
    }

    fn slot(&mut self, slot: usize) -> Result<&[u8], CudaError> {
        self.ring.wait_slot(slot).map(|b| &*b)
    }

    fn finish(&mut self) -> Result<(), CudaError> {
        self.ring.synchronize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{stream_in, stream_out};

    /// Runs on a GPU node; elsewhere prints one line and passes.
    #[test]
    fn pinned_pipeline_round_trips_through_the_device() {
        let gpu = match Gpu::open(0) {
            Ok(g) => g,
            Err(e) => {
                println!("skipped GPU pipeline test: {e}");
                return;
            }
        };
        let len = 10 * 1024 * 1024 + 17;
        let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mem = gpu.alloc(len as u64).expect("device memory");
        let mut ring = PinnedRing::new(&gpu, 3, 1 << 20).expect("pinned ring");
        stream_in::<CudaError>(&mut ring.upload(&mem, 0), len as u64, |c, buf| {
            let at = c.offset as usize;
            buf.copy_from_slice(&src[at..at + c.len]);
            Ok(())
        })
        .expect("upload");
        let mut back = Vec::with_capacity(len);
        stream_out::<CudaError>(&mut ring.download(&mem, 0), len as u64, |_, bytes| {
            back.extend_from_slice(bytes);
            Ok(())
        })
        .expect("download");
        assert_eq!(back, src);
        let mut other = gpu.alloc(len as u64).expect("device memory");
        other
            .copy_from(0, &mem, 0, len as u64)
            .expect("device to device");
        let mut tail = vec![0u8; 1000];
        other.read(len as u64 - 1000, &mut tail).expect("read");
        assert_eq!(tail, src[len - 1000..]);
        assert!(
            other.read(len as u64, &mut tail).is_err(),
            "out of bounds is refused"
        );
        other = gpu.alloc(8).expect("device memory");
        assert_eq!(other.len(), 8);
        println!(
            "GPU pipeline round trip on {:?}: ok",
            gpu.info().map(|i| i.name)
        );
    }
}
