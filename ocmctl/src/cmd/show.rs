//! `ocmctl show`: one allocation in detail, every extent with the fabric
//! its creator uses for it.

use oncilla_ops::Conn;

use crate::error::CliError;
use crate::render;

/// Options of `ocmctl show`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    /// Allocation id or name.
    alloc: String,
    #[command(flatten)]
    conn: Conn,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Shows the allocation.
///
/// # Errors
/// An unknown allocation; the master cannot be reached.
pub fn run(args: &Args) -> Result<(), CliError> {
    let a = args
        .conn
        .connect()?
        .allocation(&super::alloc_ref(&args.alloc))?;
    if args.json {
        crate::stdout::json(&render::allocs::json(&a))?;
    } else {
        crate::stdout::print(render::allocs::detail(&a, render::now_ms()))?;
    }
    Ok(())
}
