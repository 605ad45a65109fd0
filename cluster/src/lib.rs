//! `oncilla-cluster`: the one local-cluster launcher of the workspace.
//!
//! - [`Cluster`] ([`launcher`]) starts a master and agents as separate
//!   `oncillad` processes on loopback, in a private directory (token,
//!   sockets, logs), waits (bounded) until they are up, kills, stops and
//!   restarts single daemons, and stops everything and removes the
//!   directory when dropped. [`Config`] says which program runs the
//!   daemons and how ([`Daemon`]): the integration tests run the built
//!   `oncillad` binary; `ocmctl` re-executes itself with its hidden
//!   `oncillad` first argument, so `cargo run -p ocmctl -- demo` needs no
//!   other build and never runs a stale daemon binary.
//! - [`run`] ([`work`]) is a cluster for the length of one piece of work on
//!   its own thread, torn down on return, Ctrl-C and SIGTERM (`ocmctl demo`,
//!   `ocmctl run`, the benchmarks).
//! - [`etcd::Etcd`] runs a real etcd (one member or several) for masters
//!   elected through it ([`Config::elected`]).
//! - Its readiness waits ask the master and the health service through
//!   `oncilla-ops`, as an operator would.
//!
//! It never touches a cluster or a process it did not start, and knows no
//! test framework: what only tests need stays in `tests/tests/support/`.

pub mod config;
pub mod error;
pub mod etcd;
pub mod launcher;
mod process;
pub mod procfs;
pub mod work;

pub use config::{Config, Daemon, Stop};
pub use error::ClusterError;
pub use launcher::{free_port, master_name, node_name, Cluster, Handle};
pub use work::run;
