//! `ocmctl bench copy`: copy latency and bandwidth to a remote node by
//! size, direction and number of connections, each point beside the raw
//! TCP baseline ([`crate::rawtcp`]) measured the same way over the same
//! path and the same number of connections, right before it. Then many
//! clients at once (threads of this process, then separate processes:
//! [`crate::procbench`]), and a batch against one copy at a time.
//!
//! It measures; it asserts nothing but that the bytes read back.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Batch, Fabric, Kind, Oncilla, Options};
use oncilla_model::size::{parse_size, HumanBytes};
use serde::Serialize;

use crate::probe::Probe;
use crate::rawtcp::{self, RawClient};
use crate::report::{pct, sizes_or, Machine};
use crate::BenchError;
use oncilla_cluster::Daemon;
use oncilla_ops::Master;
use oncilla_ops::Table;

/// Sizes measured unless `--size` is given.
const SIZES: [u64; 8] = [
    8,
    4 << 10,
    64 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    256 << 20,
    1 << 30,
];
/// Bytes moved per point (more iterations for small sizes) ...
const BYTES_PER_POINT: u64 = 512 << 20;
/// ... within these iteration counts.
const MIN_ITERS: u64 = 3;
const MAX_ITERS: u64 = 2000;
/// Copies in the batch comparison, and their size.
const BATCH_OPS: usize = 256;
const BATCH_OP_SIZE: usize = 4 << 10;

/// Options of `ocmctl bench copy`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct CopyArgs {
    /// Sizes to measure, repeatable [default: 8B 4KiB 64KiB 1MiB 4MiB 16MiB 256MiB 1GiB].
    #[arg(long = "size", value_name = "SIZE")]
    sizes: Vec<String>,
    /// Connections per node, repeatable [default: 1 2 4].
    #[arg(long = "streams", value_name = "N")]
    streams: Vec<usize>,
    /// Clients copying at once in the concurrency table, repeatable
    /// [default: 1 2 4]; each is its own session with its own allocation.
    #[arg(long = "clients", value_name = "N")]
    clients: Vec<usize>,
    /// Bytes per copy in the concurrency table.
    #[arg(long, default_value = "64MiB")]
    clients_size: String,
    /// Measure the running cluster whose local agent listens here, instead
    /// of starting one (with --master and the token as for other commands).
    #[arg(long, value_name = "PATH", requires = "raw")]
    socket: Option<PathBuf>,
    /// Node to copy to [default: the largest node other than the local one].
    #[arg(long)]
    target: Option<String>,
    /// Raw TCP baseline server beside the target (`ocmctl bench
    /// raw-server`); started in this process when the benchmark starts its
    /// own cluster.
    #[arg(long, value_name = "ADDR")]
    raw: Option<String>,
    /// Memory of the raw server this process starts: anon (a heap buffer)
    /// or slab (a pool slab as agents make them, to measure what pool
    /// memory costs apart from Oncilla's code).
    #[arg(long, value_enum, default_value = "anon")]
    raw_memory: rawtcp::ServerMemory,
    /// Fabric for Oncilla's copies: auto (verbs where both ends have it,
    /// else tcp), tcp or verbs (fails where verbs is unavailable).
    #[arg(long, default_value = "auto")]
    fabric: String,
    /// Start the local cluster with TLS on every TCP listener, to measure
    /// what TLS costs beside a run without it.
    #[arg(long, conflicts_with = "socket")]
    tls: bool,
    /// Start the local cluster with metrics on every daemon, scraped once
    /// a second while the benchmark runs (what serving them costs).
    #[arg(long, conflicts_with = "socket")]
    metrics: bool,
    #[command(flatten)]
    conn: oncilla_ops::Conn,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// Options of `ocmctl bench raw-server`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct RawServerArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:7079")]
    listen: String,
    /// Memory the server reads from and writes into (as `bench copy
    /// --raw-memory`).
    #[arg(long, value_enum, default_value = "anon")]
    memory: rawtcp::ServerMemory,
}

/// Runs the raw TCP baseline server until killed.
///
/// # Errors
/// The address cannot be bound.
pub fn raw_server(args: &RawServerArgs) -> Result<(), BenchError> {
    let listener = std::net::TcpListener::bind(&args.listen)
        .map_err(|e| BenchError::Failed(format!("cannot listen on {}: {e}", args.listen)))?;
    eprintln!("raw TCP baseline listening on {}", args.listen);
    rawtcp::serve(listener, args.memory);
    Ok(())
}

/// What the benchmark measures, resolved from the options.
#[derive(Clone)]
struct Plan {
    sizes: Vec<u64>,
    streams: Vec<usize>,
    clients: Vec<usize>,
    clients_size: u64,
    json: bool,
    fabric: Fabric,
}

/// One direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Op {
    Read,
    Write,
}

/// One measured series: p50 latency of one copy and the bandwidth it gives.
#[derive(Debug, Serialize)]
struct Series {
    p50_us: f64,
    p99_us: f64,
    gb_per_s: f64,
}

#[derive(Debug, Serialize)]
struct Point {
    op: Op,
    streams: usize,
    /// Connections actually used (fewer than `streams` for small copies).
    connections: usize,
    size: u64,
    iterations: u64,
    oncilla: Series,
    raw: Series,
    /// Oncilla bandwidth over raw bandwidth.
    ratio: f64,
    /// Oncilla p50 latency over raw p50 latency.
    latency_ratio: f64,
    /// Agent CPU seconds per GiB moved.
    agent_cpu_s_per_gib: f64,
}

#[derive(Debug, Serialize)]
struct Concurrent {
    clients: usize,
    op: Op,
    size: u64,
    /// Clients as threads of this process.
    oncilla_gb_per_s: f64,
    /// Clients as separate processes.
    processes_gb_per_s: f64,
    /// As many raw TCP connections, one thread each.
    raw_gb_per_s: f64,
    ratio: f64,
    processes_ratio: f64,
    /// Of the threads run.
    agent_cpu_s_per_gib: f64,
}

#[derive(Debug, Serialize)]
struct BatchResult {
    ops: usize,
    op_size: usize,
    one_at_a_time_ops_per_s: f64,
    batch_ops_per_s: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    machine: Machine,
    target: String,
    raw_addr: String,
    points: Vec<Point>,
    concurrency: Vec<Concurrent>,
    batch: BatchResult,
}

/// Runs `ocmctl bench copy`.
///
/// # Errors
/// Bad options, a cluster that does not start, failed copies, and data
/// that does not read back.
pub fn run(args: &CopyArgs, daemon: &Daemon) -> Result<(), BenchError> {
    let plan = plan(args)?;
    let largest = plan.sizes.iter().copied().max().unwrap_or(0);
    let need =
        largest.max(plan.clients_size * plan.clients.iter().copied().max().unwrap_or(1) as u64);
    match &args.socket {
        Some(socket) => {
            let raw = args.raw.clone().unwrap_or_default();
            let master = args.conn.connect()?;
            let mut opts = Options::new(socket.clone(), args.conn.token()?);
            opts.fabric = plan.fabric;
            measure(&master, &opts, args.target.clone(), &raw, &plan)
        }
        None => {
            // node-0 serves the benchmark's session; node-1 holds the bytes.
            let capacities = [64 << 20, need + (64 << 20)];
            let raw = rawtcp::spawn_local(args.raw_memory)?;
            let config = crate::local(daemon, &capacities)
                .tls(args.tls)
                .metrics(args.metrics);
            oncilla_cluster::run(config, move |c| {
                let _scraper = c
                    .metrics_addr("master")
                    .is_some()
                    .then(|| Scraper::start(c));
                let master = c.master()?;
                let mut opts = Options::new(c.socket(0), c.token.clone());
                opts.fabric = plan.fabric;
                measure(&master, &opts, Some("node-1".into()), &raw, &plan)
            })
        }
    }
}

fn plan(args: &CopyArgs) -> Result<Plan, BenchError> {
    let sizes = sizes_or(&args.sizes, &SIZES)?;
    if sizes.iter().any(|&s| s == 0 || s > 4 << 30) {
        return Err(BenchError::Failed(
            "--size must be between 1 byte and 4GiB".into(),
        ));
    }
    let list = |v: &[usize], what: &str| -> Result<Vec<usize>, BenchError> {
        let v = if v.is_empty() {
            vec![1, 2, 4]
        } else {
            v.to_vec()
        };
        if v.iter().any(|&n| !(1..=64).contains(&n)) {
            return Err(BenchError::Failed(format!(
                "--{what} must be between 1 and 64"
            )));
        }
        Ok(v)
    };
    let clients_size = parse_size(&args.clients_size)
        .map_err(|e| BenchError::Usage(format!("--clients-size: {e}")))?;
    if clients_size == 0 || clients_size > 1 << 30 {
        return Err(BenchError::Failed(
            "--clients-size must be between 1 byte and 1GiB".into(),
        ));
    }
    Ok(Plan {
        sizes,
        streams: list(&args.streams, "streams")?,
        clients: list(&args.clients, "clients")?,
        clients_size,
        json: args.json,
        fabric: Fabric::parse(&args.fabric)?,
    })
}

fn measure(
    master: &Master,
    opts: &Options,
    target: Option<String>,
    raw_addr: &str,
    plan: &Plan,
) -> Result<(), BenchError> {
    let nodes = master.nodes()?;
    let token = opts.token.as_ref().ok_or_else(|| {
        BenchError::Usage(
            "the copy benchmark needs the cluster token (it asks agents for their CPU time)".into(),
        )
    })?;
    let probe = Probe::new(&nodes, token, master.tls())?;
    let first = Oncilla::connect_with(opts.clone())?;
    let target = match target {
        Some(t) => t,
        None => nodes
            .iter()
            .map(|n| &n.info)
            .filter(|i| i.name != first.node())
            .max_by_key(|i| i.capacity)
            .map(|i| i.name.clone())
            .ok_or_else(|| {
                BenchError::Failed("no node other than the local one to copy to".into())
            })?,
    };
    let agent = probe
        .index_of(&nodes, &target)
        .ok_or_else(|| BenchError::Failed(format!("no node named {target}")))?;
    drop(first);
    let agent_cpu =
        || -> Result<u64, BenchError> { Ok(probe.statuses()?.get(agent).map_or(0, |s| s.cpu_ns)) };
    let say = |s: String| {
        if !plan.json {
            eprintln!("{s}");
        }
    };

    let largest = plan.sizes.iter().copied().max().unwrap_or(1);
    let len = to_usize(largest)?;
    let src = crate::report::pattern(len, 3);
    let mut dst = vec![0u8; len];
    let mut raw_dst = vec![0u8; len];
    let mut points = Vec::new();
    for &streams in &plan.streams {
        let ocm = Oncilla::connect_with(opts.clone().streams(streams))?;
        let a =
            ocm.alloc_with(&AllocSpec::new(largest, Kind::RemoteHost).on_nodes([target.as_str()]))?;
        for &size in &plan.sizes {
            let n = to_usize(size)?;
            let connections = liboncilla::streams_for(size, streams);
            let mut raw = RawClient::connect(raw_addr, connections)?;
            let iterations = (BYTES_PER_POINT / size).clamp(MIN_ITERS, MAX_ITERS);
            say(format!(
                "streams {streams}, {}: {iterations} copies each way",
                HumanBytes(size)
            ));
            for op in [Op::Write, Op::Read] {
                let cpu0 = agent_cpu()?;
                let (raw_s, ours) = sample(
                    iterations,
                    || match op {
                        Op::Write => raw.write(&src[..n]),
                        Op::Read => raw.read(&mut raw_dst[..n]),
                    },
                    || match op {
                        Op::Write => a.copy_in(0, &src[..n]).map_err(BenchError::from),
                        Op::Read => a.copy_out(0, &mut dst[..n]).map_err(BenchError::from),
                    },
                )?;
                let moved = (iterations + 1) * size;
                let cpu1 = agent_cpu()?;
                if op == Op::Read && dst[..n] != src[..n] {
                    return Err(BenchError::Verify(format!(
                        "{} read did not return what was written",
                        HumanBytes(size)
                    )));
                }
                let oncilla = series(size, &ours);
                let raw = series(size, &raw_s);
                points.push(Point {
                    op,
                    streams,
                    connections,
                    size,
                    iterations,
                    ratio: oncilla.gb_per_s / raw.gb_per_s.max(1e-12),
                    latency_ratio: oncilla.p50_us / raw.p50_us.max(1e-12),
                    agent_cpu_s_per_gib: cpu_per_gib(cpu1.saturating_sub(cpu0), moved),
                    oncilla,
                    raw,
                });
            }
        }
        a.free()?;
        // Let the agent scrub what was freed before the next series: the
        // scrubber would otherwise compete for the CPU with the copies.
        probe.settle()?;
    }

    let mut concurrency = Vec::new();
    for &clients in &plan.clients {
        say(format!(
            "{clients} clients at once, {} each",
            HumanBytes(plan.clients_size)
        ));
        for op in [Op::Write, Op::Read] {
            let cpu0 = agent_cpu()?;
            let ours = concurrent(opts, &target, clients, plan.clients_size, op)?;
            let cpu1 = agent_cpu()?;
            probe.settle()?;
            let (procs, _) = crate::procbench::at_once(
                opts,
                &target,
                clients,
                plan.clients_size,
                rounds(plan.clients_size, clients),
                op == Op::Write,
            )?;
            probe.settle()?;
            let raw = concurrent_raw(raw_addr, clients, plan.clients_size, op)?;
            concurrency.push(Concurrent {
                clients,
                op,
                size: plan.clients_size,
                oncilla_gb_per_s: ours.0,
                processes_gb_per_s: procs,
                raw_gb_per_s: raw,
                ratio: ours.0 / raw.max(1e-12),
                processes_ratio: procs / raw.max(1e-12),
                agent_cpu_s_per_gib: cpu_per_gib(cpu1.saturating_sub(cpu0), ours.1),
            });
        }
    }

    say(format!(
        "batch of {BATCH_OPS} reads of {}",
        HumanBytes(BATCH_OP_SIZE as u64)
    ));
    let batch = batch(opts, &target)?;
    probe.settle()?;

    let report = Report {
        machine: Machine::of(&nodes),
        target,
        raw_addr: raw_addr.to_string(),
        points,
        concurrency,
        batch,
    };
    if plan.json {
        oncilla_ops::json::print(
            &serde_json::to_value(&report).map_err(|e| BenchError::Failed(e.to_string()))?,
        );
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

/// Times `iterations` runs each of `raw` and `ours`, alternating so both
/// see the same machine (scheduling, frequency, other load), after one
/// untimed warm-up each; microseconds.
fn sample(
    iterations: u64,
    mut raw: impl FnMut() -> Result<(), BenchError>,
    mut ours: impl FnMut() -> Result<(), BenchError>,
) -> Result<(Vec<f64>, Vec<f64>), BenchError> {
    raw()?;
    ours()?;
    let n = to_usize(iterations)?;
    let (mut r, mut o) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let started = Instant::now();
        raw()?;
        r.push(started.elapsed().as_secs_f64() * 1e6);
        let started = Instant::now();
        ours()?;
        o.push(started.elapsed().as_secs_f64() * 1e6);
    }
    Ok((r, o))
}

fn series(size: u64, us: &[f64]) -> Series {
    let p50 = pct(us, 50.0);
    Series {
        p50_us: p50,
        p99_us: pct(us, 99.0),
        gb_per_s: size as f64 / (p50.max(1e-3) * 1e3),
    }
}

/// `clients` sessions, each with its own allocation on `target`, copying
/// `size` bytes at the same time; aggregate GB/s and bytes moved.
fn concurrent(
    opts: &Options,
    target: &str,
    clients: usize,
    size: u64,
    op: Op,
) -> Result<(f64, u64), BenchError> {
    let mut sessions = Vec::new();
    for _ in 0..clients {
        let ocm = Oncilla::connect_with(opts.clone().streams(1))?;
        let a = ocm.alloc_with(&AllocSpec::new(size, Kind::RemoteHost).on_nodes([target]))?;
        sessions.push((ocm, a));
    }
    let outcome = at_once(&mut sessions, size, |(_, a), buf| {
        match op {
            Op::Write => a.copy_in(0, buf)?,
            Op::Read => a.copy_out(0, buf)?,
        }
        Ok(())
    })?;
    for (_, a) in sessions {
        a.free()?;
    }
    Ok(outcome)
}

/// The raw baseline of [`concurrent`]: `clients` connections, each moving
/// its own copies at the same time.
fn concurrent_raw(addr: &str, clients: usize, size: u64, op: Op) -> Result<f64, BenchError> {
    let mut conns = (0..clients)
        .map(|_| RawClient::connect(addr, 1))
        .collect::<Result<Vec<_>, _>>()?;
    let (gb_per_s, _) = at_once(&mut conns, size, |c, buf| match op {
        Op::Write => c.write(buf),
        Op::Read => c.read(buf),
    })?;
    Ok(gb_per_s)
}

/// Runs `copy` on every worker, each on its own thread with its own
/// `size`-byte buffer, the same number of rounds each (about
/// [`BYTES_PER_POINT`] in all); aggregate GB/s and bytes moved. Buffers
/// are made before the clock starts.
fn at_once<W: Send>(
    workers: &mut [W],
    size: u64,
    copy: impl Fn(&mut W, &mut [u8]) -> Result<(), BenchError> + Sync,
) -> Result<(f64, u64), BenchError> {
    let n = to_usize(size)?;
    let rounds = rounds(size, workers.len());
    let mut bufs: Vec<Vec<u8>> = workers.iter().map(|_| vec![0x33u8; n]).collect();
    let started = Instant::now();
    std::thread::scope(|s| {
        let copy = &copy;
        let handles: Vec<_> = workers
            .iter_mut()
            .zip(bufs.iter_mut())
            .map(|(w, buf)| s.spawn(move || (0..rounds).try_for_each(|_| copy(w, buf))))
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(BenchError::Failed("copy thread panicked".into())))
        })
    })?;
    let moved = size * rounds * workers.len() as u64;
    Ok((
        moved as f64 / started.elapsed().as_secs_f64().max(1e-9) / 1e9,
        moved,
    ))
}

/// Copies each of `clients` makes at once: about [`BYTES_PER_POINT`] in all.
fn rounds(size: u64, clients: usize) -> u64 {
    (BYTES_PER_POINT / size.max(1) / clients.max(1) as u64).clamp(2, 200)
}

/// [`BATCH_OPS`] small reads one at a time, then as one batch.
fn batch(opts: &Options, target: &str) -> Result<BatchResult, BenchError> {
    let ocm = Oncilla::connect_with(opts.clone())?;
    let total = (BATCH_OPS * BATCH_OP_SIZE) as u64;
    let a = ocm.alloc_with(&AllocSpec::new(total, Kind::RemoteHost).on_nodes([target]))?;
    let mut buf = vec![0u8; BATCH_OP_SIZE];
    let rate = |d: Duration| BATCH_OPS as f64 / d.as_secs_f64().max(1e-9);
    let mut one = Vec::new();
    let mut many = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        for i in 0..BATCH_OPS {
            a.copy_out((i * BATCH_OP_SIZE) as u64, &mut buf)?;
        }
        one.push(rate(started.elapsed()));
        let mut b = Batch::new();
        for i in 0..BATCH_OPS {
            b.read(&a, (i * BATCH_OP_SIZE) as u64, vec![0; BATCH_OP_SIZE]);
        }
        let started = Instant::now();
        ocm.submit(b).wait()?;
        many.push(rate(started.elapsed()));
    }
    a.free()?;
    Ok(BatchResult {
        ops: BATCH_OPS,
        op_size: BATCH_OP_SIZE,
        one_at_a_time_ops_per_s: pct(&one, 50.0),
        batch_ops_per_s: pct(&many, 50.0),
    })
}

fn render(r: &Report) -> String {
    let mut out = format!(
        "{}\ncopy to {} (raw TCP baseline at {}: the same requests with no checks and no pool), p50 per copy:\n",
        r.machine, r.target, r.raw_addr
    );
    let mut t = Table::new(&[
        "OP",
        "STREAMS",
        "SIZE",
        "CONNS",
        "ONCILLA p50",
        "RAW p50",
        "LAT x",
        "ONCILLA GB/s",
        "RAW GB/s",
        "BW %",
        "AGENT CPU s/GiB",
    ]);
    for p in &r.points {
        t.row(vec![
            format!("{:?}", p.op).to_lowercase(),
            p.streams.to_string(),
            HumanBytes(p.size).to_string(),
            p.connections.to_string(),
            format!("{:.1} us", p.oncilla.p50_us),
            format!("{:.1} us", p.raw.p50_us),
            format!("{:.2}", p.latency_ratio),
            format!("{:.3}", p.oncilla.gb_per_s),
            format!("{:.3}", p.raw.gb_per_s),
            format!("{:.0}%", p.ratio * 100.0),
            format!("{:.3}", p.agent_cpu_s_per_gib),
        ]);
    }
    out.push_str(&t.render());
    out.push_str(
        "\nclients copying at once (each its own session, allocation and connection), as threads of one process and as processes, beside as many raw connections:\n",
    );
    let mut t = Table::new(&[
        "CLIENTS",
        "OP",
        "SIZE",
        "THREADS GB/s",
        "PROCESSES GB/s",
        "RAW GB/s",
        "THREADS %",
        "PROCESSES %",
        "AGENT CPU s/GiB",
    ]);
    for c in &r.concurrency {
        t.row(vec![
            c.clients.to_string(),
            format!("{:?}", c.op).to_lowercase(),
            HumanBytes(c.size).to_string(),
            format!("{:.3}", c.oncilla_gb_per_s),
            format!("{:.3}", c.processes_gb_per_s),
            format!("{:.3}", c.raw_gb_per_s),
            format!("{:.0}%", c.ratio * 100.0),
            format!("{:.0}%", c.processes_ratio * 100.0),
            format!("{:.3}", c.agent_cpu_s_per_gib),
        ]);
    }
    out.push_str(&t.render());
    out.push_str(&format!(
        "\n{} reads of {}: one at a time {:.0} ops/s, as one batch {:.0} ops/s ({:.1}x)\n",
        r.batch.ops,
        HumanBytes(r.batch.op_size as u64),
        r.batch.one_at_a_time_ops_per_s,
        r.batch.batch_ops_per_s,
        r.batch.batch_ops_per_s / r.batch.one_at_a_time_ops_per_s.max(1e-9)
    ));
    out
}

fn cpu_per_gib(ns: u64, bytes: u64) -> f64 {
    (ns as f64 / 1e9) / (bytes as f64 / f64::from(1u32 << 30)).max(1e-12)
}

fn to_usize(v: u64) -> Result<usize, BenchError> {
    usize::try_from(v)
        .map_err(|_| BenchError::Failed(format!("{v} bytes do not fit in memory here")))
}

/// Scrapes every daemon's metrics once a second until dropped, as a
/// Prometheus server would, so `--metrics` measures serving them too.
struct Scraper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Scraper {
    fn start(c: &oncilla_cluster::Handle) -> Self {
        use std::io::{Read, Write};
        let token = std::fs::read_to_string(c.metrics_token_file()).unwrap_or_default();
        let addrs: Vec<String> = std::iter::once("master".to_string())
            .chain((0..c.agents).map(oncilla_cluster::node_name))
            .filter_map(|n| c.metrics_addr(&n))
            .collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let halt = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !halt.load(std::sync::atomic::Ordering::Relaxed) {
                for addr in &addrs {
                    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
                        continue;
                    };
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    let _ = write!(
                        s,
                        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
                    );
                    let _ = s.read_to_end(&mut Vec::new());
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
