//! `ocmctl bench rate`: how many allocations a cluster makes per second
//! for clients that make many small ones, one at a time (`alloc`) and in
//! batches (`alloc_many`). A local cluster (one master, the benchmark's
//! own agent and `--agents` agents); for each number of clients and each
//! batch size, every client (a thread with a session of its own, all
//! starting together) makes `--allocs` 4 KiB remote allocations, each call
//! on the next agent in turn, and holds them; then all free them, in calls
//! of the same size (`free` each, or `free_many`). One row per case:
//! allocations per second, the p50/p99 of one call, frees per second and
//! the master's CPU while allocating.
//!
//! `--daemons PATH` runs the cluster's daemons from another `oncillad`
//! (an earlier build): the same clients against it, for before and after
//! in one run. A case the daemons cannot serve (batches, before they
//! existed) prints why instead of figures. It measures; it asserts
//! nothing.

use std::path::PathBuf;
use std::sync::Barrier;
use std::time::Instant;

use liboncilla::{AllocSpec, Kind, Oncilla, Options};
use oncilla_cluster::{Daemon, Handle};
use oncilla_ops::Table;

use crate::report::{master_cpu, pct, Machine};
use crate::BenchError;

/// Each allocation's size: one page.
const SIZE: u64 = 4 << 10;
/// Pool room an agent starts with beside its share of the allocations.
const SPARE: u64 = 64 << 20;

/// Options of `ocmctl bench rate`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct RateArgs {
    /// Agents the allocations are placed on (the benchmark's own agent
    /// comes on top and holds none).
    #[arg(long, default_value_t = 4)]
    agents: usize,
    /// Clients allocating at once, repeatable [default: 1 4 16].
    #[arg(long = "clients", value_name = "N")]
    clients: Vec<usize>,
    /// Allocations per call, repeatable (1: `alloc` and `free`; more:
    /// `alloc_many` and `free_many`)
    /// [default: 1 64].
    #[arg(long = "batch", value_name = "N")]
    batch: Vec<usize>,
    /// Allocations each client makes and holds per case.
    #[arg(long, default_value_t = 2048)]
    allocs: usize,
    /// Run the cluster's daemons from this `oncillad` binary (an earlier
    /// build, to compare against) instead of this program.
    #[arg(long, value_name = "PATH")]
    daemons: Option<PathBuf>,
}

/// One case's figures, or why the daemons could not serve it.
struct Case {
    clients: usize,
    batch: usize,
    outcome: Result<Figures, String>,
}

struct Figures {
    allocs_per_s: f64,
    call_us: Vec<f64>,
    frees_per_s: f64,
    /// The master's CPU while allocating, percent of one core.
    master_cpu: f64,
}

/// Runs every case on one local cluster and prints the table.
///
/// # Errors
/// Bad options, a cluster that does not start, a master whose CPU time
/// cannot be read.
pub fn run(args: &RateArgs, daemon: &Daemon) -> Result<(), BenchError> {
    let clients = or_default(&args.clients, &[1, 4, 16]);
    let batches = or_default(&args.batch, &[1, 64]);
    crate::report::within("--agents", args.agents, 1..=15)?;
    for &c in &clients {
        crate::report::within("--clients", c, 1..=64)?;
    }
    for &b in &batches {
        crate::report::within("--batch", b, 1..=oncilla_model::alloc::MAX_BATCH as usize)?;
    }
    crate::report::within("--allocs", args.allocs, 1..=100_000)?;
    let daemon = match &args.daemons {
        Some(path) => Daemon::Binary(path.clone()),
        None => daemon.clone(),
    };
    // The most held at once, shared by the agents with a quarter more for
    // uneven placement, and spare room.
    let most = clients.iter().max().copied().unwrap_or(1) * args.allocs;
    let share = (most as u64 * SIZE).div_ceil(args.agents as u64) / 4 * 5;
    let capacity = (share + SPARE).div_ceil(1 << 20) << 20;
    let mut capacities = vec![64 << 20];
    capacities.extend(std::iter::repeat_n(capacity, args.agents));
    let allocs = args.allocs;
    let (machine, cases) = oncilla_cluster::run(crate::local(&daemon, &capacities), move |h| {
        let machine = Machine::of(&h.master()?.nodes()?);
        let mut cases = Vec::new();
        for &c in &clients {
            for &b in &batches {
                eprint!("{c} clients, batches of {b} ...");
                let outcome = case(h, c, b, allocs)?;
                eprintln!(" done");
                cases.push(Case {
                    clients: c,
                    batch: b,
                    outcome,
                });
            }
        }
        Ok::<_, BenchError>((machine, cases))
    })?;
    println!("{machine}");
    let who = match &args.daemons {
        Some(p) => format!("daemons from {}", p.display()),
        None => "daemons of this build".into(),
    };
    println!(
        "{} agents, {who}; each client makes and holds {allocs} allocations of {SIZE} B, then frees them\n",
        args.agents
    );
    let mut t = Table::new(&[
        "clients",
        "batch",
        "allocs/s",
        "call p50",
        "call p99",
        "frees/s",
        "master CPU",
    ]);
    for c in &cases {
        let mut row = vec![c.clients.to_string(), c.batch.to_string()];
        match &c.outcome {
            Ok(f) => row.extend([
                format!("{:.0}", f.allocs_per_s),
                format!("{:.2} ms", pct(&f.call_us, 50.0) / 1e3),
                format!("{:.2} ms", pct(&f.call_us, 99.0) / 1e3),
                format!("{:.0}", f.frees_per_s),
                format!("{:.0}%", f.master_cpu),
            ]),
            Err(why) => row.extend([
                format!("not served: {why}"),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]),
        }
        t.row(row);
    }
    print!("{}", t.render());
    Ok(())
}

fn or_default(given: &[usize], default: &[usize]) -> Vec<usize> {
    let mut v = if given.is_empty() {
        default.to_vec()
    } else {
        given.to_vec()
    };
    v.sort_unstable();
    v.dedup();
    v
}

/// One case: `clients` threads, each making `allocs` allocations in calls
/// of `batch`, then freeing them. `Err` inside: a call the daemons refused
/// (the first client's error).
fn case(
    h: &Handle,
    clients: usize,
    batch: usize,
    allocs: usize,
) -> Result<Result<Figures, String>, BenchError> {
    let socket = h.socket(0);
    let pid = h
        .master_pid(0)
        .ok_or_else(|| BenchError::Failed("the master is not running".into()))?;
    // Remote memory only: node-0 is the clients' own node.
    let nodes: Vec<String> = (1..h.agents).map(oncilla_cluster::node_name).collect();
    let sessions = (0..clients)
        .map(|_| Oncilla::connect_with(Options::without_token(socket.clone())))
        .collect::<Result<Vec<_>, _>>()?;
    let start = Barrier::new(clients + 1);
    let freeing = Barrier::new(clients + 1);
    let (made, took, cpu, freed) = std::thread::scope(|s| {
        let workers: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(i, ocm)| {
                let (start, freeing, nodes) = (&start, &freeing, &nodes);
                s.spawn(move || {
                    let mut held = Vec::with_capacity(allocs);
                    let mut call_us = Vec::new();
                    let mut failed = None;
                    start.wait();
                    let mut k = i;
                    while held.len() < allocs && failed.is_none() {
                        let n = batch.min(allocs - held.len());
                        let spec = AllocSpec::new(SIZE, Kind::RemoteHost)
                            .on_nodes([&nodes[k % nodes.len()]]);
                        k += 1;
                        let t = Instant::now();
                        let got = if n == 1 {
                            ocm.alloc_with(&spec).map(|a| vec![a])
                        } else {
                            ocm.alloc_many(&spec, n)
                        };
                        match got {
                            Ok(mut v) => {
                                call_us.push(t.elapsed().as_secs_f64() * 1e6);
                                held.append(&mut v);
                            }
                            Err(e) => {
                                failed = Some(e.to_string().chars().take(80).collect());
                            }
                        }
                    }
                    freeing.wait();
                    if batch > 1 && failed.is_none() {
                        for chunk in held.chunks_mut(batch) {
                            if let Err(e) = ocm.free_many(chunk) {
                                // The rest are freed one by one as they drop.
                                let why = format!("free_many: {e}");
                                failed = Some(why.chars().take(80).collect());
                                break;
                            }
                        }
                    }
                    drop(held);
                    (call_us, failed)
                })
            })
            .collect();
        let cpu0 = master_cpu(pid);
        start.wait();
        let t = Instant::now();
        freeing.wait();
        let took = t.elapsed();
        let cpu = master_cpu(pid);
        let t = Instant::now();
        let made: Vec<_> = workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| (Vec::new(), Some("a client panicked".into())))
            })
            .collect();
        (made, took, cpu.and_then(|c| Ok(c - cpu0?)), t.elapsed())
    });
    if let Some(why) = made.iter().find_map(|(_, f)| f.clone()) {
        return Ok(Err(why));
    }
    let secs = took.as_secs_f64().max(1e-9);
    let total = (clients * allocs) as f64;
    Ok(Ok(Figures {
        allocs_per_s: total / secs,
        call_us: made.into_iter().flat_map(|(c, _)| c).collect(),
        frees_per_s: total / freed.as_secs_f64().max(1e-9),
        master_cpu: cpu?.as_secs_f64() / secs * 100.0,
    }))
}
