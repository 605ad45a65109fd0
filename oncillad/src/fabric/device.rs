//! Device copies in the agent: a request's bytes move between its
//! connection and device memory (`REMOTE_GPU` extents) through a
//! page-locked staging ring, the device copy of one buffer overlapping the
//! network's transfer of the next ([`oncilla_cuda::pipeline`]), so serving
//! device memory costs about what serving pool memory costs. Reads, writes
//! and pulls into device memory all take this one path.
//!
//! It owns the agent's staging rings ([`Rings`]: a bounded set per GPU,
//! made on first use, each lent to one request for its duration) and the
//! order of a request's steps: when the reply header may leave, how much of
//! a refused write's payload is still on the connection. It never
//! authorizes (the data server did), never frames a reply itself (it is
//! handed the header and the socket's calls), and never touches pool
//! memory.

use std::collections::HashMap;
use std::io;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use oncilla_cuda::pinned::PinnedRing;
use oncilla_cuda::pipeline::{self, Chunk, Sink, Source};
use oncilla_cuda::{CudaError, Gpu};

/// Buffers in a ring: the network fills one while the device drains
/// another and a third waits, so neither side idles on a hiccup.
pub const RING_SLOTS: usize = 3;
/// Bytes per buffer: 4 MiB, so that a driver call's fixed cost (about
/// 10 µs, more where other processes' contexts share the GPU) is well
/// under 1% of its transfer and a pull fetches its source in few requests;
/// a request smaller than a buffer uses only what it needs, and a large
/// one's first buffer is off the device in under 0.1 ms at PCIe speed.
pub const SLOT_LEN: usize = 4 << 20;
/// Most rings per GPU (each request holds one): 8 × 12 MiB page-locked,
/// made only as concurrent device requests need them.
pub const RINGS_PER_GPU: usize = 8;
/// How long a request waits for a ring when all of its GPU's are lent,
/// before it is refused ("busy").
pub const RING_WAIT: Duration = Duration::from_secs(10);

/// Staging rings by GPU index, made by `make` on first need, at most
/// `limit` per GPU, reused by every later request.
pub struct Rings<R> {
    make: Box<dyn Fn(u32) -> Result<R, CudaError> + Send + Sync>,
    limit: usize,
    state: Mutex<HashMap<u32, Pool<R>>>,
    returned: Condvar,
}

struct Pool<R> {
    free: Vec<R>,
    made: usize,
}

/// The agent's rings of page-locked buffers on each device.
pub type StagingRings = Rings<PinnedRing>;

/// The agent's staging rings: one set for reads and writes, another for
/// pulls into device memory. A pull holds its ring while its source
/// serves the read (which may take a ring of this very GPU), so pulls
/// never wait on a ring only another pull could give back.
pub struct DeviceRings {
    pub serve: StagingRings,
    pub pulls: StagingRings,
}

impl DeviceRings {
    /// Rings of [`RING_SLOTS`] page-locked buffers of [`SLOT_LEN`] bytes,
    /// [`RINGS_PER_GPU`] of each kind per GPU at most.
    pub fn new() -> Self {
        let pinned = |gpu| PinnedRing::new(&Gpu::open(gpu)?, RING_SLOTS, SLOT_LEN);
        Self {
            serve: Rings::new(RINGS_PER_GPU, pinned),
            pulls: Rings::new(RINGS_PER_GPU, pinned),
        }
    }
}

impl Default for DeviceRings {
    fn default() -> Self {
        Self::new()
    }
}

impl<R> Rings<R> {
    pub fn new(
        limit: usize,
        make: impl Fn(u32) -> Result<R, CudaError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            make: Box::new(make),
            limit: limit.max(1),
            state: Mutex::new(HashMap::new()),
            returned: Condvar::new(),
        }
    }

    /// A ring of `gpu` for one request: a free one, a new one while fewer
    /// than the limit exist, else the first one returned within `wait`.
    ///
    /// # Errors
    /// Making a ring failed (the driver's page-locked memory); every ring
    /// stayed lent for `wait`.
    pub fn take(&self, gpu: u32, wait: Duration) -> Result<Lent<'_, R>, CudaError> {
        let until = Instant::now() + wait;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let pool = state.entry(gpu).or_insert_with(|| Pool {
                free: Vec::new(),
                made: 0,
            });
            if let Some(ring) = pool.free.pop() {
                return Ok(self.lend(gpu, ring));
            }
            if pool.made < self.limit {
                pool.made += 1;
                drop(state);
                // Made outside the lock: page-locking takes milliseconds.
                return match (self.make)(gpu) {
                    Ok(ring) => Ok(self.lend(gpu, ring)),
                    Err(e) => {
                        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(pool) = state.get_mut(&gpu) {
                            pool.made -= 1;
                        }
                        drop(state);
                        // Its place is free: a waiter may make one now.
                        self.returned.notify_all();
                        Err(e)
                    }
                };
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CudaError::Pipeline(format!(
                    "GPU {gpu}: all {} staging rings busy for {} s; try again",
                    self.limit,
                    wait.as_secs()
                )));
            }
            state = self
                .returned
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn lend(&self, gpu: u32, ring: R) -> Lent<'_, R> {
        Lent {
            rings: self,
            gpu,
            ring: Some(ring),
        }
    }

    /// Rings made for `gpu` so far (lent or free).
    pub fn made(&self, gpu: u32) -> usize {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.get(&gpu).map_or(0, |p| p.made)
    }
}

/// A ring lent to one request; back to its GPU's free list on drop.
pub struct Lent<'a, R> {
    rings: &'a Rings<R>,
    gpu: u32,
    ring: Option<R>,
}

impl<R> std::ops::Deref for Lent<'_, R> {
    type Target = R;
    fn deref(&self) -> &R {
        // Present from `lend` until `drop`.
        self.ring.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl<R> std::ops::DerefMut for Lent<'_, R> {
    fn deref_mut(&mut self) -> &mut R {
        self.ring.as_mut().unwrap_or_else(|| unreachable!())
    }
}

impl<R> Drop for Lent<'_, R> {
    fn drop(&mut self) {
        let Some(ring) = self.ring.take() else {
            return;
        };
        let mut state = self.rings.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pool) = state.get_mut(&self.gpu) {
            pool.free.push(ring);
        }
        drop(state);
        // All: waiters for other GPUs share the condition variable.
        self.rings.returned.notify_all();
    }
}

/// Why a device request did not complete.
#[derive(Debug)]
pub enum Failure {
    /// The device failed before any byte of a reply left: answer with the
    /// error. `unread` bytes of a write's payload are still on the
    /// connection (skip them to stay in step).
    Device { error: CudaError, unread: u64 },
    /// The connection failed, or the device failed once the reply had
    /// begun: the connection must end.
    Broken(io::Error),
}

/// One step's error inside a pipeline run.
enum Step<E> {
    Device(CudaError),
    Other(E),
}

impl<E> From<CudaError> for Step<E> {
    fn from(e: CudaError) -> Self {
        Step::Device(e)
    }
}

/// Device → connection: `source` runs ahead on the device while `send`
/// takes each chunk in order. `head` leaves (through `send`) only once the
/// first chunk is off the device, so a device that fails at once gets a
/// clean refusal instead of a broken stream.
///
/// # Errors
/// As [`Failure`] says.
pub fn read(
    source: &mut impl Source,
    len: u64,
    head: &[u8],
    mut send: impl FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), Failure> {
    if len == 0 {
        return send(head).map_err(Failure::Broken);
    }
    let mut began = false;
    let run = pipeline::stream_out(source, len, |_, bytes| {
        if !began {
            began = true;
            send(head).map_err(Step::Other)?;
        }
        send(bytes).map_err(Step::Other)
    });
    match run {
        Ok(_) => Ok(()),
        Err(Step::Device(error)) if !began => Err(Failure::Device { error, unread: 0 }),
        Err(Step::Device(e)) => Err(Failure::Broken(io::Error::other(e.to_string()))),
        Err(Step::Other(e)) => Err(Failure::Broken(e)),
    }
}

/// Connection → device: `recv` fills each chunk from the connection while
/// `sink` takes the previous ones to the device. The write is complete
/// (acknowledge it) only once every byte is on the device.
///
/// # Errors
/// As [`Failure`] says: after a device failure, the bytes of the payload
/// not yet received are counted in `unread`.
pub fn write(
    sink: &mut impl Sink,
    len: u64,
    mut recv: impl FnMut(&mut [u8]) -> io::Result<()>,
) -> Result<(), Failure> {
    let mut received = 0u64;
    let run = pipeline::stream_in(sink, len, |c, buf| {
        recv(buf).map_err(Step::Other)?;
        received = c.offset + c.len as u64;
        Ok(())
    });
    match run {
        Ok(_) => Ok(()),
        Err(Step::Device(error)) => Err(Failure::Device {
            error,
            unread: len - received,
        }),
        Err(Step::Other(e)) => Err(Failure::Broken(e)),
    }
}

/// Another agent → device (a pull): `fetch(chunk, buf)` reads each chunk
/// of the source while `sink` takes the previous ones to the device.
///
/// # Errors
/// `fetch`'s refusal, or `device(error)` of a device failure.
pub fn pull<E>(
    sink: &mut impl Sink,
    len: u64,
    fetch: impl FnMut(Chunk, &mut [u8]) -> Result<(), E>,
    device: impl FnOnce(CudaError) -> E,
) -> Result<(), E> {
    let mut fetch = fetch;
    pipeline::stream_in(sink, len, |c, buf| fetch(c, buf).map_err(Step::Other))
        .map(|_| ())
        .map_err(|e| match e {
            Step::Device(e) => device(e),
            Step::Other(e) => e,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncilla_cuda::host::{HostSink, HostSource};
    use std::sync::Arc;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 13 + i / 4093) as u8).collect()
    }

    /// A fake device: host memory behind a lock, copied to and from on the
    /// ring's worker thread as a DMA engine would, failing where told.
    #[derive(Clone)]
    struct FakeDevice {
        mem: Arc<Mutex<Vec<u8>>>,
        fail_at: Option<usize>,
    }

    impl FakeDevice {
        fn new(bytes: Vec<u8>, fail_at: Option<usize>) -> Self {
            Self {
                mem: Arc::new(Mutex::new(bytes)),
                fail_at,
            }
        }
        fn fails(&self, c: Chunk) -> Result<(), CudaError> {
            match self.fail_at {
                Some(i) if c.index == i => Err(CudaError::Driver {
                    device: 0,
                    op: "cuMemcpyAsync",
                    detail: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
                }),
                _ => Ok(()),
            }
        }
        fn source(&self, slot_len: usize) -> impl Source {
            let dev = self.clone();
            HostSource::new(RING_SLOTS, slot_len, move |c: Chunk, buf: &mut [u8]| {
                dev.fails(c)?;
                let at = c.offset as usize;
                buf.copy_from_slice(&dev.mem.lock().unwrap()[at..at + buf.len()]);
                Ok(())
            })
        }
        fn sink(&self, slot_len: usize) -> impl Sink {
            let dev = self.clone();
            HostSink::new(RING_SLOTS, slot_len, move |c: Chunk, bytes: &[u8]| {
                dev.fails(c)?;
                let at = c.offset as usize;
                dev.mem.lock().unwrap()[at..at + bytes.len()].copy_from_slice(bytes);
                Ok(())
            })
        }
    }

    #[test]
    fn a_read_sends_the_header_then_every_byte_in_order() {
        let bytes = pattern(5 * 1000 + 17);
        let dev = FakeDevice::new(bytes.clone(), None);
        let mut wire = Vec::new();
        read(&mut dev.source(1000), bytes.len() as u64, b"HEAD", |b| {
            wire.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(&wire[..4], b"HEAD");
        assert_eq!(wire[4..], bytes[..]);
    }

    #[test]
    fn an_empty_read_is_its_header() {
        let dev = FakeDevice::new(Vec::new(), None);
        let mut wire = Vec::new();
        read(&mut dev.source(1000), 0, b"HEAD", |b| {
            wire.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(wire, b"HEAD");
    }

    #[test]
    fn a_device_failing_at_once_is_refused_cleanly_and_later_breaks_the_stream() {
        let dev = FakeDevice::new(pattern(4000), Some(0));
        let mut wire = Vec::new();
        let e = read(&mut dev.source(1000), 4000, b"HEAD", |b| {
            wire.extend_from_slice(b);
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(e, Failure::Device { unread: 0, .. }), "{e:?}");
        assert!(wire.is_empty(), "nothing may leave before the refusal");

        let dev = FakeDevice::new(pattern(4000), Some(2));
        let mut wire = Vec::new();
        let e = read(&mut dev.source(1000), 4000, b"HEAD", |b| {
            wire.extend_from_slice(b);
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(e, Failure::Broken(_)), "{e:?}");
        assert_eq!(wire.len(), 4 + 2000, "header and the two good chunks");
    }

    #[test]
    fn a_write_lands_every_byte_on_the_device() {
        let bytes = pattern(3 * 4096 + 5);
        let dev = FakeDevice::new(vec![0; bytes.len()], None);
        let mut from = &bytes[..];
        write(&mut dev.sink(4096), bytes.len() as u64, |buf| {
            io::Read::read_exact(&mut from, buf)
        })
        .unwrap();
        assert_eq!(*dev.mem.lock().unwrap(), bytes);
        assert!(from.is_empty());
    }

    #[test]
    fn a_failed_write_counts_the_payload_still_on_the_connection() {
        let bytes = pattern(10 * 100);
        let dev = FakeDevice::new(vec![0; bytes.len()], Some(3));
        let mut from = &bytes[..];
        let e = write(&mut dev.sink(100), bytes.len() as u64, |buf| {
            io::Read::read_exact(&mut from, buf)
        })
        .unwrap_err();
        let Failure::Device { unread, .. } = e else {
            panic!("{e:?}")
        };
        assert_eq!(
            unread,
            from.len() as u64,
            "what was not read is what is left to skip"
        );
        assert!(unread < 1000 && unread > 0);
    }

    #[test]
    fn a_pull_fills_the_device_chunk_by_chunk_and_reports_refusals() {
        let src = pattern(7 * 512 + 3);
        let dev = FakeDevice::new(vec![0; src.len()], None);
        let mut asked = Vec::new();
        pull(
            &mut dev.sink(512),
            src.len() as u64,
            |c, buf| {
                asked.push(c.offset);
                let at = c.offset as usize;
                buf.copy_from_slice(&src[at..at + buf.len()]);
                Ok::<_, String>(())
            },
            |e| e.to_string(),
        )
        .unwrap();
        assert_eq!(*dev.mem.lock().unwrap(), src);
        assert_eq!(asked, (0..8).map(|i| i * 512).collect::<Vec<u64>>());

        let dev = FakeDevice::new(vec![0; 2048], None);
        let e = pull(
            &mut dev.sink(512),
            2048,
            |c, _| {
                if c.index == 1 {
                    Err("source refused".to_string())
                } else {
                    Ok(())
                }
            },
            |e| e.to_string(),
        )
        .unwrap_err();
        assert_eq!(e, "source refused");

        let dev = FakeDevice::new(vec![0; 2048], Some(0));
        let e = pull(&mut dev.sink(512), 2048, |_, _| Ok(()), |e| e.to_string()).unwrap_err();
        assert!(e.contains("ILLEGAL_ADDRESS"), "{e}");
    }

    #[test]
    fn rings_are_made_on_need_reused_and_bounded() {
        let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let m = Arc::clone(&made);
        let rings = Rings::new(2, move |gpu| {
            Ok((gpu, m.fetch_add(1, std::sync::atomic::Ordering::SeqCst)))
        });
        let a = rings.take(0, RING_WAIT).unwrap();
        let b = rings.take(0, RING_WAIT).unwrap();
        assert_ne!(a.1, b.1);
        // Another GPU has rings of its own.
        assert_eq!(rings.take(1, RING_WAIT).unwrap().0, 1);
        // Both of GPU 0's are lent: a third waits, then is refused.
        let Err(e) = rings.take(0, Duration::from_millis(20)) else {
            panic!("a third ring was lent past the limit");
        };
        assert!(e.to_string().contains("busy"), "{e}");
        let first = a.1;
        drop(a);
        assert_eq!(rings.take(0, RING_WAIT).unwrap().1, first, "reused");
        assert_eq!(rings.made(0), 2);
        assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[test]
    fn a_waiting_request_gets_the_ring_another_returns() {
        let rings = Arc::new(Rings::new(1, |_| Ok(7u8)));
        let held = rings.take(0, RING_WAIT).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let r = Arc::clone(&rings);
        let waiter = std::thread::spawn(move || {
            tx.send(()).unwrap();
            *r.take(0, RING_WAIT).unwrap()
        });
        rx.recv().unwrap();
        drop(held);
        assert_eq!(waiter.join().unwrap(), 7);
    }

    #[test]
    fn a_ring_that_cannot_be_made_frees_its_place() {
        let rings = Rings::<u8>::new(1, |_| Err(CudaError::NoDriver));
        for _ in 0..2 {
            // Asked again each time, never "busy".
            let Err(e) = rings.take(0, RING_WAIT) else {
                panic!("a ring that cannot be made was lent");
            };
            assert!(e.to_string().contains("no CUDA driver"), "{e}");
        }
        assert_eq!(rings.made(0), 0);
    }
}
