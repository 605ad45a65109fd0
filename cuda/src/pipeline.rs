//! Moving a long range through a few reused staging buffers, two sides at
//! once: while one side works on buffer `i`, the other works on buffer
//! `i - 1`, so the whole move takes about as long as the slower side rather
//! than the sum of both.
//!
//! [`stream_in`] is the remote -> device direction: the caller's `fill`
//! (the network) writes chunk `i` into a free buffer, then the [`Sink`]
//! starts consuming it (an asynchronous copy to device memory, a kernel, or
//! a worker thread) and `fill` goes on with chunk `i + 1` in the next
//! buffer. [`stream_out`] is the device -> remote direction with a
//! [`Source`] running ahead of the caller's `drain`.
//!
//! This module owns the order of operations only: chunk planning, buffer
//! rotation, and the rule that an error stops the pipeline only after every
//! started operation has ended (no buffer is reused or released while a copy
//! still touches it). It never touches a device itself; [`crate::pinned`]
//! and [`crate::host`] implement the sides.

use std::time::{Duration, Instant};

use crate::CudaError;

/// One piece of the range being moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Position in the sequence, from 0.
    pub index: usize,
    /// Where the chunk starts in the range.
    pub offset: u64,
    /// Bytes in the chunk (at most the buffer size; only the last is shorter).
    pub len: usize,
}

/// The chunks of a `total`-byte range moved through `chunk`-byte buffers.
pub fn chunks(total: u64, chunk: usize) -> impl Iterator<Item = Chunk> {
    let step = chunk.max(1) as u64;
    (0..total.div_ceil(step)).map(move |i| {
        let offset = i * step;
        Chunk {
            index: usize::try_from(i).unwrap_or(usize::MAX),
            offset,
            // At most `step`, which came from a usize.
            len: usize::try_from((total - offset).min(step)).unwrap_or(usize::MAX),
        }
    })
}

/// The consuming side of [`stream_in`]: a ring of buffers and an
/// asynchronous step that takes a filled one.
pub trait Sink {
    /// Buffers in the ring (at least 1).
    fn slots(&self) -> usize;
    /// Bytes per buffer.
    fn slot_len(&self) -> usize;
    /// Buffer `slot`, once no started step uses it any more (blocks).
    fn slot(&mut self, slot: usize) -> Result<&mut [u8], CudaError>;
    /// Starts consuming the first `chunk.len` bytes of `slot`; may return
    /// before the step ends.
    fn submit(&mut self, slot: usize, chunk: Chunk) -> Result<(), CudaError>;
    /// Waits until every started step has ended.
    fn finish(&mut self) -> Result<(), CudaError>;
}

/// The producing side of [`stream_out`].
pub trait Source {
    /// Buffers in the ring (at least 1).
    fn slots(&self) -> usize;
    /// Bytes per buffer.
    fn slot_len(&self) -> usize;
    /// Starts producing `chunk` into `slot`; may return before it ends.
    fn start(&mut self, slot: usize, chunk: Chunk) -> Result<(), CudaError>;
    /// Buffer `slot` once what was started into it has ended (blocks).
    fn slot(&mut self, slot: usize) -> Result<&[u8], CudaError>;
    /// Waits until every started step has ended.
    fn finish(&mut self) -> Result<(), CudaError>;
}

/// Where the time of one pipeline run went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Split {
    /// In the caller's side (`fill` or `drain`: the network).
    pub caller: Duration,
    /// Blocked on the sink or source (the device side was the slower).
    pub waiting: Duration,
    pub total: Duration,
    pub bytes: u64,
    pub chunks: usize,
}

/// Moves `total` bytes: `fill(chunk, buf)` writes each chunk into a free
/// buffer, and `sink` consumes it while the next chunk is filled. Chunks
/// are filled and submitted in order.
///
/// # Errors
/// The first error of `fill` or of the sink; by then every step already
/// started has ended.
pub fn stream_in<E: From<CudaError>>(
    sink: &mut impl Sink,
    total: u64,
    mut fill: impl FnMut(Chunk, &mut [u8]) -> Result<(), E>,
) -> Result<Split, E> {
    let slots = sink.slots().max(1);
    let started = Instant::now();
    let mut split = Split::default();
    let run = (|| {
        for chunk in chunks(total, sink.slot_len()) {
            let slot = chunk.index % slots;
            let t = Instant::now();
            let buf = sink.slot(slot)?;
            split.waiting += t.elapsed();
            let t = Instant::now();
            fill(chunk, &mut buf[..chunk.len])?;
            split.caller += t.elapsed();
            sink.submit(slot, chunk)?;
            split.bytes += chunk.len as u64;
            split.chunks += 1;
        }
        Ok::<_, E>(())
    })();
    let t = Instant::now();
    let end = sink.finish();
    split.waiting += t.elapsed();
    split.total = started.elapsed();
    run?;
    end?;
    Ok(split)
}

/// Moves `total` bytes the other way: `source` produces chunks ahead into
/// its buffers (as many as it has), and `drain(chunk, bytes)` takes each in
/// order.
///
/// # Errors
/// The first error of the source or of `drain`; by then every step already
/// started has ended.
pub fn stream_out<E: From<CudaError>>(
    source: &mut impl Source,
    total: u64,
    mut drain: impl FnMut(Chunk, &[u8]) -> Result<(), E>,
) -> Result<Split, E> {
    let slots = source.slots().max(1);
    let plan: Vec<Chunk> = chunks(total, source.slot_len()).collect();
    let started = Instant::now();
    let mut split = Split::default();
    let run = (|| {
        for c in plan.iter().take(slots) {
            source.start(c.index % slots, *c)?;
        }
        for c in &plan {
            let slot = c.index % slots;
            let t = Instant::now();
            let buf = source.slot(slot)?;
            split.waiting += t.elapsed();
            let t = Instant::now();
            drain(*c, &buf[..c.len])?;
            split.caller += t.elapsed();
            split.bytes += c.len as u64;
            split.chunks += 1;
            if let Some(next) = plan.get(c.index + slots) {
                source.start(slot, *next)?;
            }
        }
        Ok::<_, E>(())
    })();
    let t = Instant::now();
    let end = source.finish();
    split.waiting += t.elapsed();
    split.total = started.elapsed();
    run?;
    end?;
    Ok(split)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{HostSink, HostSource};
    use std::sync::{Arc, Mutex};

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn chunks_tile_the_range() {
        let c: Vec<Chunk> = chunks(10, 4).collect();
        assert_eq!(
            c,
            vec![
                Chunk {
                    index: 0,
                    offset: 0,
                    len: 4
                },
                Chunk {
                    index: 1,
                    offset: 4,
                    len: 4
                },
                Chunk {
                    index: 2,
                    offset: 8,
                    len: 2
                },
            ]
        );
        assert_eq!(chunks(0, 4).count(), 0);
        assert_eq!(chunks(8, 4).count(), 2);
        assert_eq!(chunks(1, 1 << 20).next().map(|c| c.len), Some(1));
    }

    /// A "device" that is host memory: the sink's step copies the slot to
    /// its place, slowly, on the worker thread; rotation must never hand
    /// out a slot whose copy is still running, or bytes would be torn.
    #[test]
    fn stream_in_delivers_every_byte_in_place_through_a_slow_sink() {
        let src = pattern(1_000_003);
        let device = Arc::new(Mutex::new(vec![0u8; src.len()]));
        let order = Arc::new(Mutex::new(Vec::new()));
        let (dev, ord) = (Arc::clone(&device), Arc::clone(&order));
        let mut sink = HostSink::new(3, 64 * 1024, move |chunk: Chunk, bytes: &[u8]| {
            std::thread::sleep(std::time::Duration::from_micros(200));
            let at = usize::try_from(chunk.offset).unwrap();
            dev.lock().unwrap()[at..at + bytes.len()].copy_from_slice(bytes);
            ord.lock().unwrap().push(chunk.index);
            Ok(())
        });
        let split = stream_in::<CudaError>(&mut sink, src.len() as u64, |c, buf| {
            let at = usize::try_from(c.offset).unwrap();
            buf.copy_from_slice(&src[at..at + c.len]);
            Ok(())
        })
        .unwrap();
        assert_eq!(*device.lock().unwrap(), src);
        assert_eq!(split.bytes, src.len() as u64);
        assert_eq!(split.chunks, src.len().div_ceil(64 * 1024));
        let seen = order.lock().unwrap().clone();
        assert_eq!(
            seen,
            (0..split.chunks).collect::<Vec<_>>(),
            "chunks consumed in order"
        );
    }

    #[test]
    fn stream_out_reads_every_byte_in_order() {
        let device = Arc::new(pattern(777_777));
        let dev = Arc::clone(&device);
        let mut source = HostSource::new(2, 10_000, move |chunk: Chunk, buf: &mut [u8]| {
            let at = usize::try_from(chunk.offset).unwrap();
            buf.copy_from_slice(&dev[at..at + buf.len()]);
            Ok(())
        });
        let mut out = Vec::new();
        let mut last = None;
        stream_out::<CudaError>(&mut source, device.len() as u64, |c, bytes| {
            assert_eq!(c.index, last.map_or(0, |l| l + 1));
            last = Some(c.index);
            out.extend_from_slice(bytes);
            Ok(())
        })
        .unwrap();
        assert_eq!(out, *device);
    }

    #[derive(Debug, PartialEq)]
    enum TestError {
        Net(u64),
        Dev(String),
    }
    impl From<CudaError> for TestError {
        fn from(e: CudaError) -> Self {
            TestError::Dev(e.to_string())
        }
    }

    /// A failing fill stops the pipeline; steps already started still end
    /// before the error is returned (their buffers stay valid until then).
    #[test]
    fn a_fill_error_stops_after_started_steps_end() {
        let consumed = Arc::new(Mutex::new(Vec::new()));
        let c2 = Arc::clone(&consumed);
        let mut sink = HostSink::new(2, 100, move |chunk: Chunk, _: &[u8]| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            c2.lock().unwrap().push(chunk.index);
            Ok(())
        });
        let err = stream_in(&mut sink, 1000, |c, _| {
            if c.index == 4 {
                Err(TestError::Net(c.offset))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert_eq!(err, TestError::Net(400));
        assert_eq!(
            *consumed.lock().unwrap(),
            vec![0, 1, 2, 3],
            "started steps ran to their end"
        );
    }

    #[test]
    fn a_sink_error_reaches_the_caller_and_stops_filling() {
        let mut sink = HostSink::new(2, 100, |chunk: Chunk, _: &[u8]| {
            if chunk.index == 2 {
                Err(CudaError::Pipeline("device copy failed".into()))
            } else {
                Ok(())
            }
        });
        let mut filled = 0;
        let err = stream_in(&mut sink, 1000, |_, _| {
            filled += 1;
            Ok::<_, TestError>(())
        })
        .unwrap_err();
        assert_eq!(
            err,
            TestError::Dev("staging pipeline: device copy failed".into())
        );
        assert!(filled < 10, "filling stopped early ({filled} of 10 chunks)");
    }

    #[test]
    fn a_source_error_reaches_the_caller() {
        let mut source = HostSource::new(3, 100, |chunk: Chunk, _: &mut [u8]| {
            if chunk.index == 5 {
                Err(CudaError::Pipeline("device read failed".into()))
            } else {
                Ok(())
            }
        });
        let mut drained = 0;
        let err = stream_out(&mut source, 1000, |_, _| {
            drained += 1;
            Ok::<_, TestError>(())
        })
        .unwrap_err();
        assert_eq!(
            err,
            TestError::Dev("staging pipeline: device read failed".into())
        );
        assert_eq!(drained, 5, "chunks before the failing one were drained");
    }

    /// The two sides overlap: with both taking ~the same time per chunk,
    /// the run takes well under the sum of both. Counted in chunks of
    /// work, not timed against a threshold: the sink records how many
    /// fills had completed when each step started.
    #[test]
    fn fill_and_sink_overlap() {
        let fills_done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let overlapped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (fd, ov) = (Arc::clone(&fills_done), Arc::clone(&overlapped));
        let mut sink = HostSink::new(3, 10, move |chunk: Chunk, _: &[u8]| {
            std::thread::sleep(std::time::Duration::from_millis(2));
            // A fill of a later chunk finished while this step ran.
            if fd.load(std::sync::atomic::Ordering::SeqCst) > chunk.index + 1 {
                ov.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            Ok(())
        });
        stream_in::<CudaError>(&mut sink, 200, |_, _| {
            std::thread::sleep(std::time::Duration::from_millis(2));
            fills_done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        assert!(
            overlapped.load(std::sync::atomic::Ordering::SeqCst) > 0,
            "no step ever ran beside a fill"
        );
    }
}
