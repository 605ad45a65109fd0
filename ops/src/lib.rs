//! `oncilla-ops`: what the programs an operator runs share (`ocmctl`, the
//! benchmarks, the local-cluster launcher's readiness waits).
//!
//! - [`Master`] and [`Conn`] ([`master`]) reach any cluster's master from
//!   plain threads, in the model's values.
//! - [`health`] asks a daemon's gRPC health service whether it serves.
//! - [`certs`] makes a cluster CA and the certificates its daemons serve.
//! - [`table`] and [`json`] render for people and for scripts.
//! - [`time`] parses times given on the command line.
//!
//! It starts no daemon and never changes a cluster on its own: each call
//! is one an operator asked for.

pub mod certs;
pub mod health;
pub mod json;
pub mod master;
pub mod table;
pub mod time;

pub use master::{Conn, Master, MasterError};
pub use table::Table;
