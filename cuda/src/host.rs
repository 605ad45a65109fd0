//! The host-memory side of the staging pipeline: the step that a device
//! would run asynchronously runs on a worker thread instead. Used where
//! there is no GPU (the streaming example's CPU path scans chunks on the
//! worker while the network fills the next buffer) and to test the pipeline
//! with real concurrency on machines without a device.
//!
//! Buffers move by ownership: a submitted buffer is sent to the worker and
//! comes back when its step has ended, so the caller can never touch a
//! buffer that is in use. This module never calls the CUDA driver.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use crate::pipeline::{Chunk, Sink, Source};
use crate::CudaError;

struct Job {
    slot: usize,
    chunk: Chunk,
    buf: Vec<u8>,
}

struct Done {
    slot: usize,
    buf: Vec<u8>,
    outcome: Result<(), CudaError>,
}

/// The ring and the worker shared by [`HostSink`] and [`HostSource`].
struct Ring<F> {
    /// `None` while the buffer is with the worker.
    bufs: Vec<Option<Vec<u8>>>,
    /// What the last step on each slot ended with, until reported.
    errors: Vec<Option<CudaError>>,
    slot_len: usize,
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    worker: Option<JoinHandle<F>>,
}

impl<F: Send + 'static> Ring<F> {
    fn new(
        slots: usize,
        slot_len: usize,
        mut step: F,
        run: fn(&mut F, Chunk, &mut [u8]) -> Result<(), CudaError>,
    ) -> Self {
        let slots = slots.max(1);
        let (jobs, rx) = channel::<Job>();
        let (tx, done) = channel::<Done>();
        let worker = std::thread::Builder::new()
            .name("oncilla-stage".into())
            .spawn(move || {
                for mut job in rx {
                    let outcome = run(&mut step, job.chunk, &mut job.buf);
                    let back = Done {
                        slot: job.slot,
                        buf: job.buf,
                        outcome,
                    };
                    if tx.send(back).is_err() {
                        break;
                    }
                }
                step
            });
        // Without a worker every step fails with the reason; the buffers
        // stay home, so nothing waits forever.
        let (jobs, worker, spawn_error) = match worker {
            Ok(w) => (Some(jobs), Some(w), None),
            Err(e) => (
                None,
                None,
                Some(CudaError::Pipeline(format!(
                    "cannot start the staging thread: {e}"
                ))),
            ),
        };
        Self {
            bufs: (0..slots).map(|_| Some(vec![0u8; slot_len])).collect(),
            errors: (0..slots).map(|_| spawn_error.clone()).collect(),
            slot_len,
            jobs,
            done,
            worker,
        }
    }

    fn send(&mut self, slot: usize, chunk: Chunk) -> Result<(), CudaError> {
        self.home(slot)?;
        let buf = self.bufs[slot]
            .take()
            .ok_or_else(|| CudaError::Pipeline(format!("slot {slot} is in use")))?;
        let job = Job { slot, chunk, buf };
        let sent = match &self.jobs {
            Some(jobs) => jobs.send(job).map_err(|e| e.0),
            None => Err(job),
        };
        sent.map_err(|job| {
            // The worker ended (it panicked): keep the buffer, report it.
            self.bufs[job.slot] = Some(job.buf);
            CudaError::Pipeline("the staging thread ended unexpectedly".into())
        })
    }

    /// Waits until `slot`'s buffer is back; reports the error of its last
    /// step once.
    fn home(&mut self, slot: usize) -> Result<(), CudaError> {
        let slot = slot % self.bufs.len();
        while self.bufs[slot].is_none() {
            let done = self
                .done
                .recv()
                .map_err(|_| CudaError::Pipeline("the staging thread ended unexpectedly".into()))?;
            if let Err(e) = done.outcome {
                self.errors[done.slot] = Some(e);
            }
            self.bufs[done.slot] = Some(done.buf);
        }
        match self.errors[slot].take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits for every buffer; the first error not yet reported.
    fn finish(&mut self) -> Result<(), CudaError> {
        let mut first = None;
        for slot in 0..self.bufs.len() {
            if let Err(e) = self.home(slot) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn into_step(mut self) -> Result<F, CudaError> {
        self.finish()?;
        self.jobs = None;
        self.worker
            .take()
            .ok_or_else(|| CudaError::Pipeline("the staging thread never started".into()))?
            .join()
            .map_err(|_| CudaError::Pipeline("the staging thread panicked".into()))
    }
}

impl<F> Drop for Ring<F> {
    fn drop(&mut self) {
        // Closing the job channel ends the worker after its current step.
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// A [`Sink`] whose step, `step(chunk, bytes)`, runs on a worker thread.
pub struct HostSink<F> {
    ring: Ring<F>,
}

impl<F> HostSink<F>
where
    F: FnMut(Chunk, &[u8]) -> Result<(), CudaError> + Send + 'static,
{
    /// `slots` buffers of `slot_len` bytes each.
    pub fn new(slots: usize, slot_len: usize, step: F) -> Self {
        fn run<F: FnMut(Chunk, &[u8]) -> Result<(), CudaError>>(
            f: &mut F,
            c: Chunk,
            buf: &mut [u8],
        ) -> Result<(), CudaError> {
            f(c, &buf[..c.len.min(buf.len())])
        }
        Self {
            ring: Ring::new(slots, slot_len, step, run::<F>),
        }
    }

    /// Waits for every step and gives back the step (with what it gathered).
    ///
    /// # Errors
    /// The first step error not yet reported; a worker that panicked.
    pub fn into_step(self) -> Result<F, CudaError> {
        self.ring.into_step()
    }
}

impl<F> Sink for HostSink<F>
where
    F: FnMut(Chunk, &[u8]) -> Result<(), CudaError> + Send + 'static,
{
    fn slots(&self) -> usize {
        self.ring.bufs.len()
    }

    fn slot_len(&self) -> usize {
        self.ring.slot_len
    }

    fn slot(&mut self, slot: usize) -> Result<&mut [u8], CudaError> {
        self.ring.home(slot)?;
        // An error of any earlier step stops the run at once.
        if let Some(e) = self.ring.errors.iter_mut().find_map(Option::take) {
            return Err(e);
        }
        let n = self.ring.bufs.len();
        self.ring.bufs[slot % n]
            .as_deref_mut()
            .ok_or_else(|| CudaError::Pipeline(format!("slot {slot} is in use")))
    }

    fn submit(&mut self, slot: usize, chunk: Chunk) -> Result<(), CudaError> {
        self.ring.send(slot % self.ring.bufs.len(), chunk)
    }

    fn finish(&mut self) -> Result<(), CudaError> {
        self.ring.finish()
    }
}

/// A [`Source`] whose step, `step(chunk, buf)`, fills a buffer on a worker
/// thread.
pub struct HostSource<F> {
    ring: Ring<F>,
}

impl<F> HostSource<F>
where
    F: FnMut(Chunk, &mut [u8]) -> Result<(), CudaError> + Send + 'static,
{
    /// `slots` buffers of `slot_len` bytes each.
    pub fn new(slots: usize, slot_len: usize, step: F) -> Self {
        fn run<F: FnMut(Chunk, &mut [u8]) -> Result<(), CudaError>>(
            f: &mut F,
            c: Chunk,
            buf: &mut [u8],
        ) -> Result<(), CudaError> {
            let n = c.len.min(buf.len());
            f(c, &mut buf[..n])
        }
        Self {
            ring: Ring::new(slots, slot_len, step, run::<F>),
        }
    }
}

impl<F> Source for HostSource<F>
where
    F: FnMut(Chunk, &mut [u8]) -> Result<(), CudaError> + Send + 'static,
{
    fn slots(&self) -> usize {
        self.ring.bufs.len()
    }

    fn slot_len(&self) -> usize {
        self.ring.slot_len
    }

    fn start(&mut self, slot: usize, chunk: Chunk) -> Result<(), CudaError> {
        self.ring.send(slot % self.ring.bufs.len(), chunk)
    }

    fn slot(&mut self, slot: usize) -> Result<&[u8], CudaError> {
        self.ring.home(slot)?;
        let n = self.ring.bufs.len();
        self.ring.bufs[slot % n]
            .as_deref()
            .ok_or_else(|| CudaError::Pipeline(format!("slot {slot} is in use")))
    }

    fn finish(&mut self) -> Result<(), CudaError> {
        self.ring.finish()
    }
}
