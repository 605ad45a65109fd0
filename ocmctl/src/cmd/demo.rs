//! `ocmctl demo`: a whole cluster on this machine — a master and N agents as
//! real daemon processes on loopback, in a private temporary directory —
//! driven through liboncilla: allocate striped over every agent, write a
//! pattern, read it back, verify, print the tables and the bandwidth, free,
//! and tear everything down (also on Ctrl-C or SIGTERM).
//!
//! It owns the lifecycle of the processes it starts; it never touches a
//! cluster it did not start.

use std::path::PathBuf;
use std::time::Instant;

use liboncilla::{AllocSpec, Kind, Oncilla, Options};
use oncilla_model::size::{parse_size, HumanBytes};
use oncilla_net::auth::Token;

use oncilla_bench::report::{gib_per_s, pattern};
use oncilla_cluster::{node_name, Config};
use oncilla_ops::Master;
use oncilla_ops::Table;

use crate::error::CliError;
use crate::render;
use crate::stdout::print;

/// Options of `ocmctl demo`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    /// Number of agents to start (1 to 16).
    #[arg(long, default_value_t = 3)]
    agents: usize,
    /// Memory each agent exports.
    #[arg(long, default_value = "128MiB")]
    capacity: String,
    /// Size of the allocation striped over all agents.
    #[arg(long, default_value = "96MiB")]
    size: String,
    /// Leave the cluster running and print how to use and stop it.
    #[arg(long)]
    keep: bool,
}

/// Runs the demo.
///
/// # Errors
/// Bad options, daemons that fail to start (with their log's last lines),
/// data that does not verify, and every cluster error on the way.
pub fn run(args: &Args) -> Result<(), CliError> {
    if !(1..=16).contains(&args.agents) {
        return Err(CliError::Other("--agents must be between 1 and 16".into()));
    }
    let capacity =
        parse_size(&args.capacity).map_err(|e| CliError::Other(format!("--capacity: {e}")))?;
    let size = parse_size(&args.size).map_err(|e| CliError::Other(format!("--size: {e}")))?;
    if size == 0 || size > capacity * args.agents as u64 {
        return Err(CliError::Other(format!(
            "--size must be between 1 byte and the agents' total capacity ({})",
            HumanBytes(capacity * args.agents as u64)
        )));
    }

    let capacities = vec![capacity; args.agents];
    let (size, keep) = (size, args.keep);
    let config = Config::new(crate::daemon(), &capacities)
        .dir_prefix("oncilla-demo")
        .keep(keep);
    oncilla_cluster::run(config, move |c| {
        Plan {
            master: c.master_addr.clone(),
            socket: c.socket(0),
            token: c.token.clone(),
            nodes: (0..c.agents).map(node_name).collect(),
            size,
            keep,
        }
        .run()
    })
}

/// What the demo does once the cluster is up (runs on its own thread, since
/// liboncilla blocks).
struct Plan {
    master: String,
    socket: PathBuf,
    token: Token,
    nodes: Vec<String>,
    size: u64,
    keep: bool,
}

impl Plan {
    fn run(self) -> Result<(), CliError> {
        let master = Master::connect(&self.master, &self.token, None)?;
        let ocm = Oncilla::connect_with(Options::new(self.socket.clone(), self.token.clone()))?;
        let mut spec = AllocSpec::new(self.size, Kind::RemoteHost).on_nodes(self.nodes.clone());
        if self.keep {
            spec = spec.persistent();
        }
        let len =
            usize::try_from(self.size).map_err(|_| CliError::Other("--size too large".into()))?;
        let alloc = ocm.alloc_with(&spec)?;
        print(format_args!(
            "allocated {} as allocation {} striped over {} agents\n\n",
            HumanBytes(self.size),
            alloc.id(),
            alloc.descriptor().extents.len()
        ))?;

        let src = pattern(len, alloc.id());
        let started = Instant::now();
        alloc.copy_in(0, &src)?;
        let write = started.elapsed();
        // Filled (so pre-faulted, and the timing is the copy, not page
        // faults) with a byte the pattern cannot match everywhere.
        let mut dst = vec![0xA5u8; len];
        let started = Instant::now();
        alloc.copy_out(0, &mut dst)?;
        let read = started.elapsed();
        if let Some(at) = src.iter().zip(&dst).position(|(a, b)| a != b) {
            return Err(CliError::Other(format!(
                "verification failed: byte {at} differs"
            )));
        }
        // Unaligned ranges that cross extent boundaries.
        let mut checked = 1;
        for ext in alloc.descriptor().extents.iter().skip(1) {
            let start = ext.alloc_offset.saturating_sub(4099);
            let n = usize::try_from((alloc.size() - start).min(12_345)).unwrap_or(0);
            let mut part = vec![0u8; n];
            alloc.copy_out(start, &mut part)?;
            let at = usize::try_from(start).unwrap_or(0);
            if part != src[at..at + n] {
                return Err(CliError::Other(format!(
                    "verification failed at offset {start}"
                )));
            }
            checked += 1;
        }
        print(format_args!(
            "verified: {} read back intact ({checked} ranges, every byte compared)\n\n",
            HumanBytes(self.size)
        ))?;

        print(format_args!(
            "nodes:\n{}",
            render::nodes::table(&master.node_list()?, render::now_ms())
        ))?;
        print(format_args!(
            "\nallocations:\n{}",
            render::allocs::table(&master.allocations()?, render::now_ms())
        ))?;

        let mut t = Table::new(&["COPY", "BYTES", "SECONDS", "GiB/s"]);
        for (what, took) in [("write (copy_in)", write), ("read (copy_out)", read)] {
            t.row(vec![
                what.into(),
                HumanBytes(self.size).to_string(),
                format!("{:.3}", took.as_secs_f64()),
                format!("{:.2}", gib_per_s(self.size, took)),
            ]);
        }
        let fabrics: Vec<String> = alloc
            .descriptor()
            .extents
            .iter()
            .zip(alloc.fabrics())
            .map(|(e, f)| format!("{} {f}", e.node))
            .collect();
        print(format_args!(
            "\nbandwidth on loopback, all nodes in parallel ({}):\n{}",
            fabrics.join(", "),
            t.render()
        ))?;

        if self.keep {
            return Ok(());
        }
        let id = alloc.id();
        alloc.free()?;
        if master.allocations()?.iter().any(|a| a.id == id) {
            return Err(CliError::Other(format!(
                "allocation {id} still listed after free"
            )));
        }
        print(format_args!(
            "\nfreed allocation {id}; stopping the cluster\n"
        ))?;
        Ok(())
    }
}
