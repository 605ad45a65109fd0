//! `ocmctl free`: frees an allocation.

use oncilla_ops::Conn;

use crate::error::CliError;

/// Options of `ocmctl free`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    /// Allocation id or name.
    alloc: String,
    /// Free it even while processes are attached (their next copy fails).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    conn: Conn,
}

/// Frees the allocation.
///
/// # Errors
/// An unknown allocation, one still attached without `--force`; the
/// master cannot be reached.
pub fn run(args: &Args) -> Result<(), CliError> {
    args.conn
        .connect()?
        .free(&super::alloc_ref(&args.alloc), args.force)?;
    Ok(())
}
