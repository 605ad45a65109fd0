//! `ocmctl bench flood`: normal copies' latency while hostile connections
//! are held open against the agent's data port: none, idle strangers that
//! never send a hello, strangers that drip one byte a second, and both.
//! The flooders re-open whatever the agent closes, so the pressure lasts
//! for the whole measurement. It starts its own cluster on loopback (it
//! never floods a cluster it did not start), bounds every count and every
//! phase in time, and measures; it asserts nothing but that bytes read
//! back, and counts failed copies instead of stopping at the first.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Fabric, Kind, Oncilla, Options};
use oncilla_model::size::HumanBytes;
use oncilla_net::auth::Token;
use serde_json::json;

use crate::report::{pattern, pct};
use crate::BenchError;
use oncilla_cluster::Daemon;
use oncilla_ops::Table;

/// Sizes of the normal copies measured.
const SIZES: [u64; 2] = [4 << 10, 1 << 20];
/// Most hostile connections of each kind.
const MAX_HOSTILE: usize = 4000;
/// Longest a scenario's measurement may run.
const PHASE_LIMIT: Duration = Duration::from_secs(30);
/// How often the flooders re-open what the agent closed, and drip.
const FLOOD_TICK: Duration = Duration::from_millis(250);
/// Untimed copies per size before a scenario's samples.
const WARMUP: usize = 20;

/// Options of `ocmctl bench flood`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct FloodArgs {
    /// Idle hostile connections (connect, never send a hello).
    #[arg(long, default_value_t = 1000)]
    idle: usize,
    /// Dripping hostile connections (one byte of a hello a second).
    #[arg(long, default_value_t = 100)]
    drip: usize,
    /// Copies per size, direction and scenario.
    #[arg(long, default_value_t = 200)]
    iterations: usize,
    /// Fresh sessions per scenario, each timing its first copy (a new data
    /// connection, so a new handshake through the flood).
    #[arg(long, default_value_t = 10)]
    fresh: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `ocmctl bench flood` on a local cluster it starts.
///
/// # Errors
/// Bad options, a cluster that does not start, data that does not read back.
pub fn run(args: &FloodArgs, daemon: &Daemon) -> Result<(), BenchError> {
    if args.idle > MAX_HOSTILE || args.drip > MAX_HOSTILE {
        return Err(BenchError::Usage(format!(
            "--idle and --drip must be at most {MAX_HOSTILE}"
        )));
    }
    crate::report::within("--fresh", args.fresh, 1..=1000)?;
    crate::report::within("--iterations", args.iterations, 1..=10_000)?;
    raise_nofile((args.idle + args.drip) as u64 * 2 + 1024);
    let (idle, drip, iterations, fresh, json) =
        (args.idle, args.drip, args.iterations, args.fresh, args.json);
    oncilla_cluster::run(crate::local(daemon, &[64 << 20, 64 << 20]), move |c| {
        let master = c.master()?;
        let target = master
            .nodes()?
            .into_iter()
            .map(|n| n.info)
            .find(|i| i.name == "node-1")
            .ok_or_else(|| BenchError::Failed("node-1 is not listed".into()))?;
        let addr: SocketAddr = target
            .data_addr
            .parse()
            .map_err(|e| BenchError::Failed(format!("node-1's data address: {e}")))?;
        if !addr.ip().is_loopback() {
            return Err(BenchError::Failed(format!(
                "node-1's data address {addr} is not loopback; the flood stays on loopback"
            )));
        }
        let socket = c.socket(0);
        let scenarios = [
            ("none", 0, 0),
            ("idle", idle, 0),
            ("dripping", 0, drip),
            ("idle+dripping", idle, drip),
            ("none (after)", 0, 0),
        ];
        let mut rows = Vec::new();
        for (name, n_idle, n_drip) in scenarios {
            if !json {
                eprint!("measuring with {name} hostile connections ...");
            }
            let flood = Flood::start(addr, n_idle, n_drip);
            let row = measure(&socket, &c.token, (iterations, fresh), name, &flood);
            flood.stop();
            if !json {
                eprintln!(" done");
            }
            rows.push(row?);
        }
        print(&rows, json);
        Ok(())
    })
}

/// One scenario's samples, in microseconds, by size and direction.
struct Row {
    scenario: &'static str,
    /// Hostile connections open on average while it ran.
    hostile: usize,
    /// (size, write samples, read samples, failed copies)
    sizes: Vec<(u64, Vec<f64>, Vec<f64>, usize)>,
    /// First copy of a fresh session (connect and handshake included).
    fresh: Vec<f64>,
    fresh_failed: usize,
    /// The first failure's message, if any copy failed.
    first_error: Option<String>,
}

fn measure(
    socket: &std::path::Path,
    token: &Token,
    (iterations, fresh): (usize, usize),
    scenario: &'static str,
    flood: &Flood,
) -> Result<Row, BenchError> {
    let started = Instant::now();
    let connect = || Oncilla::connect_with(Options::new(socket.to_path_buf(), token.clone()));
    let ocm = connect()?;
    let mut row = Row {
        scenario,
        hostile: 0,
        sizes: Vec::new(),
        fresh: Vec::new(),
        fresh_failed: 0,
        first_error: None,
    };
    let mut open_samples = Vec::new();
    for size in SIZES {
        let len = usize::try_from(size).unwrap_or(usize::MAX);
        let spec = AllocSpec::new(size, Kind::RemoteHost)
            .on_nodes(["node-1"])
            .fabric(Fabric::Tcp);
        let a = ocm.alloc_with(&spec)?;
        let data = pattern(len, size);
        let mut back = vec![0u8; len];
        for _ in 0..WARMUP {
            let _ = a.copy_in(0, &data);
            let _ = a.copy_out(0, &mut back);
        }
        let (mut w, mut r, mut failed) = (Vec::new(), Vec::new(), 0);
        for _ in 0..iterations {
            if started.elapsed() > PHASE_LIMIT {
                break;
            }
            open_samples.push(flood.open());
            let t = Instant::now();
            if let Err(e) = a.copy_in(0, &data) {
                failed += 1;
                row.first_error
                    .get_or_insert_with(|| format!("copy_in: {e}"));
                continue;
            }
            w.push(micros(t.elapsed()));
            let t = Instant::now();
            if let Err(e) = a.copy_out(0, &mut back) {
                failed += 1;
                row.first_error
                    .get_or_insert_with(|| format!("copy_out: {e}"));
                continue;
            }
            r.push(micros(t.elapsed()));
            if back != data {
                return Err(BenchError::Verify(format!(
                    "{} read back different under the {scenario} flood",
                    HumanBytes(size)
                )));
            }
        }
        a.free()?;
        row.sizes.push((size, w, r, failed));
    }
    for _ in 0..fresh {
        let outcome = connect().map_err(BenchError::from).and_then(|fresh| {
            let spec = AllocSpec::new(4096, Kind::RemoteHost)
                .on_nodes(["node-1"])
                .fabric(Fabric::Tcp);
            let a = fresh.alloc_with(&spec)?;
            let t = Instant::now();
            let copied = a.copy_in(0, &[1u8; 4096]);
            let took = t.elapsed();
            a.free()?;
            copied?;
            Ok(took)
        });
        match outcome {
            Ok(took) => row.fresh.push(micros(took)),
            Err(e) => {
                row.fresh_failed += 1;
                row.first_error
                    .get_or_insert_with(|| format!("new connection: {e}"));
            }
        }
    }
    row.hostile = if open_samples.is_empty() {
        0
    } else {
        open_samples.iter().sum::<usize>() / open_samples.len()
    };
    Ok(row)
}

fn print(rows: &[Row], json: bool) {
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "scenario": r.scenario,
                    "hostile_open": r.hostile,
                    "sizes": r.sizes.iter().map(|(size, w, rd, failed)| json!({
                        "size": size,
                        "write_p50_us": pct(w, 50.0), "write_p99_us": pct(w, 99.0),
                        "read_p50_us": pct(rd, 50.0), "read_p99_us": pct(rd, 99.0),
                        "failed": failed,
                    })).collect::<Vec<_>>(),
                    "fresh_p50_us": pct(&r.fresh, 50.0),
                    "fresh_p99_us": pct(&r.fresh, 99.0),
                    "fresh_failed": r.fresh_failed,
                    "first_error": r.first_error,
                })
            })
            .collect();
        oncilla_ops::json::print(&serde_json::Value::Array(v));
        return;
    }
    let mut t = Table::new(&["HOSTILE", "OPEN", "COPY", "P50 us", "P99 us", "FAILED"]);
    for r in rows {
        for (size, w, rd, failed) in &r.sizes {
            for (dir, s) in [("copy_in", w), ("copy_out", rd)] {
                t.row(vec![
                    r.scenario.to_string(),
                    r.hostile.to_string(),
                    format!("{dir} {}", HumanBytes(*size)),
                    format!("{:.0}", pct(s, 50.0)),
                    format!("{:.0}", pct(s, 99.0)),
                    failed.to_string(),
                ]);
            }
        }
        t.row(vec![
            r.scenario.to_string(),
            r.hostile.to_string(),
            "new connection 4 KiB".to_string(),
            format!("{:.0}", pct(&r.fresh, 50.0)),
            format!("{:.0}", pct(&r.fresh, 99.0)),
            r.fresh_failed.to_string(),
        ]);
    }
    print!("{}", t.render());
    for r in rows {
        if let Some(e) = &r.first_error {
            println!("{}: first failure: {e}", r.scenario);
        }
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Raises this process's soft RLIMIT_NOFILE towards `want` (never past the
/// hard limit), so the flood and the daemons it starts have descriptors.
fn raise_nofile(want: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let target = want.min(hard).max(soft);
        if target > soft {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, target, hard);
        }
    }
}

/// Hostile connections held open by a thread until stopped.
struct Flood {
    stop: Arc<AtomicBool>,
    open: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    fn start(addr: SocketAddr, idle: usize, drip: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let (s, o) = (Arc::clone(&stop), Arc::clone(&open));
        let thread =
            (idle + drip > 0).then(|| std::thread::spawn(move || flood(addr, idle, drip, &s, &o)));
        // Let the first wave connect before measuring.
        let ready = Instant::now();
        while open.load(Ordering::Relaxed) < (idle + drip) / 2
            && ready.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { stop, open, thread }
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Keeps `idle` silent and `drip` dripping connections to `addr` open,
/// re-opening what the agent closes, until `stop`.
fn flood(addr: SocketAddr, idle: usize, drip: usize, stop: &AtomicBool, open: &AtomicUsize) {
    let mut hello = Vec::new();
    // A hello with a wrong secret, sent one byte at a time.
    let _ = oncilla_net::wire::write_hello(&mut hello, b"not-the-secret");
    let mut slots: Vec<(Option<TcpStream>, bool, usize)> = (0..idle)
        .map(|_| (None, false, 0))
        .chain((0..drip).map(|_| (None, true, 0)))
        .collect();
    let mut last_drip = Instant::now() - Duration::from_secs(1);
    while !stop.load(Ordering::Relaxed) {
        let drip_now = last_drip.elapsed() >= Duration::from_secs(1);
        if drip_now {
            last_drip = Instant::now();
        }
        let mut n = 0;
        for (conn, dripping, sent) in &mut slots {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if conn.as_ref().is_some_and(closed) {
                *conn = None;
            }
            if conn.is_none() {
                *conn = TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                    .ok()
                    .filter(|s| s.set_nonblocking(true).is_ok());
                *sent = 0;
            }
            if let Some(s) = conn {
                if *dripping && drip_now && !hello.is_empty() {
                    let _ = s.write(&hello[*sent % hello.len()..][..1]);
                    *sent += 1;
                }
                n += 1;
            }
        }
        open.store(n, Ordering::Relaxed);
        std::thread::sleep(FLOOD_TICK);
    }
}

/// Whether the agent closed `s` (end-of-file or an error); `s` is
/// non-blocking.
fn closed(s: &TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match (&*s).read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}
