//! `ocmctl run`: a program against a local cluster. Starts a master and N
//! agents (as `ocmctl demo` does), runs the program with the environment
//! that points liboncilla at agent node-0 (`ONCILLA_SOCKET`,
//! `ONCILLA_TOKEN_FILE`, `ONCILLA_MASTER`), waits for it, and tears the
//! cluster down. The examples are run this way.
//!
//! It owns nothing but the child's lifetime; the cluster is
//! `oncilla_cluster`'s.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use oncilla_cluster::Config;
use oncilla_model::size::parse_size;

use crate::error::CliError;

mod forward;

/// Options of `ocmctl run`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    /// Number of agents to start (1 to 16).
    #[arg(long, default_value_t = 3)]
    agents: usize,
    /// Memory each agent exports.
    #[arg(long, default_value = "256MiB")]
    capacity: String,
    /// The program and its arguments (after `--`).
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

/// Runs the program; its exit status becomes ocmctl's (a program killed
/// by signal N: 128 + N, as a shell says it). SIGINT, SIGTERM and SIGHUP
/// sent to ocmctl meanwhile go to the program, and the cluster is torn
/// down once it has ended: nothing is left running.
///
/// # Errors
/// Bad options, daemons that fail to start, a program that cannot be
/// started; [`CliError::Child`] for one that does not succeed.
pub fn run(args: &Args) -> Result<(), CliError> {
    if !(1..=16).contains(&args.agents) {
        return Err(CliError::Other("--agents must be from 1 to 16".into()));
    }
    let capacity =
        parse_size(&args.capacity).map_err(|e| CliError::Other(format!("--capacity: {e}")))?;
    let command = args.command.clone();
    let capacities = vec![capacity; args.agents];
    let config = Config::new(crate::daemon(), &capacities).dir_prefix("oncilla-demo");
    let (program, status) = oncilla_cluster::run(config, move |h| {
        let (program, rest) = command
            .split_first()
            .ok_or_else(|| CliError::Other("no program given after --".into()))?;
        // Written (mode 0600) by the cluster when it started.
        let token_file = h.token_file();
        let mut child = Command::new(program)
            .args(rest)
            .env("ONCILLA_SOCKET", h.socket(0))
            .env("ONCILLA_TOKEN_FILE", &token_file)
            .env_remove("ONCILLA_TOKEN")
            .env("ONCILLA_MASTER", &h.master_addr)
            .spawn()
            .map_err(|e| CliError::Other(format!("cannot start {program:?}: {e}")))?;
        forward::Forwarding::to(child.id()).until_ended();
        let status = child.wait();
        let status =
            status.map_err(|e| CliError::Other(format!("waiting for {program:?}: {e}")))?;
        Ok::<_, CliError>((program.clone(), status))
    })?;
    match (status.code(), status.signal()) {
        (Some(0), _) => Ok(()),
        (Some(code), _) => Err(CliError::Child {
            code: u8::try_from(code).unwrap_or(1),
            why: None,
        }),
        (None, signal) => {
            let n = signal.unwrap_or(0);
            Err(CliError::Child {
                code: u8::try_from(128 + n).unwrap_or(1),
                why: Some(format!("{program:?} was killed by signal {n}")),
            })
        }
    }
}
