//! `ocmctl bench map`: remote memory through a pointer
//! (`Allocation::map`) beside the copy API on the same bytes, on a local
//! cluster (the allocation on node-1, the benchmark on node-0):
//!
//! - a sequential scan (a sum of every byte) through the pointer against
//!   `copy_out` of the whole allocation and the same sum;
//! - cold random touches of one byte per page (the fault-to-data latency)
//!   against an 8-byte `copy_out` round trip, p50 and p99, for 4 KiB and
//!   the default blocks;
//! - the write-back of a wholly dirtied mapping (`flush`) against
//!   `copy_in` of the same bytes;
//! - a sort (`slice::sort_unstable`, a program that does not know it is
//!   remote) of a mapped array four times the mapping's budget, against
//!   the same sort in local memory: time, faults, bytes fetched and
//!   written back.
//!
//! It measures; it asserts nothing but that the bytes read back and the
//! sort's result is sorted and a permutation.

use std::hint::black_box;
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Allocation, Kind, MapOptions, Oncilla, Options};
use oncilla_model::size::{parse_size, HumanBytes};
use oncilla_ops::Table;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::report::{gib_per_s, pct};
use crate::BenchError;
use oncilla_cluster::Daemon;

/// Options of `ocmctl bench map`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct MapArgs {
    /// Bytes of the remote allocation scanned, touched and written back.
    #[arg(long, default_value = "1GiB")]
    size: String,
    /// Bytes of the array the sort works on (its mapping's budget is a
    /// quarter of it); 0 skips the sort.
    #[arg(long, default_value = "256MiB")]
    sort: String,
    /// Cold random touches timed per block size.
    #[arg(long, default_value_t = 2000)]
    touches: usize,
    /// Runs of the scan and write-back cases (the table shows the median).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
}

const PAGE: usize = 4096;

/// Runs `ocmctl bench map`.
///
/// # Errors
/// Bad options, a cluster that does not start, failed copies or mappings,
/// and data that does not read back.
pub fn run(args: &MapArgs, daemon: &Daemon) -> Result<(), BenchError> {
    let usage = |e: String| BenchError::Usage(e);
    let size = parse_size(&args.size).map_err(|e| usage(format!("--size: {e}")))?;
    let sort = parse_size(&args.sort).map_err(|e| usage(format!("--sort: {e}")))?;
    if !(1 << 20..=16 << 30).contains(&size) || sort > 16 << 30 || sort % 8 != 0 {
        return Err(usage(
            "--size must be 1MiB to 16GiB, --sort a multiple of 8 bytes up to 16GiB".into(),
        ));
    }
    if !(1..=100).contains(&args.repeat) || !(1..=1_000_000).contains(&args.touches) {
        return Err(usage("--repeat 1 to 100, --touches 1 to 1000000".into()));
    }
    let len = usize::try_from(size).map_err(|_| usage("--size too large".into()))?;
    let capacity = size.max(sort) + (64 << 20);
    let (repeat, touches) = (args.repeat, args.touches);
    oncilla_cluster::run(crate::local(daemon, &[64 << 20, capacity]), move |c| {
        let ocm = Oncilla::connect_with(Options::new(c.socket(0), c.token.clone()))?;
        let remote = |bytes: u64| {
            ocm.alloc_with(&AllocSpec::new(bytes, Kind::RemoteHost).on_nodes(["node-1"]))
        };
        let a = remote(size)?;
        let src = crate::report::pattern(len, 11);
        a.copy_in(0, &src)?;
        let want = sum(&src);
        let mut buf = vec![0u8; len];

        println!(
            "remote memory through a pointer (Allocation::map) beside copies of the same bytes, \
             {} on node-1, median of {repeat}:",
            HumanBytes(size)
        );
        let mut t = Table::new(&["CASE", "MAPPED", "COPY", "RATIO", "NOTE"]);
        scan(&a, &mut buf, len, want, repeat, &mut t)?;
        write_back(&a, &src, repeat, &mut t)?;
        print!("{}", t.render());

        println!();
        println!("cold random touches, one byte per page, {touches} pages (fault to data) beside an 8-byte copy_out:");
        let mut t = Table::new(&[
            "BLOCK",
            "TOUCH p50",
            "TOUCH p99",
            "COPY 8 B p50",
            "COPY 8 B p99",
            "p50 RATIO",
        ]);
        for block in [PAGE as u64, MapOptions::default().block] {
            touch(&a, block, touches, &mut t)?;
        }
        print!("{}", t.render());
        a.free()?;

        if sort > 0 {
            println!();
            sort_case(&remote(sort)?, sort)?;
        }
        Ok(())
    })
}

/// The sum of every byte, eight at a time (what a scan does to each byte).
fn sum(bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let mut s = 0u64;
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        s = s.wrapping_add(u64::from_le_bytes(b) & 0x00ff_00ff_00ff_00ff);
        s = s.wrapping_add((u64::from_le_bytes(b) >> 8) & 0x00ff_00ff_00ff_00ff);
    }
    words
        .remainder()
        .iter()
        .fold(s, |s, &b| s.wrapping_add(u64::from(b)))
}

/// The mapping's bytes as a slice for a read.
///
/// # Safety
/// No one writes the mapping while the slice lives.
unsafe fn bytes<'a>(m: &'a liboncilla::Mapped<'_>) -> &'a [u8] {
    // SAFETY: the mapping is `len` readable bytes for as long as it lives;
    // the caller keeps writers away.
    unsafe { std::slice::from_raw_parts(m.as_ptr(), m.len()) }
}

fn scan(
    a: &Allocation,
    buf: &mut [u8],
    len: usize,
    want: u64,
    repeat: usize,
    t: &mut Table,
) -> Result<(), BenchError> {
    let size = len as u64;
    let (mut mapped, mut copied) = (Vec::new(), Vec::new());
    let mut faults = 0;
    for _ in 0..repeat {
        let m = a.map(MapOptions::default().budget(size))?;
        let started = Instant::now();
        // SAFETY: nothing writes the mapping during the scan.
        let got = sum(black_box(unsafe { bytes(&m) }));
        mapped.push(gib_per_s(size, started.elapsed()));
        faults = m.stats().faults;
        m.unmap()?;
        let started = Instant::now();
        a.copy_out(0, buf)?;
        let got2 = sum(black_box(buf));
        copied.push(gib_per_s(size, started.elapsed()));
        if got != want || got2 != want {
            return Err(BenchError::Verify(
                "the scan's sum differs from the data's".into(),
            ));
        }
    }
    ratio_row(
        t,
        "sequential scan (sum every byte)",
        &mapped,
        &copied,
        format!("copy_out + the same sum; {faults} faults"),
    );
    Ok(())
}

fn write_back(a: &Allocation, src: &[u8], repeat: usize, t: &mut Table) -> Result<(), BenchError> {
    let size = src.len() as u64;
    let (mut flushed, mut copied) = (Vec::new(), Vec::new());
    for i in 0..repeat {
        let m = a.map(MapOptions::default().budget(size))?;
        // Every block dirty (each write fault fetches its block first).
        let fill = 0x5a ^ i as u8;
        // SAFETY: the mapping is `size` writable bytes; nothing else
        // touches it meanwhile.
        unsafe { std::ptr::write_bytes(m.as_ptr(), fill, m.len()) };
        let started = Instant::now();
        m.flush(0, size)?;
        flushed.push(gib_per_s(size, started.elapsed()));
        m.unmap()?;
        let mut probe = [0u8; 1];
        a.copy_out(size - 1, &mut probe)?;
        if probe[0] != fill {
            return Err(BenchError::Verify(
                "a flushed write did not reach the allocation".into(),
            ));
        }
        let started = Instant::now();
        a.copy_in(0, src)?;
        copied.push(gib_per_s(size, started.elapsed()));
    }
    ratio_row(
        t,
        "write-back of a dirty mapping (flush)",
        &flushed,
        &copied,
        "copy_in of the same bytes".into(),
    );
    Ok(())
}

/// A row of the first table: the medians of the mapped and the copied
/// runs (GiB/s) and their ratio.
fn ratio_row(t: &mut Table, case: &str, mapped: &[f64], copied: &[f64], note: String) {
    let (m, c) = (pct(mapped, 50.0), pct(copied, 50.0));
    t.row(vec![
        case.into(),
        format!("{m:.2} GiB/s"),
        format!("{c:.2} GiB/s"),
        format!("{:.2}", m / c),
        note,
    ]);
}

fn touch(a: &Allocation, block: u64, touches: usize, t: &mut Table) -> Result<(), BenchError> {
    let blocks = usize::try_from(a.size() / block).unwrap_or(usize::MAX);
    // Distinct pages in a fixed order, so runs compare the same touches.
    let mut picks: Vec<usize> = (0..blocks).collect();
    picks.shuffle(&mut StdRng::seed_from_u64(7));
    picks.truncate(touches);
    let m = a.map(
        MapOptions::default()
            .block(block)
            .read_ahead(block)
            .budget(a.size()),
    )?;
    let mut lat = Vec::with_capacity(picks.len());
    for &b in &picks {
        let at = usize::try_from(b as u64 * block).unwrap_or(0);
        let started = Instant::now();
        // SAFETY: `at` is inside the mapping; nothing writes it.
        black_box(unsafe { std::ptr::read_volatile(m.as_ptr().add(at)) });
        lat.push(started.elapsed().as_secs_f64() * 1e6);
    }
    m.unmap()?;
    let mut copy = Vec::with_capacity(picks.len());
    let mut eight = [0u8; 8];
    for &b in &picks {
        let started = Instant::now();
        a.copy_out(b as u64 * block, &mut eight)?;
        copy.push(started.elapsed().as_secs_f64() * 1e6);
    }
    let us = |v: f64| format!("{v:.1} us");
    t.row(vec![
        HumanBytes(block).to_string(),
        us(pct(&lat, 50.0)),
        us(pct(&lat, 99.0)),
        us(pct(&copy, 50.0)),
        us(pct(&copy, 99.0)),
        format!("{:.2}", pct(&lat, 50.0) / pct(&copy, 50.0)),
    ]);
    Ok(())
}

fn sort_case(a: &Allocation, bytes: u64) -> Result<(), BenchError> {
    let n = usize::try_from(bytes / 8).map_err(|_| BenchError::Usage("--sort too large".into()))?;
    let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
    let data: Vec<u64> = (0..n).map(|_| rng.random()).collect();
    let raw: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    a.copy_in(0, &raw)?;
    drop(raw);
    let budget = bytes / 4;

    let mut local = data.clone();
    let started = Instant::now();
    local.sort_unstable();
    let local_time = started.elapsed();

    let m = a.map(MapOptions::default().budget(budget))?;
    let started = Instant::now();
    {
        // SAFETY: the mapping is `bytes` bytes, page-aligned (so aligned
        // for u64), and only this slice touches it while it lives.
        let words = unsafe { std::slice::from_raw_parts_mut(m.as_ptr().cast::<u64>(), n) };
        words.sort_unstable();
    }
    m.flush(0, bytes)?;
    let mapped_time = started.elapsed();
    let stats = m.stats();
    m.unmap()?;
    let mut back = vec![0u8; usize::try_from(bytes).unwrap_or(0)];
    a.copy_out(0, &mut back)?;
    let sorted: Vec<u64> = back
        .chunks_exact(8)
        .map(|w| {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            u64::from_le_bytes(b)
        })
        .collect();
    if sorted != local {
        return Err(BenchError::Verify(
            "the mapped sort's result is not the local sort's".into(),
        ));
    }
    let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    println!(
        "sort_unstable of {} u64 ({}) through a mapping with a budget of {} (a quarter), flushed, \
         beside the same sort in local memory:",
        n,
        HumanBytes(bytes),
        HumanBytes(budget)
    );
    let mut t = Table::new(&[
        "WHERE",
        "TIME",
        "FAULTS",
        "FETCHED",
        "WRITTEN BACK",
        "EVICTED BLOCKS",
    ]);
    t.row(vec![
        "mapped remote memory".into(),
        secs(mapped_time),
        stats.faults.to_string(),
        HumanBytes(stats.fetched).to_string(),
        HumanBytes(stats.written_back).to_string(),
        stats.evicted.to_string(),
    ]);
    t.row(vec![
        "local memory".into(),
        secs(local_time),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
    ]);
    print!("{}", t.render());
    println!(
        "mapped / local: {:.1}x the time, {:.1}x the array's bytes fetched",
        mapped_time.as_secs_f64() / local_time.as_secs_f64().max(1e-9),
        stats.fetched as f64 / bytes as f64
    );
    Ok(())
}
