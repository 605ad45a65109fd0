//! `ocmctl bench table`: what an allocation costs the master as its table
//! grows. A local cluster (one master, the benchmark's own agent and
//! `--agents` agents) is filled by `--sessions` filler processes, each a
//! session holding 4 KiB remote allocations (as applications hold them:
//! through their local agent), to each stage of `--held`; at each stage a
//! probe session times `--probe` alloc/free pairs. One row per stage:
//! allocations per second while filling up to it, the master's CPU over
//! that time, the probe's alloc and free p50/p99, and the master's resident
//! memory. It measures; it asserts nothing.
//!
//! A filler (`ocmctl bench table-filler`, internal) reads a count per line
//! on stdin, allocates that many more and answers `done`; when its stdin
//! closes it exits without freeing (its session ends with the process,
//! and its allocations with the session).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Kind, Oncilla, Options};
use oncilla_cluster::{Daemon, Handle};
use oncilla_model::alloc::MAX_BATCH;
use oncilla_ops::Table;

use crate::report::{master_cpu, master_rss, pct, Machine};
use crate::BenchError;

/// Each allocation's size: one page, the smallest a table can hold most of.
const SIZE: u64 = 4 << 10;
/// Most allocations a run may hold.
const MAX_HELD: u64 = 2_000_000;
/// Untimed alloc/free pairs before each stage's probe (the first on a
/// new connection pays for setting it up).
const WARMUP: usize = 3;
/// Pool room an agent starts with beside its share of the allocations.
const SPARE: u64 = 64 << 20;

/// Options of `ocmctl bench table`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct TableArgs {
    /// Agents the allocations are placed on (the benchmark's own agent
    /// comes on top and holds none).
    #[arg(long, default_value_t = 4)]
    agents: usize,
    /// Filler sessions allocating at once (separate processes).
    #[arg(long, default_value_t = 3)]
    sessions: usize,
    /// Allocations held at each measured stage, repeatable [default: 0
    /// 10000 100000].
    #[arg(long = "held", value_name = "N")]
    held: Vec<u64>,
    /// Alloc/free pairs the probe times at each stage.
    #[arg(long, default_value_t = 100)]
    probe: usize,
    /// Allocations per filler call (1: `alloc`; more: `alloc_many`, each
    /// batch on the next node), to reach large tables sooner.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// After the last stage, kill -9 the master and start it again: the
    /// time until it accepts an allocation and until it lists every
    /// allocation held again (rebuilt from the agents' reports).
    #[arg(long)]
    restart: bool,
}

/// Options of the filler process (internal).
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct FillerArgs {
    /// The local agent's socket.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Nodes to place on, one call on each in turn.
    #[arg(long, value_name = "NAME", required = true)]
    node: Vec<String>,
    /// Allocations per call.
    #[arg(long, default_value_t = 1)]
    batch: usize,
}

/// One stage's figures.
struct Stage {
    held: u64,
    /// Allocations per second while filling up to this stage, and the
    /// master's CPU (percent of one core) meanwhile; none at the start.
    fill: Option<(f64, f64)>,
    alloc_us: Vec<f64>,
    free_us: Vec<f64>,
    rss: u64,
}

/// Runs the stages on a local cluster and prints the table.
///
/// # Errors
/// Bad options, a cluster or filler that does not start, and any failed
/// allocation or free.
pub fn run(args: &TableArgs, daemon: &Daemon) -> Result<(), BenchError> {
    let mut held = if args.held.is_empty() {
        vec![0, 10_000, 100_000]
    } else {
        args.held.clone()
    };
    held.sort_unstable();
    held.dedup();
    let most = held.last().copied().unwrap_or(0);
    if most > MAX_HELD {
        return Err(BenchError::Usage(format!(
            "--held must be at most {MAX_HELD}"
        )));
    }
    crate::report::within("--agents", args.agents, 1..=15)?;
    crate::report::within("--sessions", args.sessions, 1..=64)?;
    crate::report::within("--probe", args.probe, 1..=100_000)?;
    crate::report::within("--batch", args.batch, 1..=MAX_BATCH as usize)?;
    // Each agent's share, a quarter more for uneven placement, and spare
    // room; node-0 is the benchmark's own agent.
    let agents = args.agents as u64;
    let share = (most * SIZE).div_ceil(agents) / 4 * 5;
    let capacity = (share + SPARE).div_ceil(1 << 20) << 20;
    let mut capacities = vec![64 << 20];
    capacities.extend(std::iter::repeat_n(capacity, args.agents));
    let (sessions, probe, batch) = (args.sessions, args.probe, args.batch);
    let restart = args.restart;
    let (machine, stages, restarted) =
        oncilla_cluster::run(crate::local(daemon, &capacities), move |h| {
            measure(h, &held, sessions, probe, batch, restart)
        })?;
    println!("{machine}");
    println!(
        "{} agents of {} MiB, {sessions} filling sessions (batches of {batch}), {} B allocations, {probe} probe pairs per stage\n",
        args.agents,
        capacity >> 20,
        SIZE
    );
    let mut t = Table::new(&[
        "held",
        "fill allocs/s",
        "master CPU",
        "alloc p50",
        "alloc p99",
        "free p50",
        "free p99",
        "master RSS",
    ]);
    for s in &stages {
        let (rate, cpu) = s
            .fill
            .map(|(r, c)| (format!("{r:.0}"), format!("{c:.0}%")))
            .unwrap_or_else(|| ("-".into(), "-".into()));
        t.row(vec![
            s.held.to_string(),
            rate,
            cpu,
            format!("{:.2} ms", pct(&s.alloc_us, 50.0) / 1e3),
            format!("{:.2} ms", pct(&s.alloc_us, 99.0) / 1e3),
            format!("{:.2} ms", pct(&s.free_us, 50.0) / 1e3),
            format!("{:.2} ms", pct(&s.free_us, 99.0) / 1e3),
            format!("{} MB", s.rss / 1_000_000),
        ]);
    }
    print!("{}", t.render());
    match restarted {
        Some(Ok(r)) => println!(
            "\nmaster restarted (kill -9) holding {}: an allocation accepted after {:.1} s, all relisted after {:.1} s",
            r.held,
            r.accepted.as_secs_f64(),
            r.relisted.as_secs_f64()
        ),
        Some(Err(why)) => println!("\nmaster restarted (kill -9): {why}"),
        None => {}
    }
    Ok(())
}

/// What a run measured: the machine, each stage, and the restart (when
/// asked: its figures, or why it failed).
type Measured = (Machine, Vec<Stage>, Option<Result<Restarted, String>>);

/// What a restart of the master cost (`--restart`).
struct Restarted {
    held: u64,
    /// From the kill to the first allocation done.
    accepted: Duration,
    /// From the kill to the master listing every allocation held.
    relisted: Duration,
}

/// Most time a restarted master may take to list every allocation again.
const RELIST_LIMIT: Duration = Duration::from_secs(600);

/// Fills the cluster `h` stage by stage and probes each.
fn measure(
    h: &Handle,
    held: &[u64],
    sessions: usize,
    probe: usize,
    batch: usize,
    restart: bool,
) -> Result<Measured, BenchError> {
    let socket = h.socket(0);
    let machine = Machine::of(&h.master()?.nodes()?);
    let pid = h
        .master_pid(0)
        .ok_or_else(|| BenchError::Failed("the master is not running".into()))?;
    // Remote memory only: node-0 is the sessions' own node.
    let nodes: Vec<String> = (1..h.agents).map(oncilla_cluster::node_name).collect();
    let mut fillers = (0..sessions)
        .map(|_| Filler::start(&socket, &nodes, batch))
        .collect::<Result<Vec<_>, _>>()?;
    let ocm = Oncilla::connect_with(Options::without_token(socket.clone()))?;
    let mut stages = Vec::new();
    let mut now = 0u64;
    for &target in held {
        let fill = if target > now {
            eprint!("filling to {target} ...");
            let more = target - now;
            let cpu0 = master_cpu(pid)?;
            let started = Instant::now();
            // Shares as even as they come; every filler works at once.
            for (i, f) in fillers.iter_mut().enumerate() {
                let i = i as u64;
                let n = more / sessions as u64 + u64::from(i < more % sessions as u64);
                f.ask(n)?;
            }
            for f in &mut fillers {
                f.done()?;
            }
            let took = started.elapsed().as_secs_f64().max(1e-9);
            let cpu = (master_cpu(pid)? - cpu0).as_secs_f64() / took * 100.0;
            eprintln!(" {took:.1} s");
            now = target;
            Some((more as f64 / took, cpu))
        } else {
            None
        };
        let mut stage = Stage {
            held: now,
            fill,
            alloc_us: Vec::with_capacity(probe),
            free_us: Vec::with_capacity(probe),
            rss: 0,
        };
        for i in 0..WARMUP + probe {
            let spec = AllocSpec::new(SIZE, Kind::RemoteHost).on_nodes([&nodes[i % nodes.len()]]);
            let started = Instant::now();
            let a = ocm.alloc_with(&spec)?;
            let alloc = started.elapsed();
            let started = Instant::now();
            a.free()?;
            if i >= WARMUP {
                stage.alloc_us.push(alloc.as_secs_f64() * 1e6);
                stage.free_us.push(started.elapsed().as_secs_f64() * 1e6);
            }
        }
        stage.rss = master_rss(pid)?;
        stages.push(stage);
    }
    let restarted = restart.then(|| {
        eprintln!("restarting the master holding {now} ...");
        restart_master(h, &ocm, now).map_err(|e| e.to_string())
    });
    // The fillers exit without freeing; the cluster goes with them.
    drop(fillers);
    Ok((machine, stages, restarted))
}

/// Kills the master, starts it again and times it back to work: the
/// first allocation placed where it chooses (the client waits through its
/// recovery window; agents may still be registering), then every one of
/// `held` listed (polled, at most [`RELIST_LIMIT`]).
fn restart_master(h: &Handle, ocm: &Oncilla, held: u64) -> Result<Restarted, BenchError> {
    h.kill_master();
    let killed = Instant::now();
    h.start_master()?;
    // Refused while the master is not listening yet: asked again.
    let a = loop {
        match ocm.alloc(SIZE, Kind::RemoteHost) {
            Ok(a) => break a,
            Err(e) if killed.elapsed() > RELIST_LIMIT => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let accepted = killed.elapsed();
    a.free()?;
    let master = h.master()?;
    loop {
        // Counted page by page; errors while it is still starting are
        // waited out like a short count.
        let listed = master.allocation_count().unwrap_or(0) as u64;
        if listed >= held {
            break;
        }
        if killed.elapsed() > RELIST_LIMIT {
            return Err(BenchError::Failed(format!(
                "the restarted master listed {listed} of {held} allocations after {} s",
                RELIST_LIMIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(Restarted {
        held,
        accepted,
        relisted: killed.elapsed(),
    })
}

/// A filler process and its pipes.
struct Filler {
    child: Child,
    ask: Option<ChildStdin>,
    answers: BufReader<ChildStdout>,
}

impl Filler {
    fn start(socket: &std::path::Path, nodes: &[String], batch: usize) -> Result<Self, BenchError> {
        let exe = std::env::current_exe().map_err(|e| {
            BenchError::Failed(format!("cannot find this program to start a filler: {e}"))
        })?;
        let mut child = Command::new(exe)
            .args(["bench", "table-filler", "--socket"])
            .arg(socket)
            .args(nodes.iter().flat_map(|n| ["--node", n]))
            .arg(format!("--batch={batch}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| BenchError::Failed(format!("cannot start a filler: {e}")))?;
        let (Some(ask), Some(out)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(BenchError::Failed("a filler has no pipes".into()));
        };
        Ok(Self {
            child,
            ask: Some(ask),
            answers: BufReader::new(out),
        })
    }

    fn ask(&mut self, n: u64) -> Result<(), BenchError> {
        let ask = self
            .ask
            .as_mut()
            .ok_or_else(|| BenchError::Failed("a filler was closed".into()))?;
        writeln!(ask, "{n}")
            .and_then(|()| ask.flush())
            .map_err(|e| BenchError::Failed(format!("a filler went away: {e}")))
    }

    fn done(&mut self) -> Result<(), BenchError> {
        let mut line = String::new();
        self.answers
            .read_line(&mut line)
            .map_err(|e| BenchError::Failed(format!("a filler went away: {e}")))?;
        match line.trim() {
            "done" => Ok(()),
            "" => Err(BenchError::Failed("a filler exited".into())),
            why => Err(BenchError::Failed(format!("a filler failed: {why}"))),
        }
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        // Its stdin closes: it exits at once, freeing nothing itself.
        self.ask = None;
        let _ = self.child.wait();
    }
}

/// The filler: allocates as many more as each line asks, keeps them, and
/// exits when its stdin closes.
///
/// # Errors
/// A session that cannot be opened.
pub fn filler(args: &FillerArgs) -> Result<(), BenchError> {
    let ocm = Oncilla::connect_with(Options::without_token(args.socket.clone()))?;
    let specs: Vec<AllocSpec> = args
        .node
        .iter()
        .map(|n| AllocSpec::new(SIZE, Kind::RemoteHost).on_nodes([n]))
        .collect();
    let mut next = specs.iter().cycle();
    let mut kept = Vec::new();
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let Ok(n) = line.map(|l| l.trim().parse::<u64>()) else {
            break;
        };
        let answer = match n {
            Ok(n) => {
                let mut failed = None;
                let mut left = usize::try_from(n).unwrap_or(usize::MAX);
                while left > 0 && failed.is_none() {
                    let (spec, k) = (next.next(), args.batch.clamp(1, left));
                    let made = match spec {
                        Some(spec) if k == 1 => ocm.alloc_with(spec).map(|a| vec![a]),
                        Some(spec) => ocm.alloc_many(spec, k),
                        None => break,
                    };
                    match made {
                        Ok(mut v) => {
                            left -= v.len();
                            kept.append(&mut v);
                        }
                        Err(e) => failed = Some(e.to_string().replace('\n', " ")),
                    }
                }
                failed.unwrap_or_else(|| "done".into())
            }
            Err(e) => format!("not a count: {e}"),
        };
        if writeln!(out, "{answer}")
            .and_then(|()| out.flush())
            .is_err()
        {
            break;
        }
    }
    // Without freeing one by one: the session's end frees them all.
    let _ = out.flush();
    std::process::exit(0);
}
