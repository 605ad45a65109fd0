//! `ocmctl bench gpu`: `Oncilla::copy` between every pair of kinds
//! (local-host, remote-host, local-gpu, remote-gpu; two allocations of a
//! kind for a pair of the same kind) by size, each beside the physical
//! baseline measured in the same run: memcpy for host to host, `copy_out`
//! and `copy_in` of the same bytes for remote host memory, cudaMemcpy from
//! and to page-locked memory for local GPU memory, and for remote GPU
//! memory the same pair with remote host memory in its place. Best of
//! `--repeat`; a ratio column; `--json`. On a machine without a GPU it says
//! why and measures the host pairs. It measures; it asserts nothing but
//! that the bytes arrive.

use std::io::IsTerminal;
use std::time::Instant;

use liboncilla::{AllocSpec, Allocation, Kind, Oncilla, Options};
use oncilla_cluster::Daemon;
use oncilla_cuda::pinned::PinnedRing;
use oncilla_model::size::HumanBytes;
use serde_json::json;

use crate::report::{pattern, sizes_or};
use crate::BenchError;
use oncilla_ops::json::print as print_json;
use oncilla_ops::Table;

/// Options of `ocmctl bench gpu`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct GpuArgs {
    /// Bytes per copy; repeat for several (default 1MiB 16MiB 64MiB 1GiB).
    #[arg(long = "size")]
    sizes: Vec<String>,
    /// Copies per case; the table shows the best.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

const DEFAULT_SIZES: [u64; 4] = [1 << 20, 16 << 20, 64 << 20, 1 << 30];

/// One measured pair.
struct Row {
    size: u64,
    from: &'static str,
    to: &'static str,
    gbps: f64,
    baseline: String,
    baseline_gbps: f64,
}

/// Runs `ocmctl bench gpu` on a local cluster of two agents: node-0 (this
/// process's) and node-1 (remote).
///
/// # Errors
/// Bad options, a cluster that does not start, failed copies, and bytes
/// that do not arrive.
pub fn run(args: &GpuArgs, daemon: &Daemon) -> Result<(), BenchError> {
    let sizes = sizes_or(&args.sizes, &DEFAULT_SIZES)?;
    if sizes.iter().any(|&s| s == 0 || s > 8 << 30) {
        return Err(BenchError::Usage(
            "--size must be between 1 byte and 8GiB".into(),
        ));
    }
    crate::report::within("--repeat", args.repeat, 1..=100)?;
    let largest = sizes.iter().copied().max().unwrap_or(1 << 20);
    // Two allocations of one kind per agent, plus page rounding.
    let capacity = 2 * largest + (64 << 20);
    let gpu = match oncilla_cuda::gpus() {
        Ok(list) if !list.is_empty() => Ok(list[0].name.clone()),
        Ok(_) => Err("the CUDA driver reports no device".to_string()),
        Err(e) => Err(e.to_string()),
    };
    let (repeat, json) = (args.repeat, args.json);
    oncilla_cluster::run(crate::local(daemon, &[capacity; 2]), move |c| {
        let ocm = Oncilla::connect_with(Options::new(c.socket(0), c.token.clone()))?;
        let device = match &gpu {
            Ok(name) => format!("GPU 0: {name}"),
            Err(why) => {
                let why = why.strip_prefix("no GPU: ").unwrap_or(why);
                eprintln!("no GPU on this machine ({why}): measuring the host pairs only");
                format!("none ({why})")
            }
        };
        let kinds: Vec<Kind> = Kind::ALL
            .into_iter()
            .filter(|k| gpu.is_ok() || !k.is_gpu())
            .collect();
        let progress = std::io::stderr().is_terminal() && !json;
        let mut rows = Vec::new();
        for &size in &sizes {
            if progress {
                eprintln!("measuring {} ...", HumanBytes(size));
            }
            rows.extend(one_size(&ocm, &kinds, size, repeat)?);
        }
        if json {
            print_json(&json!({
                "device": device,
                "repeat": repeat,
                "rows": rows.iter().map(|r| json!({
                    "size": r.size,
                    "from": r.from,
                    "to": r.to,
                    "gb_per_s": r.gbps,
                    "baseline": r.baseline,
                    "baseline_gb_per_s": r.baseline_gbps,
                    "ratio": r.gbps / r.baseline_gbps.max(1e-9),
                })).collect::<Vec<_>>(),
            }));
            return Ok(());
        }
        println!(
            "Oncilla::copy between kinds, best of {repeat}, GB/s (10^9 bytes/s); device: {device}"
        );
        let mut t = Table::new(&[
            "SIZE",
            "FROM",
            "TO",
            "GB/s",
            "BASELINE",
            "BASE GB/s",
            "RATIO",
        ]);
        for r in &rows {
            t.row(vec![
                HumanBytes(r.size).to_string(),
                r.from.into(),
                r.to.into(),
                format!("{:.2}", r.gbps),
                r.baseline.clone(),
                format!("{:.2}", r.baseline_gbps),
                format!("{:.2}", r.gbps / r.baseline_gbps.max(1e-9)),
            ]);
        }
        print!("{}", t.render());
        Ok(())
    })
}

/// Every pair of `kinds` at `size`, then each row's baseline.
fn one_size(
    ocm: &Oncilla,
    kinds: &[Kind],
    size: u64,
    repeat: usize,
) -> Result<Vec<Row>, BenchError> {
    let len = usize::try_from(size).map_err(|_| BenchError::Usage("--size too large".into()))?;
    let data = pattern(len, size);
    let mut allocs = Vec::new();
    for &kind in kinds {
        let spec = match kind {
            Kind::RemoteHost | Kind::RemoteGpu => AllocSpec::new(size, kind).on_nodes(["node-1"]),
            _ => AllocSpec::new(size, kind),
        };
        allocs.push((kind, ocm.alloc_with(&spec)?, ocm.alloc_with(&spec)?));
    }
    let mut rows = Vec::new();
    let mut back = vec![0u8; len];
    for (from, src, _) in &allocs {
        let from = from.name();
        src.copy_in(0, &data)?;
        for (to, one, two) in &allocs {
            let to = to.name();
            let dst = if from == to { two } else { one };
            let gbps = best(repeat, size, || Ok(ocm.copy(dst, 0, src, 0, size)?))?;
            back.fill(0);
            dst.copy_out(0, &mut back)?;
            if back != data {
                return Err(BenchError::Verify(format!(
                    "{from} -> {to}, {}: the bytes did not arrive",
                    HumanBytes(size)
                )));
            }
            rows.push(Row {
                size,
                from,
                to,
                gbps,
                baseline: String::new(),
                baseline_gbps: 0.0,
            });
        }
    }
    let base = Baselines::measure(&allocs, &data, repeat)?;
    let measured: Vec<(&str, &str, f64)> = rows.iter().map(|r| (r.from, r.to, r.gbps)).collect();
    for r in &mut rows {
        let (name, gbps) = base.for_pair(r.from, r.to, &measured);
        r.baseline = name;
        r.baseline_gbps = gbps;
    }
    Ok(rows)
}

/// The physical copies of one size, best of the run each.
struct Baselines {
    memcpy: f64,
    copy_out: f64,
    copy_in: f64,
    /// cudaMemcpy from and to page-locked memory, and device to device.
    htod: f64,
    dtoh: f64,
    dtod: f64,
}

/// Two allocations of each kind measured.
type Allocs = [(Kind, Allocation, Allocation)];

impl Baselines {
    fn measure(allocs: &Allocs, data: &[u8], repeat: usize) -> Result<Self, BenchError> {
        let size = data.len() as u64;
        let mut buf = vec![0u8; data.len()];
        let memcpy = best(repeat, size, || {
            buf.copy_from_slice(std::hint::black_box(data));
            Ok(())
        })?;
        let remote = allocs
            .iter()
            .find(|a| a.0 == Kind::RemoteHost)
            .map(|a| &a.1)
            .ok_or_else(|| BenchError::Failed("no remote-host allocation".into()))?;
        let copy_out = best(repeat, size, || Ok(remote.copy_out(0, &mut buf)?))?;
        let copy_in = best(repeat, size, || Ok(remote.copy_in(0, data)?))?;
        let (mut htod, mut dtoh, mut dtod) = (0.0, 0.0, 0.0);
        if let Some((_, a, b)) = allocs.iter().find(|a| a.0 == Kind::LocalGpu) {
            let (Some(dev), Some(other)) = (a.device_mem(), b.device_mem()) else {
                return Err(BenchError::Failed(
                    "a local-gpu allocation without device memory".into(),
                ));
            };
            let mut ring = PinnedRing::new(dev.gpu(), 1, data.len()).map_err(gpu_failed)?;
            let pinned = ring.wait_slot(0).map_err(gpu_failed)?;
            pinned.copy_from_slice(data);
            htod = best(repeat, size, || dev.write(0, pinned).map_err(gpu_failed))?;
            dtoh = best(repeat, size, || dev.read(0, pinned).map_err(gpu_failed))?;
            dtod = best(repeat, size, || {
                other.copy_from(0, dev, 0, size).map_err(gpu_failed)
            })?;
        }
        Ok(Self {
            memcpy,
            copy_out,
            copy_in,
            htod,
            dtoh,
            dtod,
        })
    }

    /// The baseline of the pair `from` -> `to`: its name and GB/s. Remote
    /// GPU memory is held to what remote host memory does in the same pair
    /// (`measured`).
    fn for_pair(&self, from: &str, to: &str, measured: &[(&str, &str, f64)]) -> (String, f64) {
        fn as_host(k: &str) -> &str {
            if k == "remote-gpu" {
                "remote-host"
            } else {
                k
            }
        }
        if from == "remote-gpu" || to == "remote-gpu" {
            let (f, t) = (as_host(from), as_host(to));
            let gbps = measured
                .iter()
                .find(|m| m.0 == f && m.1 == t)
                .map_or(0.0, |m| m.2);
            return (format!("copy {f} -> {t}"), gbps);
        }
        match (from, to) {
            ("local-gpu", "local-gpu") => ("cudaMemcpy DtoD".into(), self.dtod),
            ("local-gpu", _) if to == "local-host" => ("cudaMemcpy DtoH pinned".into(), self.dtoh),
            ("local-host", "local-gpu") => ("cudaMemcpy HtoD pinned".into(), self.htod),
            ("local-host", "local-host") => ("memcpy".into(), self.memcpy),
            ("remote-host", "local-gpu") => ("copy_out remote-host".into(), self.copy_out),
            ("local-gpu", "remote-host") => ("copy_in remote-host".into(), self.copy_in),
            ("remote-host", _) => ("copy_out remote-host".into(), self.copy_out),
            _ => ("copy_in remote-host".into(), self.copy_in),
        }
    }
}

fn gpu_failed(e: oncilla_cuda::CudaError) -> BenchError {
    BenchError::Failed(format!("baseline on the GPU: {e}"))
}

/// The best of `repeat` runs of `copy` moving `bytes`, in GB/s.
fn best(
    repeat: usize,
    bytes: u64,
    mut copy: impl FnMut() -> Result<(), BenchError>,
) -> Result<f64, BenchError> {
    let mut top = 0.0f64;
    for _ in 0..repeat {
        let started = Instant::now();
        copy()?;
        top = top.max(bytes as f64 / started.elapsed().as_secs_f64().max(1e-9) / 1e9);
    }
    Ok(top)
}
