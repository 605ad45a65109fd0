//! `ocmctl allocs`: every allocation with its size, kind, extents, owner
//! and age.

use crate::error::CliError;
use crate::render;

/// Lists the allocations.
///
/// # Errors
/// The master cannot be reached or refuses.
pub fn run(args: &super::Listing) -> Result<(), CliError> {
    let allocs = args.conn.connect()?.allocations()?;
    if args.json {
        crate::stdout::json(&serde_json::Value::Array(
            allocs.iter().map(render::allocs::json).collect(),
        ))?;
    } else {
        crate::stdout::print(render::allocs::table(&allocs, render::now_ms()))?;
    }
    Ok(())
}
