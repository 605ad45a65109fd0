//! `ocmctl node remove NAME`: takes a node that is down out of the
//! cluster (its agent will not come back, or will come back empty): it is
//! no longer listed, and its allocations are shown as having lost what
//! they had there. An agent that stops cleanly leaves by itself; a node
//! that is up is refused. The master decides; this only asks.

use oncilla_ops::Conn;

use crate::error::CliError;

/// `ocmctl node` subcommands.
#[derive(Debug, clap::Subcommand)]
#[deny(missing_docs)]
pub enum NodeCmd {
    /// Remove a node that is down; its allocations lose what they had on
    /// it (replicated ones go on with their other copies).
    Remove {
        /// The node's name, as `ocmctl nodes` lists it.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
}

/// Runs an `ocmctl node` subcommand.
///
/// # Errors
/// The master cannot be reached or refuses (an unknown node, a node that
/// is up).
pub fn run(cmd: &NodeCmd) -> Result<(), CliError> {
    match cmd {
        NodeCmd::Remove { name, conn } => {
            let lost = conn.connect()?.remove_node(name)?;
            crate::stdout::print(format_args!(
                "removed node {name}; {lost} allocations lost bytes on it\n"
            ))
        }
    }
}
