//! `ocmctl health`: asks a daemon whether it serves (the gRPC health
//! protocol); exits 0 only when it is SERVING. For probes and scripts;
//! needs no token.

use oncilla_ops::{Conn, MasterError};

use crate::error::CliError;

/// Options of `ocmctl health`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    /// The daemon's gRPC address [default: the master's].
    addr: Option<String>,
    /// One role of the daemon instead of the whole of it.
    #[arg(long, value_enum)]
    role: Option<RoleArg>,
    #[command(flatten)]
    conn: Conn,
}

/// A daemon's role, for `ocmctl health --role`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum RoleArg {
    Master,
    Agent,
}

/// Asks, prints the answer, and fails unless it is SERVING. Given several
/// masters (standbys among them), asks each and succeeds when one serves:
/// the leader does, standbys do not.
///
/// # Errors
/// No answer, or none SERVING.
pub fn run(args: &Args) -> Result<(), CliError> {
    let conn = &args.conn;
    let addrs: Vec<String> = match &args.addr {
        Some(a) => vec![a.clone()],
        None => conn
            .master
            .split(',')
            .map(|a| a.trim().to_string())
            .collect(),
    };
    let service = match args.role {
        None => "",
        Some(RoleArg::Master) => oncilla_ops::health::MASTER,
        Some(RoleArg::Agent) => oncilla_ops::health::AGENT,
    };
    let tls = conn.tls().map_err(MasterError::from)?;
    let mut serving = false;
    let mut last = None;
    for addr in &addrs {
        match oncilla_ops::health::check(addr, service, tls.as_ref()) {
            Ok(status) => {
                crate::stdout::print(format_args!("{addr}: {status}\n"))?;
                serving |= status == "SERVING";
            }
            Err(e) => {
                if addrs.len() > 1 {
                    crate::stdout::sayln!("{addr}: {e}");
                }
                last = Some(e.to_string());
            }
        }
    }
    match (serving, last) {
        (true, _) => Ok(()),
        (false, Some(e)) if addrs.len() == 1 => Err(CliError::Other(e)),
        (false, _) => Err(CliError::Other(format!(
            "{} is not serving",
            addrs.join(", ")
        ))),
    }
}
