//! `ocmctl node-keys`: a node's keys, derived from the cluster token, for
//! `oncillad --node-keys-file`: the agent then holds no token and can act
//! only as that node.

use std::path::PathBuf;

use oncilla_ops::{certs, Conn};

use crate::error::CliError;

/// Options of `ocmctl node-keys`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    /// The node's name (its agent's --name).
    name: String,
    /// File to write (mode 0600) [default: stdout].
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    #[command(flatten)]
    conn: Conn,
}

/// Writes the node's keys to the file (private) or stdout.
///
/// # Errors
/// A bad name, no usable token, a file that cannot be written.
pub fn run(args: &Args) -> Result<(), CliError> {
    let (name, out, conn) = (args.name.as_str(), args.out.as_deref(), &args.conn);
    if name.is_empty() || name.len() > 128 || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(CliError::Other(format!(
            "node name {}: use 1 to 128 printable ASCII characters without spaces",
            oncilla_model::echo::echo(name)
        )));
    }
    let text = oncilla_net::credential::NodeKeys::derive(&conn.token()?, name).to_text();
    let Some(path) = out else {
        crate::stdout::print(&text)?;
        return Ok(());
    };
    certs::write_private(path, text.as_bytes()).map_err(|source| CliError::Io {
        path: path.display().to_string(),
        source,
    })?;
    crate::stdout::sayln!("wrote the keys of node {name} to {}", path.display());
    Ok(())
}
