//! `ocmctl bench replicas`: what copies cost a replicated allocation's
//! writes and reads, with 1, 2 and 3 copies measured in one run on one
//! local cluster, beside raw TCP over the same loopback with the same
//! number of connections. The session runs on node-0; the primary is on
//! node-1 and the replicas on node-2 and node-3, so every byte crosses the
//! network once to the primary and once more per replica.
//!
//! Then the re-creation of a lost copy: the replica's node is killed and
//! the master has the primary's agent send the whole share to the node
//! left (agent to agent); its rate is the agent's own count of the fill.
//!
//! It measures; it asserts nothing but that the bytes read back.

use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Fabric, Kind, Oncilla, Options};
use oncilla_model::size::{parse_size, HumanBytes};
use oncilla_ops::Table;

use crate::rawtcp::{self, RawClient};
use crate::report::{gib_per_s, pattern, pct};
use crate::BenchError;
use oncilla_cluster::{Daemon, Handle};
use oncilla_model::alloc::AllocRef;
use oncilla_ops::Master;

/// The small write whose latency is measured.
const SMALL: usize = 4 << 10;
/// Connections per node, for Oncilla and the raw baseline alike.
const STREAMS: usize = 4;

/// Options of `ocmctl bench replicas`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct ReplicasArgs {
    /// Size of the large copies (bandwidth), e.g. 64MiB.
    #[arg(long, default_value = "64MiB")]
    size: String,
    /// Large copies per point (the median is shown).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// 4 KiB writes per point (p50 and p99 are shown).
    #[arg(long, default_value_t = 500)]
    small: usize,
}

/// How many copies each point makes.
#[derive(Debug, Clone, Copy)]
struct Counts {
    rounds: usize,
    small: usize,
}

/// One row's numbers.
struct Row {
    small_p50_us: f64,
    small_p99_us: f64,
    write_gib_s: f64,
    read_gib_s: f64,
}

/// Runs the points and prints the table.
///
/// # Errors
/// Bad options, a cluster that does not start, failed copies, bytes that
/// do not read back.
pub fn run(args: &ReplicasArgs, daemon: &Daemon) -> Result<(), BenchError> {
    let size = parse_size(&args.size).map_err(|e| BenchError::Usage(format!("--size: {e}")))?;
    if size < SMALL as u64 || size > 1 << 30 {
        return Err(BenchError::Usage(
            "--size must be between 4KiB and 1GiB".into(),
        ));
    }
    if args.rounds == 0 || args.small == 0 {
        return Err(BenchError::Usage(
            "--rounds and --small must be at least 1".into(),
        ));
    }
    let size = usize::try_from(size).map_err(|e| BenchError::Usage(e.to_string()))?;
    let counts = Counts {
        rounds: args.rounds,
        small: args.small,
    };
    let raw = rawtcp::spawn_local(rawtcp::ServerMemory::Anon)?;
    // Each node holds at most one copy, plus room for the small writes.
    let capacity = size as u64 + (16 << 20);
    let config = crate::local(daemon, &[16 << 20, capacity, capacity, capacity]);
    let (rows, baseline, refilled) = oncilla_cluster::run(config, move |c| {
        let opts = Options::new(c.socket(0), c.token.clone()).streams(STREAMS);
        let ocm = Oncilla::connect_with(opts)?;
        let mut rows = Vec::new();
        for copies in 1..=3 {
            eprintln!(
                "measuring {copies} cop{} ...",
                if copies == 1 { "y" } else { "ies" }
            );
            rows.push((copies, point(&ocm, copies, size, counts)?));
        }
        let baseline = baseline(&raw, size, counts)?;
        eprintln!("measuring the re-creation of a lost copy ...");
        Ok::<_, BenchError>((rows, baseline, refill(c, &ocm, size)?))
    })?;
    println!(
        "writes and reads of a remote host allocation by copies (primary on node-1, replicas on node-2 and node-3; session on node-0; {STREAMS} connections per node), beside raw TCP on the same loopback:"
    );
    let mut t = Table::new(&[
        "COPIES",
        "WRITE 4 KiB p50",
        "p99",
        &format!("WRITE {} GiB/s", HumanBytes(size as u64)),
        "vs 1 COPY",
        &format!("READ {} GiB/s", HumanBytes(size as u64)),
    ]);
    let one = rows.first().map_or(0.0, |(_, r)| r.write_gib_s);
    for (copies, r) in &rows {
        t.row(vec![
            copies.to_string(),
            format!("{:.0} us", r.small_p50_us),
            format!("{:.0} us", r.small_p99_us),
            format!("{:.2}", r.write_gib_s),
            format!("{:.0}%", r.write_gib_s / one.max(1e-9) * 100.0),
            format!("{:.2}", r.read_gib_s),
        ]);
    }
    t.row(vec![
        "raw tcp".into(),
        format!("{:.0} us", baseline.small_p50_us),
        format!("{:.0} us", baseline.small_p99_us),
        format!("{:.2}", baseline.write_gib_s),
        "-".into(),
        format!("{:.2}", baseline.read_gib_s),
    ]);
    print!("{}", t.render());
    let (mib_s, secs) = refilled;
    println!(
        "re-creating a lost {} copy, agent to agent (the primary's count of its fill, after the replica's node was killed): {:.2} GiB/s ({secs:.3} s); a 1-copy write of the same size above: {one:.2} GiB/s",
        HumanBytes(size as u64),
        mib_s / 1024.0
    );
    Ok(())
}

/// Kills the node of a 2-copy allocation's replica and waits (bounded)
/// until the master has made the copy again on the node left; returns the
/// fill's rate (MiB/s) and time as the primary's agent logged them.
fn refill(c: &Handle, ocm: &Oncilla, size: usize) -> Result<(f64, f64), BenchError> {
    let a = ocm.alloc_with(
        &AllocSpec::new(size as u64, Kind::RemoteHost)
            .on_nodes(["node-1"])
            .replicas(2)
            .fabric(Fabric::Tcp),
    )?;
    a.copy_in(0, &pattern(size, 11))?;
    let master = c.master()?;
    let id = AllocRef::Id(a.id());
    let replica_on = |m: &Master| -> Result<Option<String>, BenchError> {
        Ok(m.allocation(&id)?.replicas.first().map(|e| e.node.clone()))
    };
    let lost = replica_on(&master)?
        .ok_or_else(|| BenchError::Failed("the allocation has no replica".into()))?;
    let index: usize = lost
        .trim_start_matches("node-")
        .parse()
        .map_err(|_| BenchError::Failed(format!("unexpected node name {lost}")))?;
    c.kill_agent(index);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match replica_on(&master)? {
            Some(node) if node != lost => break,
            _ if Instant::now() > deadline => {
                return Err(BenchError::Failed(
                    "the lost copy was not made again within 120 s".into(),
                ))
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let log = std::fs::read_to_string(c.log("node-1")).unwrap_or_default();
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("replica filled"))
        .ok_or_else(|| BenchError::Failed("the primary's agent logged no fill".into()))?;
    let field = |name: &str| -> Option<f64> {
        let at = line.find(&format!(" {name}="))? + name.len() + 2;
        line[at..].split_whitespace().next()?.parse().ok()
    };
    match (field("mib_per_s"), field("secs")) {
        (Some(rate), Some(secs)) => Ok((rate, secs)),
        _ => Err(BenchError::Failed(format!(
            "cannot read the fill from: {line}"
        ))),
    }
}

/// One allocation of `copies` copies: its small-write latency and its
/// large write and read bandwidth (medians), bytes checked.
fn point(ocm: &Oncilla, copies: u32, size: usize, args: Counts) -> Result<Row, BenchError> {
    let a = ocm.alloc_with(
        &AllocSpec::new(size as u64, Kind::RemoteHost)
            .on_nodes(["node-1"])
            .replicas(copies)
            .fabric(Fabric::Tcp),
    )?;
    let small = pattern(SMALL, u64::from(copies));
    let mut lat = Vec::with_capacity(args.small);
    for _ in 0..args.small {
        let t = Instant::now();
        a.copy_in(0, &small)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let data = pattern(size, 7 + u64::from(copies));
    let mut back = vec![0u8; size];
    let (mut writes, mut reads) = (Vec::new(), Vec::new());
    for _ in 0..args.rounds {
        let t = Instant::now();
        a.copy_in(0, &data)?;
        writes.push(gib_per_s(size as u64, t.elapsed()));
        let t = Instant::now();
        a.copy_out(0, &mut back)?;
        reads.push(gib_per_s(size as u64, t.elapsed()));
    }
    if back != data {
        return Err(BenchError::Failed(format!(
            "{copies} copies: the bytes read back differ from those written"
        )));
    }
    a.free()?;
    Ok(Row {
        small_p50_us: pct(&lat, 50.0),
        small_p99_us: pct(&lat, 99.0),
        write_gib_s: pct(&writes, 50.0),
        read_gib_s: pct(&reads, 50.0),
    })
}

/// The same copies as raw TCP requests to the in-process server.
fn baseline(addr: &str, size: usize, args: Counts) -> Result<Row, BenchError> {
    let mut small_conn = RawClient::connect(addr, 1)?;
    let small = pattern(SMALL, 1);
    let mut lat = Vec::with_capacity(args.small);
    for _ in 0..args.small {
        let t = Instant::now();
        small_conn.write(&small)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut raw = RawClient::connect(addr, STREAMS)?;
    let data = pattern(size, 3);
    let mut back = vec![0u8; size];
    let (mut writes, mut reads) = (Vec::new(), Vec::new());
    for _ in 0..args.rounds {
        let t = Instant::now();
        raw.write(&data)?;
        writes.push(gib_per_s(size as u64, t.elapsed()));
        let t = Instant::now();
        raw.read(&mut back)?;
        reads.push(gib_per_s(size as u64, t.elapsed()));
    }
    Ok(Row {
        small_p50_us: pct(&lat, 50.0),
        small_p99_us: pct(&lat, 99.0),
        write_gib_s: pct(&writes, 50.0),
        read_gib_s: pct(&reads, 50.0),
    })
}
