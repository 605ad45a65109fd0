//! Chunk and window planning, and the loop that keeps a queue pair busy:
//! a copy's pieces become RDMA work requests of at most `chunk` bytes
//! (64-bit lengths in, 32-bit work requests out), posted with at most
//! `window` outstanding, one in `signal_every` signaled (plus the last),
//! and completions polled until every request is covered.
//!
//! It is written against [`Queue`], so the HCA ([`super::Hca`]) and the
//! tests' in-memory queue run the same code. It never registers memory
//! or opens connections.

use std::time::{Duration, Instant};

use oncilla_model::alloc::RdmaRegion;
use oncilla_rdma::wc::{self, Failure};
use oncilla_rdma::{Completion, RdmaError, Wr};

/// How requests are cut and kept in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Bytes per work request.
    pub chunk: u64,
    /// Work requests outstanding at once.
    pub window: usize,
    /// One request in this many asks for a completion.
    pub signal_every: usize,
    /// Longest wait for a completion before the copy fails.
    pub timeout: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            chunk: DEFAULT_CHUNK,
            window: 32,
            signal_every: 8,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Default bytes per work request: large enough that per-request cost is
/// noise at 100 Gb/s, small enough that a window of them spreads a copy
/// over the HCA's engines. Not yet measured on hardware here (none is
/// available); `ONCILLA_RDMA_CHUNK` overrides it.
pub const DEFAULT_CHUNK: u64 = 1 << 20;
/// Largest length one work request may carry (32-bit `ibv_sge.length`).
pub const MAX_WR: u64 = 1 << 31;

/// One contiguous range of a copy on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub local: u64,
    pub lkey: u32,
    pub remote: u64,
    pub rkey: u32,
    pub len: u64,
    pub read: bool,
}

/// Where a piece of a copy lies on its node: `at` bytes into an extent
/// whose memory the agent registered for this allocation, one region per
/// agent port (host pool memory, or device memory with GPUDirect RDMA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote<'a> {
    pub regions: &'a [RdmaRegion],
    pub at: u64,
}

/// A piece of a copy between remote memory and device memory of this
/// process: where it lies remotely, its byte offset in the device memory,
/// its length.
pub type DevicePiece<'a> = (Remote<'a>, u64, u64);

/// Why a piece cannot be addressed over a queue pair.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unaddressable {
    /// The regions were registered by an earlier start of the agent, which
    /// holds none of its old allocations.
    #[error("its RDMA keys are from an earlier start of the agent ({then:016x}, now {now:016x}): the agent restarted with an empty pool")]
    Restarted { then: u64, now: u64 },
    /// No region on the port the queue pair reaches.
    #[error("the memory is not registered on the agent's port {port} (registered on: {on})")]
    NoRegion { port: String, on: String },
}

/// The remote address and key of `remote`, over a queue pair to the
/// agent's port `port` (device name, port number) of agent start
/// `incarnation`.
///
/// # Errors
/// [`Unaddressable`]: keys of another agent start, or none for that port.
pub fn locate(
    remote: Remote<'_>,
    port: (&str, u32),
    incarnation: u64,
) -> Result<(u64, u32), Unaddressable> {
    let r = remote
        .regions
        .iter()
        .find(|r| r.device == port.0 && r.port == port.1)
        .ok_or_else(|| Unaddressable::NoRegion {
            port: format!("{}:{}", port.0, port.1),
            on: remote
                .regions
                .iter()
                .map(|r| format!("{}:{}", r.device, r.port))
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    if r.incarnation != incarnation {
        return Err(Unaddressable::Restarted {
            then: r.incarnation,
            now: incarnation,
        });
    }
    Ok((r.addr + remote.at, r.rkey))
}

/// The work requests for `pieces`: chunked, numbered in order, signaled
/// every `signal_every` and at the end.
pub fn plan(pieces: &[Piece], t: &Tuning) -> Vec<Wr> {
    let chunk = t.chunk.clamp(1, MAX_WR);
    let every = t.signal_every.clamp(1, t.window.max(1));
    let mut out = Vec::new();
    for p in pieces {
        let mut at = 0;
        while at < p.len {
            let n = (p.len - at).min(chunk);
            out.push(Wr {
                wr_id: out.len() as u64,
                read: p.read,
                local: p.local + at,
                lkey: p.lkey,
                len: u32::try_from(n).unwrap_or(u32::MAX),
                remote: p.remote + at,
                rkey: p.rkey,
                signaled: false,
            });
            at += n;
        }
    }
    let last = out.len().saturating_sub(1);
    for (i, w) in out.iter_mut().enumerate() {
        w.signaled = (i + 1) % every == 0 || i == last;
    }
    out
}

/// A send queue and its completions.
pub trait Queue {
    /// Posts `wrs` in order.
    ///
    /// # Errors
    /// The queue refuses them.
    fn post(&mut self, wrs: &[Wr]) -> Result<(), RdmaError>;
    /// Takes up to `out.len()` completions; never blocks.
    ///
    /// # Errors
    /// The completion queue failed.
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, RdmaError>;
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Request `index` (in plan order) completed with an error; the
    /// vendor's error code comes with it (0 where the HCA gives none).
    #[error("work request {index}: {failure}{}", vendor(*vendor_err))]
    Completion {
        index: usize,
        failure: Failure,
        vendor_err: u32,
    },
    #[error("posting work requests: {0}")]
    Post(#[source] RdmaError),
    #[error("polling completions: {0}")]
    Poll(#[source] RdmaError),
    /// No completion came within the timeout.
    #[error("{outstanding} work requests still outstanding after {:.1} s without a completion", waited.as_secs_f64())]
    Timeout {
        outstanding: usize,
        waited: Duration,
    },
}

/// " (vendor error 0x..)" where the HCA gave one.
fn vendor(code: u32) -> String {
    if code == 0 {
        String::new()
    } else {
        format!(" (vendor error {code:#x})")
    }
}

/// Posts every request of `wrs` (from [`plan`]) with at most `t.window`
/// outstanding and returns once a completion covers the last one. A
/// signaled completion for request `i` means every request up to `i` is
/// done (a send queue completes in order).
///
/// # Errors
/// The first failed completion, a refused post, or a timeout. The queue
/// pair is then in the error state and must not be reused.
pub fn run(q: &mut impl Queue, wrs: &[Wr], t: &Tuning) -> Result<(), RunError> {
    let window = t.window.max(1);
    let mut posted = 0usize;
    let mut done = 0usize;
    let mut comps = [Completion::default(); 16];
    let mut last_progress = Instant::now();
    let mut idle_polls = 0u32;
    while done < wrs.len() {
        if posted < wrs.len() && posted - done < window {
            let n = (window - (posted - done)).min(wrs.len() - posted);
            q.post(&wrs[posted..posted + n]).map_err(RunError::Post)?;
            posted += n;
        }
        let n = q.poll(&mut comps).map_err(RunError::Poll)?;
        for c in &comps[..n] {
            let index = usize::try_from(c.wr_id).unwrap_or(usize::MAX);
            if let Some(failure) = wc::failure(c.status) {
                return Err(RunError::Completion {
                    index,
                    failure,
                    vendor_err: c.vendor_err,
                });
            }
            done = done.max(index.saturating_add(1)).min(posted);
        }
        if n > 0 {
            last_progress = Instant::now();
            idle_polls = 0;
        } else {
            idle_polls += 1;
            // Spin briefly (completions come in microseconds), then let
            // other threads run, and give up after the timeout.
            if idle_polls > 1024 {
                std::thread::yield_now();
                let waited = last_progress.elapsed();
                if waited > t.timeout {
                    return Err(RunError::Timeout {
                        outstanding: posted - done,
                        waited,
                    });
                }
            } else {
                std::hint::spin_loop();
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// An in-memory HCA: "local" and "remote" are byte arrays addressed
    /// from 0; posted requests execute in order, a few per poll, and
    /// signaled ones (and failures) complete. It can fail request `fail_at`
    /// with REM_ACCESS_ERR, after which it flushes the rest.
    pub(crate) struct MemQueue {
        pub local: Vec<u8>,
        pub remote: Vec<u8>,
        queue: VecDeque<Wr>,
        pub max_outstanding: usize,
        pub posts: usize,
        pub fail_at: Option<u64>,
        errored: bool,
        pub stall: bool,
    }

    impl MemQueue {
        pub(crate) fn new(local: Vec<u8>, remote: Vec<u8>) -> Self {
            Self {
                local,
                remote,
                queue: VecDeque::new(),
                max_outstanding: 0,
                posts: 0,
                fail_at: None,
                errored: false,
                stall: false,
            }
        }
    }

    impl Queue for MemQueue {
        fn post(&mut self, wrs: &[Wr]) -> Result<(), RdmaError> {
            self.queue.extend(wrs.iter().copied());
            self.posts += 1;
            self.max_outstanding = self.max_outstanding.max(self.queue.len());
            Ok(())
        }

        fn poll(&mut self, out: &mut [Completion]) -> Result<usize, RdmaError> {
            if self.stall {
                return Ok(0);
            }
            let mut n = 0;
            // Execute up to three requests per poll.
            for _ in 0..3 {
                let Some(w) = self.queue.pop_front() else {
                    break;
                };
                let status = if self.errored {
                    wc::WR_FLUSH_ERR
                } else if self.fail_at == Some(w.wr_id) {
                    self.errored = true;
                    10
                } else {
                    let (l, r, len) = (w.local as usize, w.remote as usize, w.len as usize);
                    if w.read {
                        self.local[l..l + len].copy_from_slice(&self.remote[r..r + len]);
                    } else {
                        self.remote[r..r + len].copy_from_slice(&self.local[l..l + len]);
                    }
                    0
                };
                if (w.signaled || status != 0) && n < out.len() {
                    out[n] = Completion {
                        wr_id: w.wr_id,
                        status,
                        vendor_err: 0,
                    };
                    n += 1;
                }
            }
            Ok(n)
        }
    }

    fn piece(local: u64, remote: u64, len: u64, read: bool) -> Piece {
        Piece {
            local,
            lkey: 1,
            remote,
            rkey: 2,
            len,
            read,
        }
    }

    #[test]
    fn plan_chunks_numbers_and_signals() {
        let t = Tuning {
            chunk: 100,
            window: 4,
            signal_every: 3,
            ..Tuning::default()
        };
        let wrs = plan(
            &[piece(0, 1000, 250, true), piece(250, 5000, 100, true)],
            &t,
        );
        let lens: Vec<u32> = wrs.iter().map(|w| w.len).collect();
        assert_eq!(lens, [100, 100, 50, 100]);
        assert_eq!(wrs[2].local, 200);
        assert_eq!(wrs[2].remote, 1200);
        assert_eq!(wrs[3].remote, 5000);
        let signaled: Vec<bool> = wrs.iter().map(|w| w.signaled).collect();
        assert_eq!(
            signaled,
            [false, false, true, true],
            "every third and the last"
        );
        assert!(wrs.iter().enumerate().all(|(i, w)| w.wr_id == i as u64));
    }

    #[test]
    fn plan_splits_lengths_above_32_bits() {
        let t = Tuning {
            chunk: u64::MAX,
            ..Tuning::default()
        };
        let wrs = plan(&[piece(0, 0, 5 << 30, false)], &t);
        assert_eq!(wrs.len(), 3, "5 GiB in 2 GiB requests");
        assert!(wrs.iter().all(|w| u64::from(w.len) <= MAX_WR));
        assert_eq!(wrs.iter().map(|w| u64::from(w.len)).sum::<u64>(), 5 << 30);
        // A signal interval above the window is capped to it, so the
        // window always holds a signaled request.
        let t = Tuning {
            chunk: 1,
            window: 2,
            signal_every: 50,
            ..Tuning::default()
        };
        let wrs = plan(&[piece(0, 0, 6, false)], &t);
        assert_eq!(wrs.iter().filter(|w| w.signaled).count(), 3);
    }

    #[test]
    fn run_moves_every_byte_within_the_window() {
        let remote: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut q = MemQueue::new(vec![0; 10_000], remote.clone());
        let t = Tuning {
            chunk: 97,
            window: 5,
            signal_every: 2,
            ..Tuning::default()
        };
        let wrs = plan(&[piece(0, 0, 10_000, true)], &t);
        run(&mut q, &wrs, &t).unwrap();
        assert!(q.local == remote);
        assert!(q.max_outstanding <= 5, "window held: {}", q.max_outstanding);
        // And back the other way.
        let mut q = MemQueue::new(remote.clone(), vec![0; 10_000]);
        let wrs = plan(&[piece(0, 0, 10_000, false)], &t);
        run(&mut q, &wrs, &t).unwrap();
        assert!(q.remote == remote);
    }

    #[test]
    fn a_failed_completion_names_the_request_and_the_cause() {
        let mut q = MemQueue::new(vec![0; 1000], vec![1; 1000]);
        q.fail_at = Some(4);
        let t = Tuning {
            chunk: 100,
            window: 4,
            signal_every: 4,
            ..Tuning::default()
        };
        let wrs = plan(&[piece(0, 0, 1000, true)], &t);
        match run(&mut q, &wrs, &t) {
            Err(RunError::Completion { index, failure, .. }) => {
                assert_eq!(index, 4);
                assert_eq!(failure.name, "REM_ACCESS_ERR");
            }
            other => panic!("expected a completion error, got {other:?}"),
        }
    }

    #[test]
    fn silence_times_out() {
        let mut q = MemQueue::new(vec![0; 10], vec![0; 10]);
        q.stall = true;
        let t = Tuning {
            timeout: Duration::from_millis(50),
            ..Tuning::default()
        };
        let wrs = plan(&[piece(0, 0, 10, true)], &t);
        let started = Instant::now();
        let err = run(&mut q, &wrs, &t).unwrap_err();
        assert!(
            matches!(err, RunError::Timeout { outstanding: 1, .. }),
            "{err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn regions_are_found_by_port_and_refused_from_another_agent_start() {
        let region = |device: &str, rkey| RdmaRegion {
            device: device.into(),
            port: 1,
            addr: 0x7f00_0000_0000,
            rkey,
            incarnation: 42,
        };
        let regions = [region("mlx5_0", 21), region("mlx5_1", 22)];
        let at = Remote {
            regions: &regions,
            at: 4096,
        };
        assert_eq!(
            locate(at, ("mlx5_1", 1), 42),
            Ok((0x7f00_0000_0000 + 4096, 22))
        );
        let err = locate(at, ("mlx5_2", 1), 42).unwrap_err();
        assert!(
            matches!(&err, Unaddressable::NoRegion { port, on } if port == "mlx5_2:1" && on == "mlx5_0:1, mlx5_1:1"),
            "{err}"
        );
        // A restarted agent (new incarnation) never gets an old key.
        let err = locate(at, ("mlx5_0", 1), 43).unwrap_err();
        assert_eq!(err, Unaddressable::Restarted { then: 42, now: 43 });
        assert!(err.to_string().contains("empty pool"), "{err}");
    }
}
