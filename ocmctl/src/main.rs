//! `ocmctl`: inspect and drive an Oncilla cluster, and run a local demo
//! cluster. Each subcommand's work lives in its own module; `ocmctl bench`
//! fronts the `oncilla-bench` crate, and local clusters come from
//! `oncilla-cluster`, whose daemons are this binary re-executed with the
//! hidden first argument [`DAEMON_ARG`]. This file parses flags and maps
//! errors to one line on stderr and a non-zero exit.

mod data;
mod demo;
mod master;
mod quota;
mod runwith;
mod top;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use oncilla_bench::{Bench, BenchError};
use oncilla_cluster::{certs, ClusterError, Conn, Daemon, Master, MasterError};
use oncilla_model::alloc::{AllocSpec, NodeShare, Placement};
use oncilla_model::size::parse_size;
use oncilla_model::{Fabric, Kind, Policy};
use oncilla_net::auth::TokenError;

/// Inspect and drive an Oncilla cluster.
#[derive(Debug, Parser)]
#[command(name = "ocmctl", version)]
#[deny(missing_docs)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// The master `conn` names.
fn connect(conn: &Conn) -> Result<Master, CliError> {
    Ok(conn.connect()?)
}

/// How local clusters run their daemons: this binary, re-executed with the
/// hidden [`DAEMON_ARG`] (never a separately built `oncillad`, which could
/// be stale beside a fresh `cargo run -p ocmctl`).
pub(crate) fn daemon() -> Daemon {
    Daemon::ReExec(DAEMON_ARG.to_string())
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
    /// Show one allocation: placement, attached processes, and every extent
    /// with the fabric its creator uses for it.
    Show {
        /// Allocation id or name.
        alloc: String,
        #[command(flatten)]
        conn: Conn,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Allocate persistent memory in the cluster; prints the new id.
    Alloc {
        /// Size, e.g. 64MiB or 4GiB.
        size: String,
        /// How to choose nodes when none is named.
        #[arg(long, value_enum, default_value_t = PolicyArg::LocalFirst)]
        policy: PolicyArg,
        /// Place on this node (repeat the flag); overrides --policy.
        #[arg(long = "node", value_name = "NAME")]
        nodes: Vec<String>,
        /// Weight of each --node, in the same order [default: 1 each].
        #[arg(long = "weight", value_name = "W")]
        weights: Vec<u32>,
        /// Deal the allocation out in chunks of this size (a multiple of
        /// 4KiB), node after node; needs --policy spread or --node.
        #[arg(long, value_name = "SIZE")]
        stripe: Option<String>,
        /// Name it, so any process can attach it by name.
        #[arg(long)]
        name: Option<String>,
        /// GPU memory (remote-gpu) instead of host memory: on this device
        /// index of the one --node, or give `any` for any GPU with room.
        #[arg(long, value_name = "INDEX|any")]
        gpu: Option<String>,
        #[command(flatten)]
        conn: Conn,
        /// Print the allocation as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Free an allocation.
    Free {
        /// Allocation id or name.
        alloc: String,
        /// Free it even while processes are attached (their next copy fails).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Copy a file into an allocation.
    Put {
        /// Allocation id or name.
        alloc: String,
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
        /// Allocation id or name.
        alloc: String,
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
    /// Write node NAME's keys (derived from the cluster token) for
    /// `oncillad --node-keys-file`: the agent then holds no token and can
    /// act only as that node.
    NodeKeys {
        /// The node's name (its agent's --name).
        name: String,
        /// File to write (mode 0600) [default: stdout].
        #[arg(long, value_name = "PATH")]
        out: Option<PathBuf>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Ask a daemon whether it serves (the gRPC health protocol): prints
    /// its status and exits 0 only when it is SERVING. For probes and
    /// scripts; needs no token.
    Health {
        /// The daemon's gRPC address [default: the master's].
        addr: Option<String>,
        /// One role of the daemon instead of the whole of it.
        #[arg(long, value_enum)]
        role: Option<RoleArg>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Make a cluster CA for TLS on every TCP listener: DIR/ca.pem (what
    /// daemons and operators trust: --tls-ca) and DIR/ca-key.pem (0600,
    /// needed only by `tls-cert`). Refuses to replace an existing CA.
    TlsCa {
        /// Directory to write into (made if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Make daemon NAME's TLS certificate, signed by the CA in --ca:
    /// OUT/NAME.pem and OUT/NAME-key.pem (0600), for `oncillad --tls-cert
    /// OUT/NAME.pem --tls-key OUT/NAME-key.pem --tls-ca CA/ca.pem`.
    TlsCert {
        /// The daemon's name (its --name; `master` for a master alone).
        name: String,
        /// Host name or address clients dial it by (its --advertise, or
        /// the address it listens on); repeat for each.
        #[arg(long = "host", value_name = "HOST", required = true)]
        hosts: Vec<String>,
        /// Directory holding the CA (`ocmctl tls-ca --out`).
        #[arg(long, value_name = "DIR")]
        ca: PathBuf,
        /// Directory to write into [default: the CA's].
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Start a local cluster (master and agents as processes), move data
    /// through it, verify it, print what happened, and tear it down.
    Demo(demo::Args),
    /// Nodes and allocations, refreshed every --interval until Ctrl-C (or
    /// --count frames); redraws on a terminal, appends frames elsewhere.
    Top(top::Args),
    /// Start a local cluster, run a program against it (liboncilla finds
    /// agent node-0 through ONCILLA_SOCKET and ONCILLA_TOKEN_FILE), and
    /// tear the cluster down: `ocmctl run -- ./my-app args`.
    Run(runwith::Args),
    /// Users' quotas (what each may hold) and what each holds; set and
    /// clear them (the master keeps them in its --quota-file).
    #[command(subcommand)]
    Quota(quota::QuotaCmd),
    /// Measure the cluster (prints tables; see docs/benchmarks.md).
    #[command(subcommand)]
    Bench(Bench),
}

/// `--policy` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PolicyArg {
    /// The emptiest node that holds it all, else spill to the next.
    LocalFirst,
    /// An equal share on every live node with room.
    Spread,
    /// As few nodes as possible.
    Pack,
}

/// The spec of `ocmctl alloc`: a persistent allocation over TCP (the
/// operator copies with `put` and `get`), on GPU `gpu` ("any" or an index)
/// when given.
fn alloc_spec(
    size: &str,
    policy: PolicyArg,
    nodes: Vec<String>,
    weights: &[u32],
    stripe: Option<&str>,
    name: Option<String>,
    gpu: Option<&str>,
) -> Result<AllocSpec, CliError> {
    let size = parse_size(size).map_err(|e| CliError::Other(e.to_string()))?;
    let stripe = stripe
        .map(|s| parse_size(s).map_err(|e| CliError::Other(format!("--stripe: {e}"))))
        .transpose()?
        .unwrap_or(0);
    if !weights.is_empty() && weights.len() != nodes.len() {
        return Err(CliError::Other(format!(
            "--weight given {} times for {} --node; give one per node or none",
            weights.len(),
            nodes.len()
        )));
    }
    if weights.contains(&0) {
        return Err(CliError::Other("--weight must be at least 1".into()));
    }
    let policy = match policy {
        PolicyArg::LocalFirst => Policy::LocalFirst,
        PolicyArg::Spread => Policy::Spread,
        PolicyArg::Pack => Policy::Pack,
    };
    let gpu_index = match gpu {
        None | Some("any") => None,
        Some(g) => Some(g.parse::<u32>().map_err(|_| {
            CliError::Other(format!("--gpu: {g:?} is not a device index or `any`"))
        })?),
    };
    let placement = Placement {
        policy,
        nodes: nodes
            .into_iter()
            .enumerate()
            .map(|(i, node)| NodeShare {
                node,
                weight: weights.get(i).copied().unwrap_or(1),
            })
            .collect(),
        stripe,
        gpu: gpu_index,
    };
    let kind = if gpu.is_some() {
        Kind::RemoteGpu
    } else {
        Kind::RemoteHost
    };
    // An operator's allocation has no user: any process may attach it.
    AllocSpec::new(
        size,
        kind,
        placement,
        name.unwrap_or_default(),
        true,
        Fabric::Tcp,
    )
    // In the master's words for the same refusal.
    .map_err(|e| CliError::Other(format!("invalid request: {e}")))
}

/// What ocmctl reports on failure: one line, then exit status 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(transparent)]
    Master(#[from] MasterError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Bench(#[from] BenchError),
    #[error(transparent)]
    Data(#[from] liboncilla::Error),
    #[error(transparent)]
    Fabric(#[from] oncilla_model::fabric::UnknownFabric),
    #[error(transparent)]
    Certs(#[from] certs::CertError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

/// A daemon's role, for `ocmctl health --role`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum RoleArg {
    Master,
    Agent,
}

/// The hidden first argument under which ocmctl runs the daemon itself, so
/// `ocmctl demo` can start real oncillad processes from a single binary.
pub const DAEMON_ARG: &str = "oncillad";

/// `ocmctl node-keys`: node `name`'s keys, to `out` (private) or stdout.
fn write_node_keys(name: &str, out: Option<&std::path::Path>, conn: &Conn) -> Result<(), CliError> {
    if name.is_empty() || name.len() > 128 || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(CliError::Other(format!(
            "node name {}: use 1 to 128 printable ASCII characters without spaces",
            oncilla_model::echo::echo(name)
        )));
    }
    let text = oncilla_net::credential::NodeKeys::derive(&conn.token()?, name).to_text();
    let Some(path) = out else {
        print!("{text}");
        return Ok(());
    };
    certs::write_private(path, text.as_bytes()).map_err(|source| CliError::Io {
        path: path.display().to_string(),
        source,
    })?;
    eprintln!("wrote the keys of node {name} to {}", path.display());
    Ok(())
}

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

fn run(cmd: Cmd) -> Result<(), CliError> {
    match cmd {
        Cmd::Nodes { conn, json } => {
            let nodes = connect(&conn)?.node_list()?;
            if json {
                oncilla_bench::report::print_json(&master::nodes_json(&nodes));
            } else {
                print!("{}", master::nodes_table(&nodes));
            }
        }
        Cmd::Allocs { conn, json } => {
            let allocs = connect(&conn)?.allocations()?;
            if json {
                oncilla_bench::report::print_json(&serde_json::Value::Array(
                    allocs.iter().map(master::alloc_json).collect(),
                ));
            } else {
                print!("{}", master::allocs_table(&allocs));
            }
        }
        Cmd::Show { alloc, conn, json } => {
            let a = connect(&conn)?.allocation(&master::alloc_ref(&alloc))?;
            if json {
                oncilla_bench::report::print_json(&master::alloc_json(&a));
            } else {
                print!("{}", master::alloc_detail(&a));
            }
        }
        Cmd::Alloc {
            size,
            policy,
            nodes,
            weights,
            stripe,
            name,
            gpu,
            conn,
            json,
        } => {
            let spec = alloc_spec(
                &size,
                policy,
                nodes,
                &weights,
                stripe.as_deref(),
                name,
                gpu.as_deref(),
            )?;
            let a = connect(&conn)?.allocate(spec)?;
            if json {
                oncilla_bench::report::print_json(&master::alloc_json(&a));
            } else {
                println!("{}", a.id);
            }
        }
        Cmd::Free { alloc, force, conn } => {
            connect(&conn)?.free(&master::alloc_ref(&alloc), force)?;
        }
        Cmd::Put {
            alloc,
            file,
            offset,
            conn,
        } => {
            let token = conn.token()?;
            data::put(
                &connect(&conn)?,
                token,
                &master::alloc_ref(&alloc),
                &file,
                offset,
            )?;
        }
        Cmd::Get {
            alloc,
            offset,
            len,
            output,
            conn,
        } => {
            let token = conn.token()?;
            let target = master::alloc_ref(&alloc);
            data::get(
                &connect(&conn)?,
                token,
                &target,
                offset,
                len,
                output.as_deref(),
            )?;
        }
        Cmd::NodeKeys { name, out, conn } => write_node_keys(&name, out.as_deref(), &conn)?,
        Cmd::Health { addr, role, conn } => {
            let addr = addr.unwrap_or_else(|| conn.master.clone());
            let service = match role {
                None => "",
                Some(RoleArg::Master) => oncilla_cluster::health::MASTER,
                Some(RoleArg::Agent) => oncilla_cluster::health::AGENT,
            };
            let tls = conn.tls().map_err(MasterError::from)?;
            let status = oncilla_cluster::health::check(&addr, service, tls.as_ref())
                .map_err(|e| CliError::Other(e.to_string()))?;
            println!("{addr}: {status}");
            if status != "SERVING" {
                return Err(CliError::Other(format!("{addr} is not serving")));
            }
        }
        Cmd::TlsCa { out } => {
            let ca = certs::make_ca(&out)?;
            eprintln!(
                "wrote the cluster CA to {} (trust it with --tls-ca) and its key to {}",
                ca.display(),
                out.join(certs::CA_KEY).display()
            );
        }
        Cmd::TlsCert {
            name,
            hosts,
            ca,
            out,
        } => {
            let files = certs::make_cert(&ca, &name, &hosts, out.as_deref().unwrap_or(&ca))?;
            eprintln!(
                "wrote {name}'s certificate to {} and its key to {}",
                files.cert.display(),
                files.key.display()
            );
        }
        Cmd::Demo(args) => demo::run(&args)?,
        Cmd::Top(args) => top::run(&args)?,
        Cmd::Run(args) => runwith::run(&args)?,
        Cmd::Quota(cmd) => quota::run(&cmd)?,
        Cmd::Bench(bench) => oncilla_bench::run(&bench, &daemon())?,
    }
    Ok(())
}
