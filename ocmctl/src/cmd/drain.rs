//! `ocmctl drain NODE` and `ocmctl undrain NODE`: the master places
//! nothing new on a drained node and moves what it holds to other nodes
//! (agent to agent, while applications go on copying); `ocmctl nodes`
//! shows how many allocations are left. With `--wait`, drain returns once
//! the node holds nothing (it may then be stopped with nothing lost),
//! showing progress on a terminal. The master decides and moves; this
//! only asks and watches.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use oncilla_model::node::NodeStatus;
use oncilla_ops::{Conn, Master};

use crate::error::CliError;

/// Options of `ocmctl drain`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    /// The node's name, as `ocmctl nodes` lists it.
    name: String,
    /// Return only once the node holds nothing (or --timeout passed).
    #[arg(long)]
    wait: bool,
    /// With --wait: how long to wait at most (`90s`, `10m` as `600s`).
    #[arg(long, default_value = "3600s", value_parser = super::parse_time)]
    timeout: Duration,
    #[command(flatten)]
    conn: Conn,
}

/// Options of `ocmctl undrain`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct UndrainArgs {
    /// The node's name, as `ocmctl nodes` lists it.
    name: String,
    #[command(flatten)]
    conn: Conn,
}

/// How often `--wait` asks the master.
const POLL: Duration = Duration::from_millis(500);

/// Runs `ocmctl drain`.
///
/// # Errors
/// The master cannot be reached or refuses (an unknown node); with
/// `--wait`, the node still holds allocations at the timeout.
pub fn drain(args: &Args) -> Result<(), CliError> {
    let master = args.conn.connect()?;
    let node = master.drain(&args.name, true)?;
    let left = node.drain.as_ref().map_or(0, |d| d.left);
    if !args.wait {
        return crate::stdout::print(format_args!(
            "draining node {}: {left} allocations to move (`ocmctl nodes` shows progress)\n",
            args.name
        ));
    }
    wait_drained(&master, &args.name, args.timeout)?;
    crate::stdout::print(format_args!(
        "node {} is drained: it holds nothing and may be stopped\n",
        args.name
    ))
}

/// Runs `ocmctl undrain`.
///
/// # Errors
/// The master cannot be reached or refuses (an unknown node).
pub fn undrain(args: &UndrainArgs) -> Result<(), CliError> {
    args.conn.connect()?.drain(&args.name, false)?;
    crate::stdout::print(format_args!(
        "node {} takes new allocations again\n",
        args.name
    ))
}

/// Waits until node `name` holds nothing, showing what is left on a
/// terminal (and why a move failed, once per reason).
fn wait_drained(master: &Master, name: &str, timeout: Duration) -> Result<(), CliError> {
    let shown = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut said = String::new();
    loop {
        let node = find(master, name)?;
        let Some(d) = node.drain else {
            return Err(CliError::Other(format!(
                "node {name} is no longer being drained (someone ran `ocmctl undrain {name}`)"
            )));
        };
        if d.left == 0 {
            if shown {
                crate::stdout::say!("\r\x1b[K");
            }
            return Ok(());
        }
        if !d.note.is_empty() && d.note != said {
            if shown {
                crate::stdout::say!("\r\x1b[K");
            }
            crate::stdout::sayln!("ocmctl: {name}: {}", d.note);
            said = d.note;
        }
        if shown {
            crate::stdout::say!(
                "\r{name}: {} allocations left ({:.0} s)   ",
                d.left,
                started.elapsed().as_secs_f64()
            );
        }
        if started.elapsed() >= timeout {
            if shown {
                crate::stdout::sayln!();
            }
            return Err(CliError::Other(format!(
                "node {name} still holds {} allocations after {} s; it goes on draining (`ocmctl nodes` shows it)",
                d.left,
                timeout.as_secs()
            )));
        }
        std::thread::sleep(POLL.min(timeout.saturating_sub(started.elapsed())));
    }
}

/// Node `name` as the master shows it now.
fn find(master: &Master, name: &str) -> Result<NodeStatus, CliError> {
    master
        .nodes()?
        .into_iter()
        .find(|n| n.info.name == name)
        .ok_or_else(|| CliError::Other(format!("node {name} is no longer known to the master")))
}
