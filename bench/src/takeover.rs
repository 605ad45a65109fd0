//! `ocmctl bench takeover`: how long a cluster of elected masters cannot
//! allocate when its leader dies. A local cluster of two masters (one
//! standing by) and two agents runs against a real etcd of one member and
//! then of three; each round kills the leader with SIGKILL and times the
//! first allocation that succeeds after it (through the standby's
//! election and the new leader's take-over window), then starts the
//! killed master again as a standby. Prints one row per etcd size.

use std::time::{Duration, Instant};

use oncilla_cluster::etcd::Etcd;
use oncilla_cluster::{Daemon, Handle};
use oncilla_model::alloc::{AllocRef, AllocSpec, NodeShare, Placement};
use oncilla_model::{Fabric, Kind};
use oncilla_ops::Table;

use crate::report::pct;
use crate::BenchError;

/// Longest a round may wait for a leader, or for a restarted master.
const SETTLE: Duration = Duration::from_secs(60);

/// Options of `ocmctl bench takeover`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct TakeoverArgs {
    /// Take-overs measured per etcd size.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// The masters' lease, in seconds (the longest a dead leader holds
    /// the cluster up).
    #[arg(long, default_value_t = 2)]
    lease_secs: u64,
}

/// Runs the rounds and prints the table.
///
/// # Errors
/// No etcd program, a cluster or etcd that does not start, no leader in
/// time, an allocation that fails after the take-over.
pub fn run(args: &TakeoverArgs, daemon: &Daemon) -> Result<(), BenchError> {
    if !Etcd::available() {
        return Err(BenchError::Failed(
            "no etcd program: install Debian's etcd-server (or any etcd v3) to measure take-overs"
                .into(),
        ));
    }
    if args.rounds == 0 {
        return Err(BenchError::Usage("--rounds must be at least 1".into()));
    }
    let mut t = Table::new(&[
        "etcd members",
        "lease",
        "rounds",
        "kill -9 to allocation p50",
        "max",
    ]);
    for members in [1, 3] {
        eprintln!("measuring with {members} etcd member(s) ...");
        let etcd = Etcd::start(members, SETTLE)?;
        let config =
            crate::local(daemon, &[64 << 20, 64 << 20]).elected(1, &etcd.urls(), args.lease_secs);
        let rounds = args.rounds;
        let took = oncilla_cluster::run(config, move |h| takeovers(h, rounds))?;
        let ms: Vec<f64> = took.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        t.row(vec![
            members.to_string(),
            format!("{} s", args.lease_secs),
            rounds.to_string(),
            format!("{:.0} ms", pct(&ms, 50.0)),
            format!("{:.0} ms", pct(&ms, 100.0)),
        ]);
    }
    print!("{}", t.render());
    Ok(())
}

/// `rounds` take-overs on the cluster `h`: each one's time from the kill
/// to the first allocation done.
fn takeovers(h: &Handle, rounds: usize) -> Result<Vec<Duration>, BenchError> {
    let spec = AllocSpec::new(
        1 << 20,
        Kind::RemoteHost,
        Placement {
            nodes: vec![NodeShare {
                node: oncilla_cluster::node_name(0),
                weight: 1,
            }],
            ..Default::default()
        },
        String::new(),
        true,
        Fabric::Auto,
    )
    .map_err(|e| BenchError::Failed(e.to_string()))?;
    let master = h.master()?;
    let mut took = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let mut leader = None;
        wait(|| {
            leader = h.leader();
            leader.is_some()
        })?;
        let leader = leader.ok_or_else(|| BenchError::Failed("no master leads".into()))?;
        h.kill_master_at(leader);
        let killed = Instant::now();
        // Waits through the election and the take-over window (bounded).
        // A call that met the dead leader's broken connection fails with
        // its outcome unknown (nothing received it here): asked again.
        let a = loop {
            match master.allocate(spec.clone()) {
                Ok(a) => break a,
                Err(_) if killed.elapsed() < SETTLE => {}
                Err(e) => return Err(e.into()),
            }
        };
        took.push(killed.elapsed());
        master.free(&AllocRef::Id(a.id), false)?;
        h.start_master_at(leader)?;
        // Answering again (a standby) before the next round kills the
        // leader.
        wait(|| oncilla_ops::health::check(&h.master_addrs[leader], "", h.tls.as_ref()).is_ok())?;
    }
    Ok(took)
}

/// Waits, within [`SETTLE`], until `ready` says so.
fn wait(mut ready: impl FnMut() -> bool) -> Result<(), BenchError> {
    let deadline = Instant::now() + SETTLE;
    while !ready() {
        if Instant::now() > deadline {
            return Err(BenchError::Failed(format!(
                "the cluster did not settle within {} s",
                SETTLE.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
