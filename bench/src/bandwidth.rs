//! `ocmctl bench placement`: copy bandwidth by where the bytes live: one
//! remote node, three remote nodes striped (every node's stripes in
//! parallel), this node's pool through shared memory, and a plain memcpy
//! as the floor. It measures; it asserts nothing but that the bytes read
//! back.

use std::time::Instant;

use liboncilla::{AllocSpec, Kind, Oncilla, Options};
use oncilla_model::size::{parse_size, HumanBytes};

use crate::report::{gib_per_s, pct};
use crate::BenchError;
use oncilla_cluster::Daemon;
use oncilla_ops::Table;

/// Options of `ocmctl bench placement`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct PlacementArgs {
    /// Bytes per copy.
    #[arg(long, default_value = "256MiB")]
    size: String,
    /// Stripe unit of the striped allocation.
    #[arg(long, default_value = "1MiB")]
    stripe: String,
    /// Copies per case (the table shows the median).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
}

/// Runs `ocmctl bench placement` on a local cluster: the benchmark's own
/// agent (node-0) and three remote agents.
///
/// # Errors
/// Bad options, a cluster that does not start, failed copies, and data
/// that does not read back.
pub fn run(args: &PlacementArgs, daemon: &Daemon) -> Result<(), BenchError> {
    let size = parse_size(&args.size).map_err(|e| BenchError::Usage(format!("--size: {e}")))?;
    let stripe =
        parse_size(&args.stripe).map_err(|e| BenchError::Usage(format!("--stripe: {e}")))?;
    if size == 0 || size > 8 << 30 {
        return Err(BenchError::Failed(
            "--size must be between 1 byte and 8GiB".into(),
        ));
    }
    crate::report::within("--repeat", args.repeat, 1..=100)?;
    let len = usize::try_from(size).map_err(|_| BenchError::Usage("--size too large".into()))?;
    // Room for the case's allocation plus page rounding on every agent.
    let capacity = size + (64 << 20);
    let repeat = args.repeat;
    oncilla_cluster::run(crate::local(daemon, &[capacity; 4]), move |c| {
        let ocm = Oncilla::connect_with(Options::new(c.socket(0), c.token.clone()))?;
        let remote = ["node-1", "node-2", "node-3"];
        let cases = [
            (
                "1 remote node",
                AllocSpec::new(size, Kind::RemoteHost).on_nodes(["node-1"]),
            ),
            (
                "3 remote nodes, striped",
                AllocSpec::new(size, Kind::RemoteHost)
                    .on_nodes(remote)
                    .stripe(stripe),
            ),
            ("same node", AllocSpec::new(size, Kind::LocalHost)),
        ];
        let src = crate::report::pattern(len, 7);
        let mut dst = vec![0xA5u8; len];
        let mut t = Table::new(&["CASE", "FABRIC", "EXTENTS", "WRITE GiB/s", "READ GiB/s"]);
        for (what, spec) in cases {
            let a = ocm.alloc_with(&spec)?;
            let fabrics: std::collections::BTreeSet<String> =
                a.fabrics().iter().map(ToString::to_string).collect();
            let (mut w, mut r) = (Vec::new(), Vec::new());
            for _ in 0..repeat {
                let started = Instant::now();
                a.copy_in(0, &src)?;
                w.push(gib_per_s(size, started.elapsed()));
                let started = Instant::now();
                a.copy_out(0, &mut dst)?;
                r.push(gib_per_s(size, started.elapsed()));
            }
            if dst != src {
                return Err(BenchError::Verify(format!(
                    "{what}: data did not read back"
                )));
            }
            t.row(vec![
                what.into(),
                fabrics.into_iter().collect::<Vec<_>>().join(","),
                a.descriptor().extents.len().to_string(),
                format!("{:.2}", pct(&w, 50.0)),
                format!("{:.2}", pct(&r, 50.0)),
            ]);
            a.free()?;
        }
        // The floor for same-node copies: memcpy between two buffers of
        // this process.
        let (mut w, mut r) = (Vec::new(), Vec::new());
        for _ in 0..repeat {
            let started = Instant::now();
            dst.copy_from_slice(&src);
            w.push(gib_per_s(size, started.elapsed()));
            let started = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            r.push(gib_per_s(size, started.elapsed()));
        }
        t.row(vec![
            "plain memcpy".into(),
            "-".into(),
            "-".into(),
            format!("{:.2}", pct(&w, 50.0)),
            format!("{:.2}", pct(&r, 50.0)),
        ]);
        println!(
            "copy bandwidth, {} per copy, median of {repeat} (write = copy_in, read = copy_out):",
            HumanBytes(size)
        );
        print!("{}", t.render());
        Ok(())
    })
}
