//! `ocmctl top`: the cluster's nodes and allocations, refreshed every
//! interval until Ctrl-C or `--count` frames. On a terminal each frame
//! redraws the screen; elsewhere (a pipe, a log) frames follow one another,
//! each headed by its time, so the output stays readable. `--json` prints
//! one JSON document per frame, as `nodes --json` and `allocs --json` do.
//!
//! It only reads from the master.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use oncilla_model::size::HumanBytes;
use oncilla_ops::Conn;

use crate::error::CliError;
use crate::render;

/// Options of `ocmctl top`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    /// Time between frames: `2s`, `500ms` (at least 100ms).
    #[arg(long, default_value = "2s", value_parser = parse_interval)]
    interval: Duration,
    /// Stop after this many frames [default: run until Ctrl-C].
    #[arg(long)]
    count: Option<u64>,
    /// Allocations shown per frame, newest first (the header counts all).
    #[arg(long, default_value_t = 20)]
    allocs: usize,
    /// One JSON document per frame instead of tables.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Conn,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.strip_suffix("ms") {
        Some(n) => (n, 1),
        None => (s.strip_suffix('s').unwrap_or(s), 1000),
    };
    let ms = num
        .trim()
        .parse::<u64>()
        .map_err(|_| format!("{s:?}: give a time such as 2s or 500ms"))?
        .saturating_mul(unit);
    if ms < 100 {
        return Err(format!("{s:?}: at least 100ms"));
    }
    Ok(Duration::from_millis(ms))
}

/// Runs `ocmctl top`.
///
/// # Errors
/// The master cannot be reached (the first frame), or stdout is gone.
pub fn run(args: &Args) -> Result<(), CliError> {
    let m = args.conn.connect()?;
    let redraw = std::io::stdout().is_terminal() && !args.json;
    let mut frame = 0u64;
    loop {
        let started = Instant::now();
        let nodes = m.node_list()?;
        let mut allocs = m.allocations()?;
        let text = if args.json {
            serde_json::json!({
                "nodes": render::nodes::json(&nodes),
                "allocations": allocs.iter().map(render::allocs::json).collect::<Vec<_>>(),
            })
            .to_string()
                + "\n"
        } else {
            let total: u64 = allocs.iter().map(|a| a.size).sum();
            let count = allocs.len();
            // Newest first.
            allocs.sort_by(|a, b| {
                b.created_unix_ms
                    .cmp(&a.created_unix_ms)
                    .then(b.id.cmp(&a.id))
            });
            allocs.truncate(args.allocs);
            let mut t = format!(
                "oncilla top: master {}, {} nodes, {count} allocations ({}), every {} ms (Ctrl-C to stop)\n\n",
                args.conn.master,
                nodes.nodes.len(),
                HumanBytes(total),
                args.interval.as_millis()
            );
            t += &render::nodes::table(&nodes, render::now_ms());
            t += "\n";
            t += &render::allocs::table(&allocs, render::now_ms());
            if count > allocs.len() {
                t += &format!("... and {} more\n", count - allocs.len());
            }
            t
        };
        let mut out = std::io::stdout().lock();
        let written = if redraw {
            // Home, clear, then the frame.
            write!(out, "\x1b[H\x1b[2J{text}")
        } else {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            if args.json {
                write!(out, "{text}")
            } else {
                write!(out, "--- frame {} at unix time {secs}\n{text}", frame + 1)
            }
        };
        written
            .and_then(|()| out.flush())
            .map_err(|source| CliError::Io {
                path: "stdout".into(),
                source,
            })?;
        drop(out);
        frame += 1;
        if args.count.is_some_and(|c| frame >= c) {
            return Ok(());
        }
        std::thread::sleep(args.interval.saturating_sub(started.elapsed()));
    }
}

#[cfg(test)]
mod tests {
    use super::parse_interval;
    use std::time::Duration;

    #[test]
    fn intervals_parse_and_are_bounded() {
        assert_eq!(parse_interval("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_interval("3"), Ok(Duration::from_secs(3)));
        assert!(parse_interval("50ms").is_err());
        assert!(parse_interval("fast").is_err());
    }
}
