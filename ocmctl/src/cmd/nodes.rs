//! `ocmctl nodes`: every node with its capacity, usage, state and fabrics.

use crate::error::CliError;
use crate::render;

/// Lists the nodes.
///
/// # Errors
/// The master cannot be reached or refuses.
pub fn run(args: &super::Listing) -> Result<(), CliError> {
    let nodes = args.conn.connect()?.node_list()?;
    if args.json {
        crate::stdout::json(&render::nodes::json(&nodes))?;
    } else {
        let (table, notes) = render::nodes::table_and_notes(&nodes, render::now_ms());
        // The table is the output; the notes about it are for the person.
        crate::stdout::say!("{notes}");
        crate::stdout::print(table)?;
    }
    Ok(())
}
