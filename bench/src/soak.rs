//! `ocmctl bench soak`: a fault-injection soak on a local cluster. Several
//! clients (each its own session) allocate with random sizes and
//! placements, write seeded patterns, read them back and verify every
//! byte, and free, while the last agent is killed with SIGKILL and started
//! again (empty) at intervals. At the end every client frees what it holds
//! and exits, and the soak waits for the cluster to settle and counts what
//! is left.
//!
//! It prints what it did and what went wrong, by kind. Errors are expected
//! (copies to the restarted node fail while it is away, and its
//! allocations are lost); corrupted bytes (a read that succeeds with bytes
//! other than those written) and leaks (memory still held after everyone
//! left) are not: either makes the command fail.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Allocation, Error, Kind, Oncilla, Options, Policy};
use oncilla_model::size::{parse_size, HumanBytes};
use rand::{Rng, SeedableRng};

use crate::probe::Probe;
use crate::BenchError;
use oncilla_cluster::{node_name, Daemon, Handle};
use oncilla_ops::Table;

/// Allocations a client keeps at once.
const MAX_LIVE: usize = 4;
/// Longest wait for the cluster to settle at the end.
const SETTLE: Duration = Duration::from_secs(30);

/// Options of `ocmctl bench soak`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct SoakArgs {
    /// How long the clients run.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Client processes' sessions (threads, each with its own session).
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Agents in the cluster (at least 2); the last one is restarted.
    #[arg(long, default_value_t = 3)]
    agents: usize,
    /// Pool of each agent.
    #[arg(long, default_value = "256MiB")]
    capacity: String,
    /// Times the last agent is killed and restarted, evenly spread.
    #[arg(long, default_value_t = 2)]
    restarts: usize,
    /// Largest allocation a client makes.
    #[arg(long, default_value = "4MiB")]
    max_size: String,
}

/// What the clients did, shared by their threads.
#[derive(Default)]
struct Stats {
    allocs: AtomicU64,
    writes: AtomicU64,
    verifies: AtomicU64,
    frees: AtomicU64,
    bytes_written: AtomicU64,
    bytes_verified: AtomicU64,
    corrupted_bytes: AtomicU64,
    /// Allocations given up (and freed) because a copy failed.
    abandoned: AtomicU64,
    /// Error kind -> (count, first message).
    errors: Mutex<BTreeMap<&'static str, (u64, String)>>,
}

impl Stats {
    fn error(&self, e: &Error) {
        let kind = match e {
            Error::NodeUnreachable { .. } => "node unreachable",
            Error::NotFound(_) => "not found",
            Error::NodeDown(_) => "node down",
            Error::CapacityExhausted(_) => "capacity exhausted",
            Error::Unavailable(_) => "master unavailable",
            Error::Fabric { .. } => "fabric",
            _ => "other",
        };
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        let entry = errors.entry(kind).or_insert((0, e.to_string()));
        entry.0 += 1;
    }
}

/// One allocation a client holds, with the seed of what it last wrote.
struct Live {
    a: Allocation,
    seed: u64,
}

/// Runs the soak and prints its report.
///
/// # Errors
/// Bad options, a cluster that does not start, an agent that does not come
/// back, and any corrupted byte or leak.
pub fn run(args: &SoakArgs, daemon: &Daemon) -> Result<(), BenchError> {
    if args.agents < 2 || args.clients == 0 || args.seconds == 0 {
        return Err(BenchError::Failed(
            "need --agents >= 2, --clients >= 1 and --seconds >= 1".into(),
        ));
    }
    let capacity =
        parse_size(&args.capacity).map_err(|e| BenchError::Usage(format!("--capacity: {e}")))?;
    let max_size =
        parse_size(&args.max_size).map_err(|e| BenchError::Usage(format!("--max-size: {e}")))?;
    if max_size < 4096 || max_size > capacity / 8 {
        return Err(BenchError::Failed(format!(
            "--max-size must be between 4 KiB and an eighth of --capacity ({})",
            HumanBytes(capacity / 8)
        )));
    }
    let caps = vec![capacity; args.agents];
    let (seconds, clients, restarts) = (args.seconds, args.clients, args.restarts);
    let report = oncilla_cluster::run(crate::local(daemon, &caps), move |h| {
        soak(h, seconds, clients, restarts, max_size)
    })?;
    print!("{}", report.text);
    if report.corrupted > 0 || report.leaked > 0 {
        return Err(BenchError::Verify(format!(
            "soak failed: {} corrupted bytes, {} leaked",
            report.corrupted, report.leaked
        )));
    }
    Ok(())
}

struct Report {
    text: String,
    corrupted: u64,
    leaked: u64,
}

fn soak(
    h: &Handle,
    seconds: u64,
    clients: usize,
    restarts: usize,
    max_size: u64,
) -> Result<Report, BenchError> {
    let victim = h.agents - 1;
    let stats = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    eprintln!(
        "soak: {clients} clients for {seconds}s; node-{victim} is killed and restarted {restarts} times"
    );
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            // Sessions live on the agents that stay up.
            let opts = Options::new(h.socket(i % victim), h.token.clone());
            let (stats, stop) = (Arc::clone(&stats), Arc::clone(&stop));
            let seed = rand::random::<u64>();
            let nodes: Vec<String> = (0..h.agents).map(node_name).collect();
            std::thread::Builder::new()
                .name(format!("soak-client-{i}"))
                .spawn(move || client(opts, &nodes, &stats, &stop, max_size, seed))
                .map_err(|e| BenchError::Failed(format!("cannot start a client thread: {e}")))
        })
        .collect::<Result<_, _>>()?;

    let total = Duration::from_secs(seconds);
    let mut done_restarts = 0;
    let mut restart_error = None;
    while started.elapsed() < total {
        let due = total.mul_f64((done_restarts + 1) as f64 / (restarts + 1) as f64);
        if done_restarts < restarts && started.elapsed() >= due {
            eprintln!(
                "  {:>5.1}s restarting node-{victim}",
                started.elapsed().as_secs_f64()
            );
            if let Err(e) = h.restart_agent(victim) {
                restart_error = Some(e);
                break;
            }
            done_restarts += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    let mut client_errors = Vec::new();
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => client_errors.push(e.to_string()),
            Err(_) => client_errors.push("a client thread panicked".into()),
        }
    }
    let ran = started.elapsed();
    if let Some(e) = restart_error {
        return Err(e.into());
    }
    if let Some(e) = client_errors.first() {
        return Err(BenchError::Failed(format!("a client could not run: {e}")));
    }
    eprintln!("  clients done; waiting for the cluster to settle");
    let leftover = settle(h)?;
    Ok(report(
        &stats,
        ran,
        clients,
        h.agents,
        done_restarts,
        &leftover,
    ))
}

/// One client: its own session, random operations until `stop`, then it
/// frees what it holds and closes its session.
fn client(
    opts: Options,
    nodes: &[String],
    stats: &Stats,
    stop: &AtomicBool,
    max_size: u64,
    seed: u64,
) -> Result<(), Error> {
    let ocm = Oncilla::connect_with(opts)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut live: Vec<Live> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let roll = rng.random_range(0..100);
        if live.is_empty() || (live.len() < MAX_LIVE && roll < 30) {
            let spec = random_spec(&mut rng, nodes, max_size);
            let a = match ocm.alloc_with(&spec) {
                Ok(a) => a,
                Err(e) => {
                    stats.error(&e);
                    continue;
                }
            };
            stats.allocs.fetch_add(1, Ordering::Relaxed);
            let mut l = Live { a, seed: 0 };
            if write(&mut l, rng.random(), stats) {
                live.push(l);
            }
        } else {
            let i = rng.random_range(0..live.len());
            let keep = if roll < 55 {
                verify(&live[i], stats)
            } else if roll < 80 {
                write(&mut live[i], rng.random(), stats) && verify(&live[i], stats)
            } else {
                false
            };
            if !keep {
                free(live.swap_remove(i), stats);
            }
        }
    }
    for l in live {
        free(l, stats);
    }
    Ok(())
}

fn random_spec(rng: &mut impl Rng, nodes: &[String], max_size: u64) -> AllocSpec {
    // Log-uniform between 4 KiB and max_size, with odd tails.
    let bits = rng.random_range(12.0..(max_size as f64).log2());
    let size = (2f64.powf(bits) as u64).max(1) + rng.random_range(0..4096);
    let size = size.min(max_size);
    match rng.random_range(0..4) {
        0 => AllocSpec::new(size, Kind::RemoteHost),
        1 => AllocSpec::new(size, Kind::RemoteHost)
            .policy(Policy::Spread)
            .stripe(64 << 10),
        2 => AllocSpec::new(size, Kind::LocalHost),
        _ => {
            let n = &nodes[rng.random_range(0..nodes.len())];
            AllocSpec::new(size, Kind::RemoteHost).on_nodes([n.as_str()])
        }
    }
}

/// Writes a fresh pattern; false when the allocation must be given up.
fn write(l: &mut Live, seed: u64, stats: &Stats) -> bool {
    let data = pattern(seed, l.a.size() as usize);
    match l.a.copy_in(0, &data) {
        Ok(()) => {
            l.seed = seed;
            stats.writes.fetch_add(1, Ordering::Relaxed);
            stats
                .bytes_written
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            true
        }
        Err(e) => {
            // Some bytes may have landed: the content is unknown now.
            stats.error(&e);
            stats.abandoned.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

/// Reads everything back and compares; false when the allocation must be
/// given up (a failed read). A read that succeeds with other bytes than
/// written is corruption.
fn verify(l: &Live, stats: &Stats) -> bool {
    let want = pattern(l.seed, l.a.size() as usize);
    let mut got = vec![0u8; want.len()];
    match l.a.copy_out(0, &mut got) {
        Ok(()) => {
            let bad = want.iter().zip(&got).filter(|(a, b)| a != b).count() as u64;
            stats.corrupted_bytes.fetch_add(bad, Ordering::Relaxed);
            stats.verifies.fetch_add(1, Ordering::Relaxed);
            stats
                .bytes_verified
                .fetch_add(want.len() as u64, Ordering::Relaxed);
            true
        }
        Err(e) => {
            stats.error(&e);
            stats.abandoned.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

fn free(l: Live, stats: &Stats) {
    match l.a.free() {
        Ok(()) => {
            stats.frees.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => stats.error(&e),
    }
}

/// A seeded pattern (splitmix64 words): cheap to make, never all zeros.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut x = seed;
    while out.len() < len {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// What is still held once everyone left.
#[derive(Default)]
struct Leftover {
    allocations: usize,
    used: u64,
    held_by_agents: u64,
    /// Used or still scrubbing in the agents' own pools.
    in_pools: u64,
}

impl Leftover {
    fn total(&self) -> u64 {
        self.allocations as u64 + self.used + self.held_by_agents + self.in_pools
    }
}

/// Waits (bounded) until the master lists nothing and every agent holds
/// nothing and scrubs nothing; returns what is left then.
fn settle(h: &Handle) -> Result<Leftover, BenchError> {
    let master = h.master()?;
    // Agents keep their addresses (restarts included): one probe serves.
    let probe = Probe::new(&master.nodes()?, &h.token, master.tls())?;
    let deadline = Instant::now() + SETTLE;
    loop {
        let nodes = master.nodes()?;
        let agents = probe.statuses()?;
        let left = Leftover {
            allocations: master.allocations()?.len(),
            used: nodes.iter().map(|n| n.used).sum(),
            held_by_agents: agents.iter().map(|s| u64::from(s.allocations)).sum(),
            in_pools: agents.iter().map(|s| s.pool.scrubbing + s.pool.used).sum(),
        };
        if left.total() == 0 || Instant::now() > deadline {
            return Ok(left);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn report(
    s: &Stats,
    ran: Duration,
    clients: usize,
    agents: usize,
    restarts: usize,
    left: &Leftover,
) -> Report {
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut out = format!(
        "\nsoak: {:.1}s, {clients} clients, {agents} agents, node-{} restarted {restarts} times\n\n",
        ran.as_secs_f64(),
        agents - 1
    );
    let mut t = Table::new(&["OPERATION", "DONE"]);
    for (what, v) in [
        ("alloc", n(&s.allocs)),
        ("write", n(&s.writes)),
        ("verify", n(&s.verifies)),
        ("free", n(&s.frees)),
    ] {
        t.row(vec![what.into(), v.to_string()]);
    }
    out += &t.render();
    out += &format!(
        "\nbytes written   {}\nbytes verified  {}\n\n",
        HumanBytes(n(&s.bytes_written)),
        HumanBytes(n(&s.bytes_verified))
    );
    let errors = s.errors.lock().unwrap_or_else(|p| p.into_inner());
    let mut t = Table::new(&["ERROR", "COUNT", "FIRST MESSAGE"]);
    for (kind, (count, msg)) in errors.iter() {
        let mut msg = msg.clone();
        if msg.len() > 100 {
            msg.truncate(97);
            msg.push_str("...");
        }
        t.row(vec![kind.to_string(), count.to_string(), msg]);
    }
    if errors.is_empty() {
        out += "errors: none\n";
    } else {
        out += &t.render();
    }
    let corrupted = n(&s.corrupted_bytes);
    out += &format!(
        "\nallocations given up after a failed copy  {}\ncorrupted bytes  {corrupted}\n\
         leaked at the end: {} allocations listed, {} placed, {} allocations held by agents, {} in agent pools\n",
        n(&s.abandoned),
        left.allocations,
        HumanBytes(left.used),
        left.held_by_agents,
        HumanBytes(left.in_pools),
    );
    Report {
        text: out,
        corrupted,
        leaked: left.total(),
    }
}
