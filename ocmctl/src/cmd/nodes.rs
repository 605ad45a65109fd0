//! `ocmctl nodes`: every node with its capacity, usage, state and fabrics.

use oncilla_ops::Conn;

use crate::error::CliError;
use crate::render;

/// Options of `ocmctl nodes`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    #[command(flatten)]
    conn: Conn,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Lists the nodes.
///
/// # Errors
/// The master cannot be reached or refuses.
pub fn run(args: &Args) -> Result<(), CliError> {
    let nodes = args.conn.connect()?.node_list()?;
    if args.json {
        oncilla_ops::json::print(&render::nodes::json(&nodes));
    } else {
        print!("{}", render::nodes::table(&nodes, render::now_ms()));
    }
    Ok(())
}
