//! One module per `ocmctl` subcommand (put and get share `data`, tls-ca
//! and tls-cert share `tls`): each holds its flags (`Args`) and its `run`.
//! What they show is `crate::render`'s; how they reach the master is
//! `oncilla_ops`'s.

pub mod alloc;
pub mod allocs;
pub mod data;
pub mod demo;
pub mod drain;
pub mod free;
pub mod health;
pub mod node;
pub mod node_keys;
pub mod nodes;
pub mod quota;
pub mod run;
pub mod show;
pub mod tls;
pub mod top;

use std::time::Duration;

use oncilla_model::alloc::AllocRef;
use oncilla_ops::Conn;

/// The flags of a listing (`nodes`, `allocs`): how to reach the master,
/// and JSON instead of a table.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Listing {
    #[command(flatten)]
    conn: Conn,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// An allocation named on the command line: digits are an id, anything
/// else a name (names never consist of digits only).
pub fn alloc_ref(arg: &str) -> AllocRef {
    match arg.parse::<u64>() {
        Ok(id) => AllocRef::Id(id),
        Err(_) => AllocRef::Name(arg.to_string()),
    }
}

/// Longest time accepted on the command line: a day.
const MAX_TIME_MS: f64 = 86_400_000.0;

/// A time on the command line (`--interval`, `--timeout`): `2s`, `1.5s`,
/// `500ms`, plain seconds; 100 ms to a day.
pub fn parse_time(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.strip_suffix("ms") {
        Some(n) => (n, 1.0),
        None => (s.strip_suffix('s').unwrap_or(s), 1000.0),
    };
    let ms = num
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite() && *n >= 0.0)
        .map(|n| n * unit)
        .ok_or_else(|| format!("{s:?}: give a time such as 2s, 1.5s or 500ms"))?;
    if ms < 100.0 {
        return Err(format!("{s:?}: at least 100ms"));
    }
    if ms > MAX_TIME_MS {
        return Err(format!("{s:?}: at most a day"));
    }
    // Whole milliseconds, within a day: exact in an f64 and a u64.
    Ok(Duration::from_millis(ms.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::parse_time;
    use std::time::Duration;

    #[test]
    fn times_parse_and_are_bounded() {
        assert_eq!(parse_time("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_time("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_time("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_time("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_time("0.25s"), Ok(Duration::from_millis(250)));
        assert!(parse_time("-1s").is_err());
        assert!(parse_time("NaNs").is_err());
        assert!(parse_time("2d").is_err());
        assert!(parse_time("100000s").is_err());
        assert!(parse_time("50ms").is_err());
        assert!(parse_time("fast").is_err());
    }
}
