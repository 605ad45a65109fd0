//! ocmctl's standard output and error. Everything a subcommand prints goes
//! through [`print`], so a reader that goes away early (`ocmctl show 4 |
//! head -3`) ends ocmctl quietly ([`CliError::Closed`]) instead of the
//! panic Rust's `print!` gives on a closed pipe. Errors, notes and
//! progress go to stderr through [`say!`] and [`sayln!`], which never
//! panic: a closed stderr loses them, nothing else.

use std::io::{ErrorKind, Write};

use crate::error::CliError;

/// Writes `text` to stdout and flushes it.
///
/// # Errors
/// [`CliError::Closed`] when the reader closed the pipe; any other write
/// error as [`CliError::Io`].
pub fn print(text: impl std::fmt::Display) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    write!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(written)
}

/// Writes `text` to stderr; a stderr that is closed or full loses it.
pub fn note(text: impl std::fmt::Display) {
    let _ = write!(std::io::stderr().lock(), "{text}");
}

/// `eprint!` that never panics (see [`note`]).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::stdout::note(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics (see [`note`]).
macro_rules! sayln {
    () => {
        $crate::stdout::note("\n")
    };
    ($($arg:tt)*) => {
        $crate::stdout::note(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {say, sayln};

/// A failed write to stdout, as ocmctl reports it.
pub fn written(e: std::io::Error) -> CliError {
    if e.kind() == ErrorKind::BrokenPipe {
        CliError::Closed
    } else {
        CliError::Io {
            path: "stdout".into(),
            source: e,
        }
    }
}

/// Writes `v` as pretty JSON and a newline (`--json`), as [`print`] does.
///
/// # Errors
/// As [`print`].
pub fn json(v: &serde_json::Value) -> Result<(), CliError> {
    print(format_args!("{}\n", oncilla_ops::json::pretty(v)))
}
