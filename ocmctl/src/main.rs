//! `ocmctl`: inspect and drive an Oncilla cluster, and run a local demo
//! cluster. Each subcommand's work lives in its own module; this file parses
//! flags and maps errors to one line on stderr and a non-zero exit.

mod bench;
mod cluster;
mod data;
mod demo;
mod master;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use oncilla_proto::auth::{Token, TokenError};
use oncilla_proto::size::parse_size;

use master::Master;

/// Inspect and drive an Oncilla cluster.
#[derive(Debug, Parser)]
#[command(name = "ocmctl", version)]
#[deny(missing_docs)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// How to reach the master.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub(crate) struct Conn {
    /// Master gRPC address.
    #[arg(
        long,
        env = "ONCILLA_MASTER",
        default_value = "127.0.0.1:7070",
        value_name = "HOST:PORT"
    )]
    pub(crate) master: String,
    /// Cluster token.
    #[arg(long, env = "ONCILLA_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// File holding the cluster token.
    #[arg(long, env = "ONCILLA_TOKEN_FILE", value_name = "PATH")]
    token_file: Option<PathBuf>,
}

impl Conn {
    pub(crate) fn token(&self) -> Result<Token, CliError> {
        Ok(Token::resolve(
            self.token.as_deref(),
            self.token_file.as_deref(),
        )?)
    }

    fn master(&self) -> Result<Master, CliError> {
        Master::connect(&self.master, &self.token()?)
    }
}

#[derive(Debug, Subcommand)]
#[deny(missing_docs)]
enum Cmd {
    /// List nodes: capacity, usage, state, fabrics.
    Nodes {
        #[command(flatten)]
        conn: Conn,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List allocations: size, kind, extents, owner, age.
    Allocs {
        #[command(flatten)]
        conn: Conn,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one allocation and its extents.
    Show {
        /// Allocation id.
        id: u64,
        #[command(flatten)]
        conn: Conn,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Allocate persistent remote memory; prints the new id.
    Alloc {
        /// Size, e.g. 64MiB or 4GiB.
        size: String,
        /// Split equally over these nodes (repeat the flag).
        #[arg(long = "node", value_name = "NAME")]
        nodes: Vec<String>,
        #[command(flatten)]
        conn: Conn,
        /// Print the allocation as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Free an allocation.
    Free {
        /// Allocation id.
        id: u64,
        #[command(flatten)]
        conn: Conn,
    },
    /// Copy a file into an allocation.
    Put {
        /// Allocation id.
        id: u64,
        /// File to read.
        file: PathBuf,
        /// Byte offset in the allocation.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        #[command(flatten)]
        conn: Conn,
    },
    /// Copy bytes out of an allocation to a file or stdout.
    Get {
        /// Allocation id.
        id: u64,
        /// Byte offset in the allocation.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Bytes to copy [default: to the end].
        #[arg(long)]
        len: Option<u64>,
        /// Output file [default: stdout].
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Start a local cluster (master and agents as processes), move data
    /// through it, verify it, print what happened, and tear it down.
    Demo(demo::Args),
    /// Measure the cluster (prints tables; see docs/benchmarks.md).
    #[command(subcommand)]
    Bench(bench::Bench),
}

/// What ocmctl reports on failure: one line, then exit status 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(transparent)]
    Addr(#[from] oncilla_proto::client::AddrError),
    #[error("{}", .0.message())]
    Rpc(tonic::Status),
    #[error(transparent)]
    Data(#[from] liboncilla::Error),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

/// The hidden first argument under which ocmctl runs the daemon itself, so
/// `ocmctl demo` can start real oncillad processes from a single binary.
pub const DAEMON_ARG: &str = "oncillad";

fn main() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == DAEMON_ARG) {
        args.remove(0);
        return oncillad::main_with(args);
    }
    let cli = Cli::parse();
    match run(cli.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ocmctl: {e}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) fn print_json(v: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

fn run(cmd: Cmd) -> Result<(), CliError> {
    match cmd {
        Cmd::Nodes { conn, json } => {
            let nodes = conn.master()?.nodes()?;
            if json {
                print_json(&master::nodes_json(&nodes));
            } else {
                print!("{}", master::nodes_table(&nodes));
            }
        }
        Cmd::Allocs { conn, json } => {
            let allocs = conn.master()?.allocations()?;
            if json {
                print_json(&serde_json::Value::Array(
                    allocs.iter().map(master::alloc_json).collect(),
                ));
            } else {
                print!("{}", master::allocs_table(&allocs));
            }
        }
        Cmd::Show { id, conn, json } => {
            let a = conn.master()?.allocation(id)?;
            if json {
                print_json(&master::alloc_json(&a));
            } else {
                print!("{}", master::alloc_detail(&a));
            }
        }
        Cmd::Alloc {
            size,
            nodes,
            conn,
            json,
        } => {
            let size = parse_size(&size).map_err(|e| CliError::Other(e.to_string()))?;
            let a = conn.master()?.allocate(size, nodes)?;
            if json {
                print_json(&master::alloc_json(&a));
            } else {
                println!("{}", a.id);
            }
        }
        Cmd::Free { id, conn } => conn.master()?.free(id)?,
        Cmd::Put {
            id,
            file,
            offset,
            conn,
        } => {
            let token = conn.token()?;
            data::put(&conn.master()?, token, id, &file, offset)?;
        }
        Cmd::Get {
            id,
            offset,
            len,
            output,
            conn,
        } => {
            let token = conn.token()?;
            data::get(&conn.master()?, token, id, offset, len, output.as_deref())?;
        }
        Cmd::Demo(args) => demo::run(&args)?,
        Cmd::Bench(bench::Bench::Alloc(args)) => bench::alloc(&args)?,
    }
    Ok(())
}
