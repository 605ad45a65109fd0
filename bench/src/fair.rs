//! `ocmctl bench fair`: a normal tenant's alloc and copy latency alone and
//! beside a greedy tenant, another user that allocates, opens sessions,
//! copies and pulls as fast as it can and keeps whatever it gets. The
//! greedy tenant is this same program run as `ocmctl bench fair-greedy`,
//! as user `nobody` when this runs as root (shares are per user; not root,
//! it runs as this user and the table says so). Before the greedy tenant
//! starts, the bench sets a default quota of 40% of the cluster's memory
//! per user, as an operator sharing a cluster would (`ocmctl quota set`;
//! a build without quotas says so and goes on).
//!
//! It starts its own cluster on loopback, bounds every phase in time and
//! every count, and asserts nothing but that bytes read back: failures are
//! counted and the first one's message printed.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Allocation, Kind, Oncilla, Options};
use serde_json::json;

use crate::report::{pattern, pct};
use crate::BenchError;
use oncilla_cluster::Daemon;
use oncilla_ops::Table;

/// Memory of each of the two agents.
const CAPACITY: u64 = 256 << 20;
/// Longest one scenario's measurement may run.
const PHASE_LIMIT: Duration = Duration::from_secs(60);
/// How long the greedy tenant presses before the normal one measures.
const RAMP: Duration = Duration::from_secs(3);
/// The user the greedy tenant runs as (Debian's `nobody`).
const GREEDY_UID: u32 = 65534;
/// Most sessions the greedy tenant keeps open.
const MAX_GREEDY_SESSIONS: usize = 4096;
/// Most allocations one greedy thread keeps.
const MAX_GREEDY_ALLOCS: usize = 100_000;

/// Options of `ocmctl bench fair`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct FairArgs {
    /// Normal allocations and copies per scenario.
    #[arg(long, default_value_t = 200)]
    iterations: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Options of the hidden `ocmctl bench fair-greedy`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct GreedyArgs {
    /// The local agent's socket.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Longest it presses (it stops sooner when its stdin closes).
    #[arg(long, default_value_t = 300)]
    seconds: u64,
}

/// One scenario's samples (microseconds) and failures.
#[derive(Default)]
struct Row {
    scenario: &'static str,
    alloc: Vec<f64>,
    copy_in: Vec<f64>,
    copy_out: Vec<f64>,
    failed: usize,
    first_error: Option<String>,
}

/// Runs `ocmctl bench fair` on a local cluster it starts.
///
/// # Errors
/// Bad options, a cluster that does not start, the greedy tenant cannot
/// be started, data that does not read back.
pub fn run(args: &FairArgs, daemon: &Daemon) -> Result<(), BenchError> {
    crate::report::within("--iterations", args.iterations, 1..=10_000)?;
    let (iterations, json) = (args.iterations, args.json);
    oncilla_cluster::run(crate::local(daemon, &[CAPACITY, CAPACITY]), move |c| {
        let socket = c.socket(0);
        let quota = set_quota(&c.master_addr, &c.token_file());
        let as_other = nix::unistd::geteuid().is_root();
        if as_other {
            open_to_others(&socket)?;
        }
        let mut rows = Vec::new();
        let scenarios = [
            ("alone", false),
            ("beside greedy", true),
            ("alone (after)", false),
        ];
        let mut greedy_report = None;
        for (name, greedy) in scenarios {
            if !json {
                eprint!("measuring the normal tenant {name} ...");
            }
            let g = greedy
                .then(|| Greedy::start(&socket, as_other))
                .transpose()?;
            if g.is_some() {
                std::thread::sleep(RAMP);
            }
            let row = measure(&socket, iterations, name);
            if let Some(g) = g {
                greedy_report = Some(g.stop());
            }
            if !json {
                eprintln!(" done");
            }
            rows.push(row?);
        }
        print(&rows, &quota, as_other, greedy_report.as_deref(), json);
        Ok(())
    })
}

/// Sets a default quota of 40% of the cluster's memory per user with this
/// program's `quota set`; what happened, for the report.
fn set_quota(master: &str, token_file: &Path) -> String {
    let bytes = (2 * CAPACITY) * 2 / 5;
    let out = std::env::current_exe().and_then(|exe| {
        Command::new(exe)
            .args(["quota", "set", "--default", "--bytes", &bytes.to_string()])
            .args(["--master", master])
            .env("ONCILLA_TOKEN_FILE", token_file)
            .output()
    });
    match out {
        Ok(o) if o.status.success() => format!("default quota {} bytes per user", bytes),
        Ok(o) => format!(
            "no quota (this build: {})",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("refused")
        ),
        Err(e) => format!("no quota ({e})"),
    }
}

/// Lets other users reach the agent's sockets (what an operator sharing a
/// node does; the demo cluster is private to its user).
fn open_to_others(socket: &Path) -> Result<(), BenchError> {
    use std::os::unix::fs::PermissionsExt as _;
    let fail = |e: std::io::Error| BenchError::Failed(format!("cannot open the sockets: {e}"));
    if let Some(dir) = socket.parent() {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).map_err(fail)?;
    }
    let map = oncilla_net::map_socket(socket);
    for p in [socket, map.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o666)).map_err(fail)?;
    }
    Ok(())
}

/// The normal tenant, an application of this user: `iterations` rounds of
/// a 4 KiB allocation on node-1 and a 1 MiB copy in and out there.
fn measure(socket: &Path, iterations: usize, scenario: &'static str) -> Result<Row, BenchError> {
    let started = Instant::now();
    let mut row = Row {
        scenario,
        ..Row::default()
    };
    let ocm = match Oncilla::connect_with(Options::without_token(socket.to_path_buf())) {
        Ok(o) => o,
        Err(e) => {
            row.failed = iterations;
            row.first_error = Some(format!("connect: {e}"));
            return Ok(row);
        }
    };
    let on_node1 = |size| AllocSpec::new(size, Kind::RemoteHost).on_nodes(["node-1"]);
    let data = pattern(1 << 20, 7);
    let mut back = vec![0u8; data.len()];
    let mut big: Option<Allocation> = None;
    for _ in 0..iterations {
        if started.elapsed() > PHASE_LIMIT {
            break;
        }
        let t = Instant::now();
        match ocm.alloc_with(&on_node1(4096)) {
            Ok(a) => {
                row.alloc.push(micros(t.elapsed()));
                let _ = a.free();
            }
            Err(e) => {
                row.failed += 1;
                row.first_error.get_or_insert_with(|| format!("alloc: {e}"));
            }
        }
        if big.is_none() {
            match ocm.alloc_with(&on_node1(1 << 20)) {
                Ok(a) => big = Some(a),
                Err(e) => {
                    row.failed += 1;
                    row.first_error
                        .get_or_insert_with(|| format!("alloc 1 MiB: {e}"));
                    continue;
                }
            }
        }
        let Some(a) = big.as_ref() else { continue };
        let t = Instant::now();
        if let Err(e) = a.copy_in(0, &data) {
            row.failed += 1;
            row.first_error
                .get_or_insert_with(|| format!("copy_in: {e}"));
            continue;
        }
        row.copy_in.push(micros(t.elapsed()));
        let t = Instant::now();
        if let Err(e) = a.copy_out(0, &mut back) {
            row.failed += 1;
            row.first_error
                .get_or_insert_with(|| format!("copy_out: {e}"));
            continue;
        }
        row.copy_out.push(micros(t.elapsed()));
        if back != data {
            return Err(BenchError::Verify(format!(
                "1 MiB read back different {scenario}"
            )));
        }
    }
    if let Some(a) = big {
        let _ = a.free();
    }
    Ok(row)
}

fn print(rows: &[Row], quota: &str, as_other: bool, greedy: Option<&str>, json: bool) {
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "scenario": r.scenario,
                    "alloc_4k_p50_us": pct(&r.alloc, 50.0), "alloc_4k_p99_us": pct(&r.alloc, 99.0),
                    "copy_in_1m_p50_us": pct(&r.copy_in, 50.0), "copy_in_1m_p99_us": pct(&r.copy_in, 99.0),
                    "copy_out_1m_p50_us": pct(&r.copy_out, 50.0), "copy_out_1m_p99_us": pct(&r.copy_out, 99.0),
                    "done": r.copy_out.len(),
                    "failed": r.failed,
                    "first_error": r.first_error,
                })
            })
            .collect();
        oncilla_ops::json::print(&json!({
            "quota": quota,
            "greedy_user": if as_other { "another user" } else { "this user" },
            "greedy": greedy,
            "normal": v,
        }));
        return;
    }
    let mut t = Table::new(&["NORMAL TENANT", "OP", "P50 us", "P99 us", "DONE", "FAILED"]);
    for r in rows {
        for (op, s) in [
            ("alloc 4 KiB", &r.alloc),
            ("copy_in 1 MiB", &r.copy_in),
            ("copy_out 1 MiB", &r.copy_out),
        ] {
            t.row(vec![
                r.scenario.to_string(),
                op.to_string(),
                format!("{:.0}", pct(s, 50.0)),
                format!("{:.0}", pct(s, 99.0)),
                s.len().to_string(),
                r.failed.to_string(),
            ]);
        }
    }
    print!("{}", t.render());
    println!("{quota}");
    if !as_other {
        println!("greedy tenant ran as this same user (run as root to make it another user)");
    }
    if let Some(g) = greedy {
        println!("greedy tenant: {g}");
    }
    for r in rows {
        if let Some(e) = &r.first_error {
            println!("{}: first failure: {e}", r.scenario);
        }
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The greedy tenant's process.
struct Greedy {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Greedy {
    fn start(socket: &Path, as_other: bool) -> Result<Self, BenchError> {
        use std::os::unix::process::CommandExt as _;
        let exe = std::env::current_exe().map_err(|e| {
            BenchError::Failed(format!(
                "cannot find this program to start the greedy tenant: {e}"
            ))
        })?;
        let mut cmd = Command::new(exe);
        cmd.args(["bench", "fair-greedy", "--socket"])
            .arg(socket)
            .env_remove("ONCILLA_TOKEN")
            .env_remove("ONCILLA_TOKEN_FILE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if as_other {
            cmd.uid(GREEDY_UID).gid(GREEDY_UID);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| BenchError::Failed(format!("cannot start the greedy tenant: {e}")))?;
        let stdin = child.stdin.take();
        Ok(Self { child, stdin })
    }

    /// Stops it (closing its stdin) and returns its one-line report.
    fn stop(mut self) -> String {
        drop(self.stdin.take());
        let mut line = String::new();
        if let Some(out) = self.child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if line.trim().is_empty() {
            "no report".into()
        } else {
            line.trim().to_string()
        }
    }
}

/// What the greedy tenant did, counted across its threads.
#[derive(Default)]
struct Counts {
    allocs: AtomicU64,
    alloc_refused: AtomicU64,
    sessions: AtomicU64,
    session_refused: AtomicU64,
    copied: AtomicU64,
    pulled: AtomicU64,
    copy_refused: AtomicU64,
}

/// The greedy tenant: presses with every thread until its stdin closes
/// (or `--seconds` pass), then prints one line of counts.
///
/// # Errors
/// Never for the pressing itself (refusals are what it meets and counts).
pub fn greedy(args: &GreedyArgs) -> Result<(), BenchError> {
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let deadline = Instant::now() + Duration::from_secs(args.seconds.min(3600));
    let connect = {
        let socket = args.socket.clone();
        move || Oncilla::connect_with(Options::without_token(socket.clone()))
    };
    let pressing =
        move |stop: &AtomicBool| !stop.load(Ordering::Relaxed) && Instant::now() < deadline;
    // Memory: 1 MiB and 4 KiB allocations kept until refused, then again.
    for size in [1u64 << 20, 4096] {
        let (stop, counts, connect) = (Arc::clone(&stop), Arc::clone(&counts), connect.clone());
        std::thread::spawn(move || {
            let Ok(ocm) = connect() else { return };
            let mut kept = Vec::new();
            while pressing(&stop) && kept.len() < MAX_GREEDY_ALLOCS {
                let spec = AllocSpec::new(size, Kind::RemoteHost).on_nodes(["node-1"]);
                match ocm.alloc_with(&spec) {
                    Ok(a) => {
                        counts.allocs.fetch_add(1, Ordering::Relaxed);
                        kept.push(a);
                    }
                    Err(_) => {
                        counts.alloc_refused.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
            drop(kept);
        });
    }
    // Sessions: opened and kept until refused, the oldest let go then.
    {
        let (stop, counts, connect) = (Arc::clone(&stop), Arc::clone(&counts), connect.clone());
        std::thread::spawn(move || {
            let mut kept = std::collections::VecDeque::new();
            while pressing(&stop) {
                match connect() {
                    Ok(s) => {
                        counts.sessions.fetch_add(1, Ordering::Relaxed);
                        kept.push_back(s);
                        if kept.len() > MAX_GREEDY_SESSIONS {
                            kept.pop_front();
                        }
                    }
                    Err(_) => {
                        counts.session_refused.fetch_add(1, Ordering::Relaxed);
                        kept.pop_front();
                    }
                }
            }
        });
    }
    // Bandwidth: 4 MiB copies to node-1, and pulls from node-0 to node-1.
    for pull in [false, false, true, true] {
        let (stop, counts, connect) = (Arc::clone(&stop), Arc::clone(&counts), connect.clone());
        std::thread::spawn(move || {
            let Ok(ocm) = connect() else { return };
            let spec = |node: &str| AllocSpec::new(4 << 20, Kind::RemoteHost).on_nodes([node]);
            let (Ok(dst), Ok(src)) = (
                ocm.alloc_with(&spec("node-1")),
                ocm.alloc_with(&spec("node-0")),
            ) else {
                return;
            };
            let buf = vec![3u8; 4 << 20];
            while pressing(&stop) {
                let done = if pull {
                    ocm.copy(&dst, 0, &src, 0, 4 << 20)
                } else {
                    dst.copy_in(0, &buf)
                };
                match done {
                    Ok(()) if pull => counts.pulled.fetch_add(4 << 20, Ordering::Relaxed),
                    Ok(()) => counts.copied.fetch_add(4 << 20, Ordering::Relaxed),
                    Err(_) => counts.copy_refused.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
    }
    // Until the parent closes stdin (or the deadline passes).
    let (closed, stdin_closed) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        let _ = closed.send(());
    });
    let _ = stdin_closed.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    stop.store(true, Ordering::Relaxed);
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let c = &counts;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{} allocations ({} refused), {} sessions ({} refused), {} MiB copied, {} MiB pulled ({} copies refused)",
        n(&c.allocs),
        n(&c.alloc_refused),
        n(&c.sessions),
        n(&c.session_refused),
        n(&c.copied) >> 20,
        n(&c.pulled) >> 20,
        n(&c.copy_refused),
    );
    let _ = out.flush();
    // Its sessions end with the process; the threads need not be joined.
    std::process::exit(0);
}
