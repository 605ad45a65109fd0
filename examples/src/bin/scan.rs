//! A TPC-H Query 6 style scan that streams its table from remote memory
//! into a GPU, chunk by chunk: the network fills page-locked buffer `i`
//! while chunk `i - 1` is copied to the device and the filter + aggregate
//! kernel (examples/kernels/q6.cu, compiled at run time with NVRTC) runs on
//! it. Without a GPU the same pipeline runs the scan on a CPU thread and
//! says so. The same scan then reads the table from a file (page cache
//! dropped first) to compare remote memory with disk, as the Oncilla paper
//! did.
//!
//! Run against a local cluster with one command:
//!
//! ```text
//! cargo build --release -p ocmctl -p oncillad -p oncilla-examples
//! target/release/ocmctl run --agents 3 --capacity 512MiB -- target/release/scan --rows 8M
//! ```

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, IsTerminal, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use clap::Parser;
use liboncilla::{AllocSpec, Kind, Oncilla, Policy};
use oncilla_cuda::host::HostSink;
use oncilla_cuda::kernel::Kernel;
use oncilla_cuda::pinned::PinnedRing;
use oncilla_cuda::pipeline::{stream_in, Chunk, Sink, Split};
use oncilla_cuda::{CudaError, DeviceMem, Gpu};
use oncilla_model::size::{parse_size, HumanBytes};

const ROW: usize = 32;
const KERNEL: &str = include_str!("../../kernels/q6.cu");
/// The query: shipdate in [1993-01-01, 1994-01-01), discount 0.05..=0.07,
/// quantity < 24.
const DATE_LO: u32 = 366;
const DATE_HI: u32 = 731;
const DISC_LO: u32 = 5;
const DISC_HI: u32 = 7;
const QTY_MAX: u32 = 24;
const SLOTS: usize = 3;

#[derive(Parser)]
#[command(about = "Stream a table from remote memory (and from a file) through a GPU scan")]
struct Args {
    /// Rows in the table (32 bytes each), e.g. 8M.
    #[arg(long, default_value = "4M")]
    rows: String,
    /// Bytes per pipeline chunk (a multiple of 32): one copy from remote
    /// memory fills one chunk, drawing from every node its stripes are on.
    #[arg(long, default_value = "32MiB")]
    chunk: String,
    /// Bytes per stripe of the table across the nodes (a multiple of 4 KiB):
    /// smaller than a chunk, so each chunk's copy reads several nodes at
    /// once instead of one after another.
    #[arg(long, default_value = "4MiB")]
    stripe: String,
    /// Where the file copy of the table goes (deleted at the end).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Scan on the CPU even where a GPU is present.
    #[arg(long)]
    cpu: bool,
}

/// What the query computes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Answer {
    revenue: u64,
    rows: u64,
}

impl Answer {
    fn add_rows(&mut self, bytes: &[u8]) {
        for r in bytes.chunks_exact(ROW) {
            let word = |i: usize| u32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
            let (date, disc, qty) = (word(0), word(4), word(8));
            if (DATE_LO..DATE_HI).contains(&date)
                && (DISC_LO..=DISC_HI).contains(&disc)
                && qty < QTY_MAX
            {
                let mut p = [0u8; 8];
                p.copy_from_slice(&r[16..24]);
                let price = i64::from_le_bytes(p);
                self.revenue = self
                    .revenue
                    .wrapping_add((price as u64).wrapping_mul(u64::from(disc)));
                self.rows += 1;
            }
        }
    }
}

/// Row `i` of the table: deterministic, spread like TPC-H's lineitem.
fn row(i: u64, out: &mut [u8]) {
    let mut x = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut next = || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let date = (next() % 2557) as u32;
    let disc = (next() % 11) as u32;
    let qty = (next() % 50 + 1) as u32;
    let price = (next() % 10_000_000 + 90_000) as i64;
    out[0..4].copy_from_slice(&date.to_le_bytes());
    out[4..8].copy_from_slice(&disc.to_le_bytes());
    out[8..12].copy_from_slice(&qty.to_le_bytes());
    out[12..16].copy_from_slice(&0u32.to_le_bytes());
    out[16..24].copy_from_slice(&price.to_le_bytes());
    out[24..32].copy_from_slice(&(i / 4).to_le_bytes());
}

/// The scan's consuming side on a GPU: each staged chunk is copied into
/// one of `SLOTS` device buffers and the kernel is queued behind the copy
/// on the same stream (so it runs after it, and the next copy into that
/// device buffer runs after the kernel).
struct GpuScan<'a> {
    ring: &'a mut PinnedRing,
    kernel: &'a Kernel,
    device: &'a DeviceMem,
    acc: &'a DeviceMem,
}

impl Sink for GpuScan<'_> {
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
        let at = (slot * self.ring.slot_len()) as u64;
        self.ring.upload_slot(slot, chunk.len, self.device, at)?;
        let rows = (chunk.len / ROW) as u64;
        let threads = 256u32;
        let blocks = u32::try_from(rows.div_ceil(u64::from(threads)).min(1024)).unwrap_or(1024);
        let args = [
            self.device.device_ptr(at)?,
            rows,
            u64::from(DATE_LO),
            u64::from(DATE_HI),
            u64::from(DISC_LO),
            u64::from(DISC_HI),
            u64::from(QTY_MAX),
            self.acc.device_ptr(0)?,
        ];
        // SAFETY: q6 takes eight 64-bit parameters; the row buffer covers
        // `rows * 32` bytes of `device` (the chunk just copied there) and
        // `acc` holds two u64 counters; both outlive the scan, which waits
        // for the stream (`finish`) before they are dropped.
        unsafe {
            self.kernel
                .launch(self.ring.stream(), blocks, threads, &args)
        }
    }

    fn finish(&mut self) -> Result<(), CudaError> {
        self.ring.synchronize()
    }
}

/// Where the scan runs.
enum Engine {
    Gpu {
        gpu: Gpu,
        kernel: Kernel,
        ring: PinnedRing,
    },
    Cpu,
}

impl Engine {
    fn pick(force_cpu: bool, chunk: usize) -> (Self, String) {
        if force_cpu {
            return (Engine::Cpu, "CPU (asked with --cpu)".into());
        }
        let gpu = Gpu::open(0).and_then(|gpu| {
            let kernel = Kernel::compile(&gpu, KERNEL, "q6")?;
            let ring = PinnedRing::new(&gpu, SLOTS, chunk)?;
            Ok((gpu, kernel, ring))
        });
        match gpu {
            Ok((gpu, kernel, ring)) => {
                let name = gpu.info().map_or_else(|_| "GPU 0".into(), |i| i.name);
                (Engine::Gpu { gpu, kernel, ring }, format!("GPU 0: {name}"))
            }
            Err(e) => (Engine::Cpu, format!("CPU, no GPU to use ({e})")),
        }
    }

    /// Scans `total` bytes that `fill` produces chunk by chunk.
    fn scan(
        &mut self,
        total: u64,
        chunk: usize,
        fill: impl FnMut(Chunk, &mut [u8]) -> Result<(), Failure>,
    ) -> Result<(Answer, Split), Failure> {
        match self {
            Engine::Gpu { gpu, kernel, ring } => {
                let device = gpu.alloc((SLOTS * chunk) as u64)?;
                let acc = gpu.alloc(16)?;
                let mut sink = GpuScan {
                    ring,
                    kernel,
                    device: &device,
                    acc: &acc,
                };
                let split = stream_in(&mut sink, total, fill)?;
                let mut out = [0u8; 16];
                acc.read(0, &mut out)?;
                let word = |i: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&out[i..i + 8]);
                    u64::from_le_bytes(w)
                };
                Ok((
                    Answer {
                        revenue: word(0),
                        rows: word(8),
                    },
                    split,
                ))
            }
            Engine::Cpu => {
                // The worker thread scans; the total is read after it ends.
                let answer = Arc::new(Mutex::new(Answer::default()));
                let total_so_far = Arc::clone(&answer);
                let mut sink = HostSink::new(SLOTS, chunk, move |_: Chunk, bytes: &[u8]| {
                    let mut part = Answer::default();
                    part.add_rows(bytes);
                    let mut t = total_so_far
                        .lock()
                        .map_err(|_| CudaError::Pipeline("scan total poisoned".into()))?;
                    t.revenue = t.revenue.wrapping_add(part.revenue);
                    t.rows += part.rows;
                    Ok(())
                });
                let split = stream_in(&mut sink, total, fill)?;
                drop(sink.into_step()?);
                let answer = *answer
                    .lock()
                    .map_err(|_| Failure::Io("scan total poisoned".into()))?;
                Ok((answer, split))
            }
        }
    }
}

/// Why the scan stopped: the cluster, the GPU, or anything else (bad
/// options, the file, a wrong answer), in words.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Oncilla(#[from] liboncilla::Error),
    #[error(transparent)]
    Gpu(#[from] CudaError),
    #[error("{0}")]
    Io(String),
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scan: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Failure> {
    let rows = parse_size(&args.rows).map_err(|e| Failure::Io(format!("--rows: {e}")))?;
    let chunk = parse_size(&args.chunk)
        .ok()
        .filter(|c| *c >= ROW as u64 && c % ROW as u64 == 0 && *c <= 1 << 30)
        .and_then(|c| usize::try_from(c).ok())
        .ok_or_else(|| Failure::Io("--chunk must be a multiple of 32 bytes up to 1GiB".into()))?;
    let stripe = parse_size(&args.stripe)
        .ok()
        .filter(|s| *s >= 4096 && s % 4096 == 0)
        .ok_or_else(|| Failure::Io("--stripe must be a multiple of 4KiB".into()))?;
    if rows == 0 {
        return Err(Failure::Io("--rows must be at least 1".into()));
    }
    let total = rows * ROW as u64;
    let ocm = Oncilla::connect()?;
    let table = ocm.alloc_with(
        &AllocSpec::new(total, Kind::RemoteHost)
            .policy(Policy::Spread)
            .stripe(stripe),
    )?;
    let mut nodes: Vec<&str> = table
        .descriptor()
        .extents
        .iter()
        .map(|e| e.node.as_str())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    let path = args.file.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("oncilla-scan-{}.tbl", std::process::id()))
    });
    println!(
        "table: {rows} rows x {ROW} B = {} in remote memory on {} node(s) ({}), and in {}",
        HumanBytes(total),
        nodes.len(),
        nodes.join(", "),
        path.display()
    );
    let expected = load(&table, &path, rows, chunk)?;
    let (mut engine, engine_name) = Engine::pick(args.cpu, chunk);
    println!(
        "scan engine: {engine_name}; {SLOTS} staging buffers of {}; stripes of {}",
        HumanBytes(chunk as u64),
        HumanBytes(stripe)
    );

    let remote = engine.scan(total, chunk, |c, buf| {
        table.copy_out(c.offset, buf).map_err(Failure::from)
    })?;
    let file = File::open(&path).map_err(|e| Failure::Io(format!("{}: {e}", path.display())))?;
    let from_file = engine.scan(total, chunk, |c, buf| {
        file.read_exact_at(buf, c.offset)
            .map_err(|e| Failure::Io(format!("{}: {e}", path.display())))
    });
    let _ = std::fs::remove_file(&path);
    let from_file = from_file?;

    println!();
    println!("| source | rows/s | GB/s | total s | transfer s | waiting on scan s | revenue | matching rows |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, (answer, split)) in [
        ("remote memory", remote),
        ("file (page cache dropped)", from_file),
    ] {
        let secs = split.total.as_secs_f64().max(1e-9);
        println!(
            "| {name} | {:.3e} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} |",
            rows as f64 / secs,
            total as f64 / secs / 1e9,
            secs,
            split.caller.as_secs_f64(),
            split.waiting.as_secs_f64(),
            answer.revenue,
            answer.rows
        );
        if answer != expected {
            return Err(Failure::Io(format!(
                "{name}: wrong answer {answer:?}, expected {expected:?}"
            )));
        }
    }
    println!(
        "\nremote memory was {:.2}x the file's speed; both answers match the reference computed while loading",
        from_file.1.total.as_secs_f64() / remote.1.total.as_secs_f64().max(1e-9)
    );
    table.free()?;
    Ok(())
}

/// Writes the table into the allocation and the file, chunk by chunk
/// (progress on stderr), and returns the answer computed on the way.
fn load(
    table: &liboncilla::Allocation,
    path: &std::path::Path,
    rows: u64,
    chunk: usize,
) -> Result<Answer, Failure> {
    let io = |e: std::io::Error| Failure::Io(format!("{}: {e}", path.display()));
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(io)?;
    let mut out = BufWriter::with_capacity(1 << 20, &f);
    let mut answer = Answer::default();
    let per_chunk = (chunk / ROW) as u64;
    let mut buf = vec![0u8; chunk];
    let started = Instant::now();
    // On a terminal one line redrawn; elsewhere (a log) a line a quarter.
    let redraw = std::io::stderr().is_terminal();
    let mut shown = 0;
    let mut first = 0;
    while first < rows {
        let n = per_chunk.min(rows - first);
        let bytes = &mut buf[..n as usize * ROW];
        for (k, r) in bytes.chunks_exact_mut(ROW).enumerate() {
            row(first + k as u64, r);
        }
        answer.add_rows(bytes);
        table.copy_in(first * ROW as u64, bytes)?;
        out.write_all(bytes).map_err(io)?;
        first += n;
        let percent = first * 100 / rows;
        if redraw {
            eprint!("\rloading: {percent:>3}%");
        } else if percent >= shown + 25 || first == rows {
            shown = percent - percent % 25;
            eprintln!("loading: {percent:>3}%");
        }
    }
    out.flush().map_err(io)?;
    drop(out);
    f.sync_all().map_err(io)?;
    // Drop the file's pages from the page cache, so the file scan reads the disk.
    nix::fcntl::posix_fadvise(
        &f,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .map_err(|e| Failure::Io(format!("posix_fadvise: {e}")))?;
    let back = if redraw { "\r" } else { "" };
    eprintln!("{back}loaded in {:.2} s", started.elapsed().as_secs_f64());
    Ok(answer)
}
