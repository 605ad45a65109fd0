//! `ocmctl put` / `ocmctl get`: stream a file into or out of an allocation
//! through the data path, a bounded chunk at a time, with progress on a
//! terminal.

use std::fs::File;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::Instant;

use liboncilla::{Descriptor, Operator};
use oncilla_model::size::HumanBytes;
use oncilla_ops::Conn;

use crate::error::CliError;

/// `ocmctl put`: copy a file into an allocation.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct PutArgs {
    /// Allocation id or name.
    alloc: String,
    /// File to read (`-`: standard input).
    file: PathBuf,
    /// Offset in the allocation: bytes, or with a unit (`1MiB`, `4k`).
    #[arg(long, default_value = "0", value_parser = size)]
    offset: u64,
    #[command(flatten)]
    conn: Conn,
}

/// `ocmctl get`: copy bytes out of an allocation to a file or stdout.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct GetArgs {
    /// Allocation id or name.
    alloc: String,
    /// Offset in the allocation: bytes, or with a unit (`1MiB`, `4k`).
    #[arg(long, default_value = "0", value_parser = size)]
    offset: u64,
    /// How much to copy, as `--offset` [default: to the end].
    #[arg(long, value_parser = size)]
    len: Option<u64>,
    /// Output file (`-`: stdout) [default: stdout].
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    conn: Conn,
}

/// A byte count as `--offset` and `--len` take it.
fn size(s: &str) -> Result<u64, String> {
    oncilla_model::size::parse_size(s).map_err(|e| e.to_string())
}

/// The allocation `alloc` names, as a validated descriptor from the master
/// `conn` names, and an operator for the data path.
fn open(conn: &Conn, alloc: &str) -> Result<(Descriptor, Operator), CliError> {
    let token = conn.token()?;
    let master = conn.connect()?;
    let desc = Descriptor::from_record(master.allocation(&super::alloc_ref(alloc))?)?;
    Ok((desc, Operator::new(token, master.tls().cloned())))
}

/// Bytes staged in memory at a time.
const STAGE: u64 = 64 << 20;

/// Copies the file (or stdin, for `-`) into the allocation at the offset.
///
/// # Errors
/// Unknown allocation, a file that does not fit (refused before anything
/// is written; stdin, whose length is not known, is refused at the first
/// chunk that would not fit, saying how much was written), I/O and
/// data-path errors.
pub fn put(args: &PutArgs) -> Result<(), CliError> {
    let offset = args.offset;
    let stdin = args.file.as_os_str() == "-";
    let name = if stdin {
        "stdin".to_string()
    } else {
        args.file.display().to_string()
    };
    let io_err = |source| CliError::Io {
        path: name.clone(),
        source,
    };
    let (desc, data) = open(&args.conn, &args.alloc)?;
    let (mut input, total): (Box<dyn Read>, Option<u64>) = if stdin {
        (Box::new(std::io::stdin().lock()), None)
    } else {
        let f = File::open(&args.file).map_err(io_err)?;
        let total = f.metadata().map_err(io_err)?.len();
        desc.check_range(offset, total)?;
        (Box::new(f), Some(total))
    };
    // The offset itself must be inside it, whatever comes in.
    desc.check_range(offset, 0)?;
    let room = desc.size.saturating_sub(offset);
    let mut buf = vec![0u8; usize::try_from(total.unwrap_or(room).clamp(1, STAGE)).unwrap_or(1)];
    let mut progress = Progress::new("put", total.unwrap_or(0));
    let mut done = 0u64;
    loop {
        let n = fill(&mut input, &mut buf).map_err(io_err)?;
        if n == 0 {
            break;
        }
        if done + n as u64 > room {
            return Err(CliError::Other(format!(
                "{name} holds more than the {room} bytes of allocation {} past offset {offset}; {done} bytes were written",
                args.alloc
            )));
        }
        data.write(&desc, offset + done, &buf[..n])?;
        done += n as u64;
        progress.update(done);
    }
    progress.finish();
    Ok(())
}

/// Reads into `buf` until it is full or the input ends; how much it read.
fn fill(input: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Copies the bytes asked for (default: to the end) from the allocation at
/// the offset to the output file or stdout (no `-o`, or `-o -`).
///
/// # Errors
/// Unknown allocation, a range outside it, I/O and data-path errors; a
/// reader of stdout that went away ends it quietly ([`CliError::Closed`]).
pub fn get(args: &GetArgs) -> Result<(), CliError> {
    let offset = args.offset;
    let output = args.output.as_deref().filter(|p| p.as_os_str() != "-");
    let (desc, data) = open(&args.conn, &args.alloc)?;
    let total = args.len.unwrap_or_else(|| desc.size.saturating_sub(offset));
    desc.check_range(offset, total)?;
    let mut out: Box<dyn Write> = match output {
        Some(p) => Box::new(File::create(p).map_err(|source| CliError::Io {
            path: p.display().to_string(),
            source,
        })?),
        None => Box::new(std::io::stdout().lock()),
    };
    let written = |source: std::io::Error| match output {
        Some(p) => CliError::Io {
            path: p.display().to_string(),
            source,
        },
        None => crate::stdout::written(source),
    };
    let mut buf = vec![0u8; usize::try_from(total.min(STAGE)).unwrap_or(0)];
    let mut progress = Progress::new("get", total);
    let mut done = 0u64;
    while done < total {
        let n = usize::try_from((total - done).min(STAGE)).unwrap_or(0);
        data.read(&desc, offset + done, &mut buf[..n])?;
        out.write_all(&buf[..n]).map_err(written)?;
        done += n as u64;
        progress.update(done);
    }
    out.flush().map_err(written)?;
    progress.finish();
    Ok(())
}

/// A one-line progress report on stderr, shown only on a terminal and only
/// for copies larger than one stage.
struct Progress {
    what: &'static str,
    total: u64,
    started: Instant,
    shown: bool,
}

impl Progress {
    fn new(what: &'static str, total: u64) -> Self {
        let shown = total > STAGE && std::io::stderr().is_terminal();
        Self {
            what,
            total,
            started: Instant::now(),
            shown,
        }
    }

    fn update(&mut self, done: u64) {
        if self.shown {
            let secs = self.started.elapsed().as_secs_f64().max(1e-9);
            crate::stdout::say!(
                "\r{} {} / {} ({:.0} MiB/s)   ",
                self.what,
                HumanBytes(done),
                HumanBytes(self.total),
                done as f64 / secs / f64::from(1u32 << 20)
            );
        }
    }

    fn finish(&self) {
        if self.shown {
            crate::stdout::sayln!();
        }
    }
}
