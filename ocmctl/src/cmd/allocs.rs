//! `ocmctl allocs`: every allocation with its size, kind, extents, owner
//! and age.

use oncilla_ops::Conn;

use crate::error::CliError;
use crate::render;

/// Options of `ocmctl allocs`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    #[command(flatten)]
    conn: Conn,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Lists the allocations.
///
/// # Errors
/// The master cannot be reached or refuses.
pub fn run(args: &Args) -> Result<(), CliError> {
    let allocs = args.conn.connect()?.allocations()?;
    if args.json {
        oncilla_ops::json::print(&serde_json::Value::Array(
            allocs.iter().map(render::allocs::json).collect(),
        ));
    } else {
        print!("{}", render::allocs::table(&allocs, render::now_ms()));
    }
    Ok(())
}
