//! One module per `ocmctl` subcommand (put and get share `data`, tls-ca
//! and tls-cert share `tls`): each holds its flags (`Args`) and its `run`.
//! What they show is `crate::render`'s; how they reach the master is
//! `oncilla_ops`'s.

pub mod alloc;
pub mod allocs;
pub mod data;
pub mod demo;
pub mod drain;
pub mod free;
pub mod health;
pub mod node;
pub mod node_keys;
pub mod nodes;
pub mod quota;
pub mod run;
pub mod show;
pub mod tls;
pub mod top;

use std::time::Duration;

use oncilla_model::alloc::AllocRef;
use oncilla_ops::Conn;

/// The flags of a listing (`nodes`, `allocs`): how to reach the master,
/// and JSON instead of a table.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Listing {
    #[command(flatten)]
    conn: Conn,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// An allocation named on the command line: digits are an id, anything
/// else a name (names never consist of digits only).
pub fn alloc_ref(arg: &str) -> AllocRef {
    match arg.parse::<u64>() {
        Ok(id) => AllocRef::Id(id),
        Err(_) => AllocRef::Name(arg.to_string()),
    }
}

/// A time on the command line (`--interval`, `--timeout`): `2s`, `1.5s`,
/// `500ms`, plain seconds; 100 ms to a day.
pub fn parse_time(s: &str) -> Result<Duration, String> {
    oncilla_ops::time::parse_time(s, Duration::from_millis(100))
}
