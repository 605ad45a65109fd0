//! Many processes copying at once, for `ocmctl bench copy`: the benchmark
//! starts this same binary N times as `ocmctl bench copy-worker`, waits
//! until every worker has its session and allocation, releases them all
//! at once, and sums what they moved over the time until the last one is
//! done.
//!
//! A worker talks to its parent over its stdin and stdout only, one line
//! each way per step. The token reaches it in its environment, never on
//! its command line. Every wait is bounded.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Kind, Oncilla, Options};

use crate::BenchError;

/// How long a worker may take to get ready, and to finish its copies.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// Options of the hidden `ocmctl bench copy-worker`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct WorkerArgs {
    /// The local agent's socket.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Node to allocate on.
    #[arg(long)]
    target: String,
    /// Bytes per copy.
    #[arg(long)]
    size: u64,
    /// Copies to make.
    #[arg(long)]
    rounds: u64,
    /// Copy direction.
    #[arg(long, value_parser = ["read", "write"])]
    op: String,
    /// Fabric preference.
    #[arg(long, default_value = "auto")]
    fabric: String,
    /// Cluster token.
    #[arg(long, env = "ONCILLA_TOKEN", hide_env_values = true)]
    token: String,
}

/// Runs one worker: allocate, say `ready`, wait for `go`, copy, say
/// `done BYTES`, free.
///
/// # Errors
/// The session, the allocation or a copy fails, or the parent goes away.
pub fn worker(args: &WorkerArgs) -> Result<(), BenchError> {
    let token = oncilla_net::auth::Token::new(&args.token)?;
    let mut opts = Options::new(args.socket.clone(), token).streams(1);
    opts.fabric = liboncilla::Fabric::parse(&args.fabric)?;
    let ocm = Oncilla::connect_with(opts)?;
    let a =
        ocm.alloc_with(&AllocSpec::new(args.size, Kind::RemoteHost).on_nodes([&args.target]))?;
    let n = usize::try_from(args.size).map_err(|_| {
        BenchError::Failed(format!("{} bytes do not fit in memory here", args.size))
    })?;
    let mut buf = vec![0x5au8; n];
    let write = args.op == "write";
    // One untimed copy each, so connections exist before the clock starts.
    a.copy_in(0, &buf)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").map_err(pipe)?;
    out.flush().map_err(pipe)?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).map_err(pipe)?;
    if line.trim() != "go" {
        return Err(BenchError::Failed(
            "copy-worker: the parent went away".into(),
        ));
    }
    for _ in 0..args.rounds {
        if write {
            a.copy_in(0, &buf)?;
        } else {
            a.copy_out(0, &mut buf)?;
        }
    }
    writeln!(out, "done {}", args.size * args.rounds).map_err(pipe)?;
    out.flush().map_err(pipe)?;
    a.free()?;
    Ok(())
}

/// A started worker.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Worker {
    fn start(
        opts: &Options,
        target: &str,
        size: u64,
        rounds: u64,
        write: bool,
    ) -> Result<Self, BenchError> {
        let exe = std::env::current_exe().map_err(|e| {
            BenchError::Failed(format!("cannot find this program to start workers: {e}"))
        })?;
        let mut child = Command::new(exe)
            .args(["bench", "copy-worker", "--socket"])
            .arg(&opts.socket)
            .args(["--target", target, "--size", &size.to_string()])
            .args(["--rounds", &rounds.to_string()])
            .args(["--op", if write { "write" } else { "read" }])
            .args(["--fabric", &opts.fabric.to_string()])
            .envs(opts.token.as_ref().map(|t| ("ONCILLA_TOKEN", t.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| BenchError::Failed(format!("cannot start a copy worker: {e}")))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(BenchError::Failed("copy worker has no pipes".into()));
        };
        Ok(Self {
            child,
            stdin,
            lines: forward_lines(stdout),
        })
    }

    /// The next line the worker says, within `limit` of `since`.
    fn expect(
        &mut self,
        since: Instant,
        limit: Duration,
        what: &str,
    ) -> Result<String, BenchError> {
        let left = limit.saturating_sub(since.elapsed());
        self.lines.recv_timeout(left).map_err(|_| {
            BenchError::Failed(format!(
                "copy worker {} did not say {what} within {}s (its errors are above)",
                self.child.id(),
                limit.as_secs()
            ))
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Reaps it whether it finished or not: no worker outlives the bench.
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Lines from a worker's stdout, on a channel so waits can time out.
fn forward_lines(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// `processes` workers, each its own process with its own session and
/// allocation on `target`, copying `size` bytes `rounds` times at once;
/// aggregate GB/s and bytes moved.
///
/// # Errors
/// A worker that cannot start, fails or takes too long.
pub fn at_once(
    opts: &Options,
    target: &str,
    processes: usize,
    size: u64,
    rounds: u64,
    write: bool,
) -> Result<(f64, u64), BenchError> {
    let mut workers = (0..processes)
        .map(|_| Worker::start(opts, target, size, rounds, write))
        .collect::<Result<Vec<_>, _>>()?;
    let since = Instant::now();
    for w in &mut workers {
        let line = w.expect(since, READY_TIMEOUT, "ready")?;
        if line != "ready" {
            return Err(BenchError::Failed(format!(
                "copy worker said {line:?}, not ready"
            )));
        }
    }
    let started = Instant::now();
    for w in &mut workers {
        writeln!(w.stdin, "go").map_err(pipe)?;
        w.stdin.flush().map_err(pipe)?;
    }
    let mut moved = 0u64;
    for w in &mut workers {
        let line = w.expect(started, RUN_TIMEOUT, "done")?;
        moved += line
            .strip_prefix("done ")
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(|| BenchError::Failed(format!("copy worker said {line:?}, not done")))?;
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    for mut w in workers {
        let status = w.child.wait().map_err(pipe)?;
        if !status.success() {
            return Err(BenchError::Failed(format!(
                "copy worker ended with {status}"
            )));
        }
    }
    Ok((moved as f64 / secs / 1e9, moved))
}

fn pipe(source: std::io::Error) -> BenchError {
    BenchError::Io {
        path: "copy worker pipe".into(),
        source,
    }
}
