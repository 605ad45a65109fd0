//! `ocmctl`: inspect and drive an Oncilla cluster, and run a local demo
//! cluster. Each subcommand is a module of [`cmd`] with its flags and its
//! work; [`render`] shows records; `ocmctl bench` fronts the
//! `oncilla-bench` crate, and local clusters come from `oncilla-cluster`,
//! whose daemons are this binary re-executed with the hidden first
//! argument [`DAEMON_ARG`]. This file parses the command line, dispatches,
//! and maps errors to one line on stderr and a non-zero exit.

mod cmd;
mod error;
mod render;
mod stdout;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use oncilla_bench::Bench;
use oncilla_cluster::Daemon;

use crate::error::CliError;

/// Inspect and drive an Oncilla cluster.
#[derive(Debug, Parser)]
#[command(name = "ocmctl", version)]
#[deny(missing_docs)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// How local clusters run their daemons: this binary, re-executed with the
/// hidden [`DAEMON_ARG`] (never a separately built `oncillad`, which could
/// be stale beside a fresh `cargo run -p ocmctl`).
pub(crate) fn daemon() -> Daemon {
    Daemon::ReExec(DAEMON_ARG.to_string())
}

/// The hidden first argument under which ocmctl runs the daemon itself, so
/// `ocmctl demo` can start real oncillad processes from a single binary.
pub const DAEMON_ARG: &str = "oncillad";

#[derive(Debug, Subcommand)]
#[deny(missing_docs)]
enum Cmd {
    /// List nodes: capacity, usage, state, fabrics.
    Nodes(cmd::Listing),
    /// List allocations: size, kind, extents, owner, age.
    Allocs(cmd::Listing),
    /// Show one allocation: placement, attached processes, and every extent
    /// with the fabric its creator uses for it.
    Show(cmd::show::Args),
    /// Allocate persistent memory in the cluster; prints the new id.
    Alloc(cmd::alloc::Args),
    /// Free an allocation.
    Free(cmd::free::Args),
    /// Copy a file into an allocation.
    Put(cmd::data::PutArgs),
    /// Copy bytes out of an allocation to a file or stdout.
    Get(cmd::data::GetArgs),
    /// Write node NAME's keys (derived from the cluster token) for
    /// `oncillad --node-keys-file`: the agent then holds no token and can
    /// act only as that node.
    NodeKeys(cmd::node_keys::Args),
    /// Ask a daemon whether it serves (the gRPC health protocol): prints
    /// its status and exits 0 only when it is SERVING. For probes and
    /// scripts; needs no token.
    Health(cmd::health::Args),
    /// Make a cluster CA for TLS on every TCP listener: DIR/ca.pem (what
    /// daemons and operators trust: --tls-ca) and DIR/ca-key.pem (0600,
    /// needed only by `tls-cert`). Refuses to replace an existing CA.
    TlsCa(cmd::tls::CaArgs),
    /// Make daemon NAME's TLS certificate, signed by the CA in --ca:
    /// OUT/NAME.pem and OUT/NAME-key.pem (0600), for `oncillad --tls-cert
    /// OUT/NAME.pem --tls-key OUT/NAME-key.pem --tls-ca CA/ca.pem`.
    TlsCert(cmd::tls::CertArgs),
    /// Start a local cluster (master and agents as processes), move data
    /// through it, verify it, print what happened, and tear it down.
    Demo(cmd::demo::Args),
    /// Nodes and allocations, refreshed every --interval until Ctrl-C (or
    /// --count frames); redraws on a terminal, appends frames elsewhere.
    Top(cmd::top::Args),
    /// Start a local cluster, run a program against it (liboncilla finds
    /// agent node-0 through ONCILLA_SOCKET and ONCILLA_TOKEN_FILE), and
    /// tear the cluster down: `ocmctl run -- ./my-app args`.
    Run(cmd::run::Args),
    /// Users' quotas (what each may hold) and what each holds; set and
    /// clear them (the master keeps them in its --quota-file).
    #[command(subcommand)]
    Quota(cmd::quota::QuotaCmd),
    /// Drain a node: nothing new goes there, and what it holds moves to
    /// other nodes while applications go on; `--wait` returns once it
    /// holds nothing (then it may be stopped with nothing lost).
    Drain(cmd::drain::Args),
    /// End a node's drain: it takes new allocations again.
    Undrain(cmd::drain::UndrainArgs),
    /// Take a node that is down out of the cluster (`node remove NAME`).
    #[command(subcommand)]
    Node(cmd::node::NodeCmd),
    /// Measure the cluster (prints tables; see docs/benchmarks.md).
    #[command(subcommand)]
    Bench(Bench),
}

fn main() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == DAEMON_ARG) {
        args.remove(0);
        return oncillad::main_with(args);
    }
    let cli = Cli::parse();
    match run(cli.cmd) {
        Ok(()) | Err(CliError::Closed) => ExitCode::SUCCESS,
        Err(CliError::Child { code, why }) => {
            if let Some(why) = why {
                crate::stdout::sayln!("ocmctl: {why}");
            }
            ExitCode::from(code)
        }
        Err(e) => {
            crate::stdout::sayln!("ocmctl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cmd: Cmd) -> Result<(), CliError> {
    match cmd {
        Cmd::Nodes(args) => cmd::nodes::run(&args),
        Cmd::Allocs(args) => cmd::allocs::run(&args),
        Cmd::Show(args) => cmd::show::run(&args),
        Cmd::Alloc(args) => cmd::alloc::run(&args),
        Cmd::Free(args) => cmd::free::run(&args),
        Cmd::Put(args) => cmd::data::put(&args),
        Cmd::Get(args) => cmd::data::get(&args),
        Cmd::NodeKeys(args) => cmd::node_keys::run(&args),
        Cmd::Health(args) => cmd::health::run(&args),
        Cmd::TlsCa(args) => cmd::tls::ca(&args),
        Cmd::TlsCert(args) => cmd::tls::cert(&args),
        Cmd::Demo(args) => cmd::demo::run(&args),
        Cmd::Top(args) => cmd::top::run(&args),
        Cmd::Run(args) => cmd::run::run(&args),
        Cmd::Quota(cmd) => cmd::quota::run(&cmd),
        Cmd::Drain(args) => cmd::drain::drain(&args),
        Cmd::Undrain(args) => cmd::drain::undrain(&args),
        Cmd::Node(cmd) => cmd::node::run(&cmd),
        Cmd::Bench(bench) => Ok(oncilla_bench::run(&bench, &daemon())?),
    }
}
