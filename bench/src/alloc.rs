//! `ocmctl bench alloc`: how long `alloc` and `free` of remote memory take,
//! by size, next to the original Oncilla's published figures. It drives a cluster
//! the way an application does (liboncilla through the local agent, which
//! asks the master, which reserves on a remote agent). Between samples it
//! waits, untimed, until every agent has scrubbed what the last free
//! returned, so each sample sees a clean pool; how long that scrubbing
//! took is reported too, since it is the cost that moved off the request
//! path. It measures; it asserts nothing.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Kind, Oncilla, Options};
use oncilla_model::size::{parse_size, HumanBytes};
use oncilla_net::auth::Token;
use oncilla_net::tls::ClientTls;
use serde_json::json;

use crate::probe::Probe;
use crate::report::{pct, sizes_or, Machine};
use crate::BenchError;
use oncilla_cluster::{node_name, Daemon};
use oncilla_ops::Table;
use oncilla_ops::{Master, MasterError};

/// Sizes measured unless `--size` is given.
const SIZES: [u64; 6] = [64, 4 << 10, 1 << 20, 64 << 20, 1 << 30, 4 << 30];
/// Unrecorded allocations before each size's samples.
const WARMUP: usize = 3;

/// The original Oncilla (Young et al.), remote host allocation over
/// InfiniBand: measured points of its allocation latency, in ms.
const PAPER_ALLOC_IB: [(u64, f64); 2] = [(64, 1.26), (4 << 30, 40.8)];
/// The same over EXTOLL.
const PAPER_ALLOC_EXTOLL: [(u64, f64); 1] = [(4 << 30, 95.0)];
/// Its daemon messaging overhead per allocation, and its free, in ms.
const PAPER_OVERHEAD_MS: f64 = 1.18;
const PAPER_FREE_MS: f64 = 1.5;

/// Options of `ocmctl bench alloc`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct AllocArgs {
    /// Remote agents of the local cluster (the benchmark's own agent comes
    /// on top of these).
    #[arg(long, default_value_t = 2)]
    agents: usize,
    /// Memory each remote agent of the local cluster exports.
    #[arg(long, default_value = "4GiB")]
    capacity: String,
    /// Samples per size.
    #[arg(long, default_value_t = 100)]
    iterations: usize,
    /// An untimed pause before every sample, once the pools have settled,
    /// the same at every size (`0ms` to `10s`): a large free is followed by
    /// its scrub, during which the cluster's other threads idle, so without
    /// a pause a large size's samples start from an idler machine than a
    /// small size's. Comparing sizes at the same pause tells an
    /// allocation's own cost from that.
    #[arg(long, default_value = "0ms", value_parser = pause)]
    pause: Duration,
    /// Sizes to measure, repeatable [default: 64B 4KiB 1MiB 64MiB 1GiB 4GiB].
    #[arg(long = "size", value_name = "SIZE")]
    sizes: Vec<String>,
    /// Measure the running cluster whose local agent listens here, instead
    /// of starting one (with --master and the token as for other commands).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    #[command(flatten)]
    conn: oncilla_ops::Conn,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// A cluster to measure.
struct Target {
    master: String,
    token: Token,
    tls: Option<ClientTls>,
    socket: PathBuf,
}

/// Runs `ocmctl bench alloc` on the cluster behind `--socket`, or on a
/// local cluster it starts.
///
/// # Errors
/// Bad options, a cluster that does not start, and any failed alloc or free.
pub fn run(args: &AllocArgs, daemon: &Daemon) -> Result<(), BenchError> {
    if args.iterations == 0 || args.iterations > 100_000 {
        return Err(BenchError::Failed(
            "--iterations must be between 1 and 100000".into(),
        ));
    }
    let sizes = sizes_or(&args.sizes, &SIZES)?;
    if sizes.contains(&0) {
        return Err(BenchError::Usage("--size must be at least 1 byte".into()));
    }
    let how = How {
        iterations: args.iterations,
        pause: args.pause,
        json: args.json,
    };
    match &args.socket {
        Some(socket) => {
            let t = Target {
                master: args.conn.master.clone(),
                token: args.conn.token()?,
                tls: args.conn.tls().map_err(MasterError::from)?,
                socket: socket.clone(),
            };
            measure(&t, &sizes, &how)
        }
        None => {
            crate::report::within("--agents", args.agents, 1..=15)?;
            let capacity = parse_size(&args.capacity)
                .map_err(|e| BenchError::Usage(format!("--capacity: {e}")))?;
            // node-0 is the benchmark's own agent: it only serves the session.
            let mut capacities = vec![64 << 20];
            capacities.extend(std::iter::repeat_n(capacity, args.agents));
            oncilla_cluster::run(crate::local(daemon, &capacities), move |c| {
                // Pool start-up as each agent logged it; on stderr with
                // --json so stdout stays one document.
                for i in 0..c.agents {
                    if let Some(line) = pool_ready_line(&c.log(&node_name(i))) {
                        let line = format!("{}: {line}", node_name(i));
                        if how.json {
                            eprintln!("{line}");
                        } else {
                            println!("{line}");
                        }
                    }
                }
                if !how.json {
                    println!();
                }
                let t = Target {
                    master: c.master_addr.clone(),
                    token: c.token.clone(),
                    tls: c.tls.clone(),
                    socket: c.socket(0),
                };
                measure(&t, &sizes, &how)
            })
        }
    }
}

/// How to sample.
struct How {
    iterations: usize,
    pause: Duration,
    json: bool,
}

/// `--pause`: a time of at most ten seconds.
fn pause(s: &str) -> Result<Duration, String> {
    let d = oncilla_ops::time::parse_time(s, Duration::ZERO)?;
    if d > Duration::from_secs(10) {
        return Err(format!("{s:?}: at most 10s"));
    }
    Ok(d)
}

/// One size's samples, in microseconds.
struct Row {
    size: u64,
    alloc: Vec<f64>,
    free: Vec<f64>,
    scrub: Vec<f64>,
    extents: usize,
}

fn measure(t: &Target, sizes: &[u64], how: &How) -> Result<(), BenchError> {
    let (iterations, json) = (how.iterations, how.json);
    let master = Master::connect(&t.master, &t.token, t.tls.as_ref())?;
    let ocm = Oncilla::connect_with(Options::new(t.socket.clone(), t.token.clone()))?;
    let nodes = master.nodes()?;
    let probe = Probe::new(&nodes, &t.token, master.tls())?;
    let machine = Machine::of(&nodes);
    // Every sample is placed on the largest other node, by name: remote
    // memory, whatever the default policy would choose.
    let (target, remote_capacity) = nodes
        .iter()
        .map(|n| &n.info)
        .filter(|i| i.name != ocm.node())
        .map(|i| (i.name.clone(), i.capacity))
        .max_by_key(|(_, capacity)| *capacity)
        .ok_or_else(|| {
            BenchError::Failed("no node other than the local one to allocate on".into())
        })?;
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for &size in sizes {
        if size > remote_capacity {
            skipped.push(size);
            continue;
        }
        if !json {
            eprint!("measuring {} ...", HumanBytes(size));
        }
        let mut row = Row {
            size,
            alloc: Vec::with_capacity(iterations),
            free: Vec::with_capacity(iterations),
            scrub: Vec::with_capacity(iterations),
            extents: 0,
        };
        for i in 0..WARMUP + iterations {
            if !how.pause.is_zero() {
                std::thread::sleep(how.pause);
            }
            let started = Instant::now();
            let spec = AllocSpec::new(size, Kind::RemoteHost).on_nodes([target.as_str()]);
            let a = ocm.alloc_with(&spec)?;
            let alloc = started.elapsed();
            row.extents = row.extents.max(a.descriptor().extents.len());
            let started = Instant::now();
            a.free()?;
            let free = started.elapsed();
            let scrub = probe.settle()?;
            if i >= WARMUP {
                row.alloc.push(micros(alloc));
                row.free.push(micros(free));
                row.scrub.push(micros(scrub));
            }
        }
        if !json {
            eprintln!(" done");
        }
        rows.push(row);
    }
    if json {
        oncilla_ops::json::print(&json!({
            "machine": machine,
            "iterations": iterations,
            "pause_ms": how.pause.as_millis(),
            "rows": rows.iter().map(|r| json!({
                "size": r.size,
                "extents": r.extents,
                "alloc_us": {"p50": pct(&r.alloc, 50.0), "p99": pct(&r.alloc, 99.0)},
                "free_us": {"p50": pct(&r.free, 50.0), "p99": pct(&r.free, 99.0)},
                "scrub_us": {"p50": pct(&r.scrub, 50.0)},
                "paper_alloc_ib_ms": paper(&PAPER_ALLOC_IB, r.size),
            })).collect::<Vec<_>>(),
            "skipped_sizes": skipped,
        }));
        return Ok(());
    }
    println!("{machine}");
    print!("{}", table(&rows, how));
    for s in skipped {
        println!(
            "skipped {}: above the capacity of {target} ({})",
            HumanBytes(s),
            HumanBytes(remote_capacity)
        );
    }
    let smallest = rows.iter().min_by_key(|r| r.size);
    let largest = rows.iter().max_by_key(|r| r.size);
    if let (Some(first), Some(last)) = (smallest, largest) {
        let (a0, a1) = (pct(&first.alloc, 50.0), pct(&last.alloc, 50.0));
        println!(
            "\np50 alloc {} / {}: {:.2}x;  paper: {:.1}x (IB), overhead {PAPER_OVERHEAD_MS} ms per alloc, {PAPER_FREE_MS} ms per free",
            HumanBytes(last.size),
            HumanBytes(first.size),
            a1 / a0.max(1e-9),
            PAPER_ALLOC_IB[1].1 / PAPER_ALLOC_IB[0].1,
        );
    }
    Ok(())
}

fn table(rows: &[Row], how: &How) -> String {
    let mut t = Table::new(&[
        "SIZE",
        "EXTENTS",
        "ALLOC p50",
        "ALLOC p99",
        "FREE p50",
        "FREE p99",
        "SCRUB p50",
        "PAPER ALLOC (IB)",
        "PAPER ALLOC (EXTOLL)",
    ]);
    for r in rows {
        t.row(vec![
            HumanBytes(r.size).to_string(),
            r.extents.to_string(),
            ms(pct(&r.alloc, 50.0)),
            ms(pct(&r.alloc, 99.0)),
            ms(pct(&r.free, 50.0)),
            ms(pct(&r.free, 99.0)),
            ms(pct(&r.scrub, 50.0)),
            paper(&PAPER_ALLOC_IB, r.size).map_or("-".into(), |v| format!("{v} ms")),
            paper(&PAPER_ALLOC_EXTOLL, r.size).map_or("-".into(), |v| format!("{v} ms")),
        ]);
    }
    let pause = if how.pause.is_zero() {
        String::new()
    } else {
        format!(", each after an untimed {} ms pause", how.pause.as_millis())
    };
    format!(
        "remote alloc/free latency, {} samples per size{pause} (SCRUB: zeroing after free, off the request path):\n{}",
        how.iterations,
        t.render()
    )
}

fn paper(points: &[(u64, f64)], size: u64) -> Option<f64> {
    points.iter().find(|p| p.0 == size).map(|p| p.1)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(us: f64) -> String {
    format!("{:.3} ms", us / 1000.0)
}

/// The pool usage line an agent logged at start, if found.
fn pool_ready_line(log: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().find(|l| l.contains("pool ready"))?;
    // Drop the timestamp, level and target; keep the message and fields.
    line.find("pool ready").map(|at| line[at..].to_string())
}
