//! `ocmctl quota`: users' quotas and what each user holds (`show`), and
//! changing them (`set`, `clear`), through the master, which keeps them in
//! its quota file. It never decides what a quota allows (the master does).

use oncilla_model::quota::Subject;
use oncilla_model::size::parse_size;
use oncilla_ops::Conn;

use crate::error::CliError;
use crate::render::quota::table;

/// `ocmctl quota` subcommands.
#[derive(Debug, clap::Subcommand)]
#[deny(missing_docs)]
pub enum QuotaCmd {
    /// The default quota, and every user with a quota of their own or
    /// allocations: what they hold against their limits.
    Show {
        #[command(flatten)]
        conn: Conn,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Change the default quota or one user's; limits not given stay as
    /// they are (a user without limits of their own starts from the
    /// default's). `none` removes a limit.
    Set {
        #[command(flatten)]
        who: Who,
        /// Bytes of all the user's allocations together, e.g. 4GiB.
        #[arg(long, value_name = "SIZE|none")]
        bytes: Option<String>,
        /// Bytes of the user's allocations on any one node.
        #[arg(long, value_name = "SIZE|none")]
        node_bytes: Option<String>,
        /// Allocations (persistent ones included).
        #[arg(long, value_name = "N|none")]
        allocations: Option<String>,
        /// Persistent (and named) allocations, which outlive their process.
        #[arg(long, value_name = "N|none")]
        persistent: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Drop one user's own limits: the default applies to them again.
    Clear {
        /// The user's uid.
        #[arg(long, value_name = "UID")]
        user: u32,
        #[command(flatten)]
        conn: Conn,
    },
}

/// Whose quota `set` changes.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct Who {
    /// Everyone without a quota of their own.
    #[arg(long)]
    default: bool,
    /// One user, by uid.
    #[arg(long, value_name = "UID")]
    user: Option<u32>,
}

/// Runs `ocmctl quota ...`.
///
/// # Errors
/// Bad values; the master cannot be reached or refuses.
pub fn run(cmd: &QuotaCmd) -> Result<(), CliError> {
    match cmd {
        QuotaCmd::Show { conn, json } => {
            let report = conn.connect()?.quotas()?;
            if *json {
                crate::stdout::json(&crate::render::quota::json(&report))?;
            } else {
                crate::stdout::print(table(&report))?;
                if !report.persistent {
                    crate::stdout::sayln!(
                        "note: this master keeps no quota file (oncillad --quota-file), so quotas cannot be set"
                    );
                }
            }
        }
        QuotaCmd::Set {
            who,
            bytes,
            node_bytes,
            allocations,
            persistent,
            conn,
        } => {
            let master = conn.connect()?;
            let subject = match who.user {
                Some(uid) => Subject::User(uid),
                None => Subject::Default,
            };
            let now = master.quotas()?;
            let mut limits = match subject {
                Subject::Default => now.default,
                Subject::User(uid) => now
                    .users
                    .iter()
                    .find(|u| u.uid == uid)
                    .and_then(|u| u.limits)
                    .unwrap_or(now.default),
            };
            let size = |v: &str| parse_size(v).map_err(|e| e.to_string());
            let count = |v: &str| v.parse::<u64>().map_err(|e| e.to_string());
            for (flag, value, field, parse) in [
                (
                    "--bytes",
                    bytes,
                    &mut limits.bytes,
                    &size as &dyn Fn(&str) -> _,
                ),
                ("--node-bytes", node_bytes, &mut limits.node_bytes, &size),
                (
                    "--allocations",
                    allocations,
                    &mut limits.allocations,
                    &count,
                ),
                ("--persistent", persistent, &mut limits.persistent, &count),
            ] {
                if let Some(v) = value {
                    *field = limit(flag, v, parse)?;
                }
            }
            let report = master.set_quota(subject, Some(limits))?;
            crate::stdout::print(table(&report))?;
        }
        QuotaCmd::Clear { user, conn } => {
            let report = conn.connect()?.set_quota(Subject::User(*user), None)?;
            crate::stdout::print(table(&report))?;
        }
    }
    Ok(())
}

/// One limit from the command line: `none`, or what `parse` makes of it.
fn limit(
    flag: &str,
    value: &str,
    parse: &dyn Fn(&str) -> Result<u64, String>,
) -> Result<Option<u64>, CliError> {
    if value == "none" {
        return Ok(None);
    }
    parse(value)
        .map(Some)
        .map_err(|e| CliError::Other(format!("{flag} {value:?}: {e} (or `none` for no limit)")))
}
