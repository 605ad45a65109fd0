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

/// Asks, prints the answer, and fails unless it is SERVING.
///
/// # Errors
/// No answer, or one other than SERVING.
pub fn run(args: &Args) -> Result<(), CliError> {
    let conn = &args.conn;
    let addr = args.addr.clone().unwrap_or_else(|| conn.master.clone());
    let service = match args.role {
        None => "",
        Some(RoleArg::Master) => oncilla_ops::health::MASTER,
        Some(RoleArg::Agent) => oncilla_ops::health::AGENT,
    };
    let tls = conn.tls().map_err(MasterError::from)?;
    let status = oncilla_ops::health::check(&addr, service, tls.as_ref())
        .map_err(|e| CliError::Other(e.to_string()))?;
    println!("{addr}: {status}");
    if status != "SERVING" {
        return Err(CliError::Other(format!("{addr} is not serving")));
    }
    Ok(())
}
