//! `ocmctl top`: the cluster's nodes and allocations, refreshed every
//! interval until Ctrl-C or `--count` frames. On a terminal each frame
//! redraws the screen; elsewhere (a pipe, a log) frames follow one another,
//! each headed by its time, so the output stays readable. `--json` prints
//! one JSON document per frame, as `nodes --json` and `allocs --json` do.
//!
//! It only reads from the master.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use oncilla_model::alloc::Allocation;
use oncilla_model::node::NodeList;
use oncilla_model::size::HumanBytes;
use oncilla_ops::Conn;

use crate::error::CliError;
use crate::render;

/// Options of `ocmctl top`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    /// Time between frames: `2s`, `500ms` (at least 100ms).
    #[arg(long, default_value = "2s", value_parser = super::parse_time)]
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

/// Runs `ocmctl top`. A master that cannot be reached (or is restarting)
/// is shown in the frame, and asked again at the next one.
///
/// # Errors
/// A master address that cannot be used at all, or stdout is gone.
pub fn run(args: &Args) -> Result<(), CliError> {
    let m = args.conn.connect()?;
    let redraw = std::io::stdout().is_terminal() && !args.json;
    let mut frame = 0u64;
    loop {
        let started = Instant::now();
        let read = m.node_list().and_then(|n| Ok((n, m.allocations()?)));
        let text = match read {
            Ok((nodes, allocs)) => frame_text(args, &nodes, allocs),
            // Asking again cannot help a wrong token or address.
            Err(e) if !e.may_pass() => return Err(e.into()),
            Err(e) if args.json => serde_json::json!({ "error": e.to_string() }).to_string() + "\n",
            Err(e) => format!(
                "oncilla top: master {}: {e}\nasking again every {} ms (Ctrl-C to stop)\n",
                args.conn.master,
                args.interval.as_millis()
            ),
        };
        let mut out = std::io::stdout().lock();
        let written = if redraw {
            // Home, clear, then the frame.
            write!(out, "\x1b[H\x1b[2J{text}")
        } else if args.json {
            write!(out, "{text}")
        } else {
            write!(
                out,
                "--- frame {} at {}\n{text}",
                frame + 1,
                render::utc(render::now_ms())
            )
        };
        written
            .and_then(|()| out.flush())
            .map_err(crate::stdout::written)?;
        drop(out);
        frame += 1;
        if args.count.is_some_and(|c| frame >= c) {
            return Ok(());
        }
        std::thread::sleep(args.interval.saturating_sub(started.elapsed()));
    }
}

/// One frame of a master that answered.
fn frame_text(args: &Args, nodes: &NodeList, mut allocs: Vec<Allocation>) -> String {
    if args.json {
        return serde_json::json!({
            "nodes": render::nodes::json(nodes),
            "allocations": allocs.iter().map(render::allocs::json).collect::<Vec<_>>(),
        })
        .to_string()
            + "\n";
    }
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
    t += &render::nodes::table(nodes, render::now_ms());
    t += "\n";
    t += &render::allocs::table(&allocs, render::now_ms());
    if count > allocs.len() {
        t += &format!("... and {} more\n", count - allocs.len());
    }
    t
}
