//! The `process_*` families every Prometheus client library serves (CPU
//! seconds, resident and virtual memory, descriptors, threads, start
//! time), read from `/proc/self` at scrape time, and `oncilla_build_info`.
//! Linux only, like the daemon. A file that cannot be read leaves its
//! series as they were; nothing here fails a scrape.

use prometheus::{IntGauge, Registry};

use super::{float_gauge, gauge, registered, Sampler};

/// The families, and the sampler that fills them.
pub(super) fn watch(r: &Registry) -> Sampler {
    let build = registered(
        r,
        "oncilla_build_info",
        prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "oncilla_build_info",
                "Always 1; its labels say which build of oncillad this is.",
            ),
            &["version"],
        ),
    );
    build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
    let cpu = registered(
        r,
        "process_cpu_seconds_total",
        prometheus::Counter::new(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
        ),
    );
    let resident = gauge(
        r,
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
    );
    let virt = gauge(
        r,
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
    );
    let fds = gauge(r, "process_open_fds", "Number of open file descriptors.");
    let max_fds = gauge(
        r,
        "process_max_fds",
        "Maximum number of open file descriptors.",
    );
    let threads = gauge(r, "process_threads", "Number of OS threads in the process.");
    let start = float_gauge(
        r,
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
    );
    let tick = clock_ticks();
    let page = page_size();
    let boot = boot_time();
    Box::new(move || {
        if let Some(s) = Stat::read() {
            follow(&cpu, (s.utime + s.stime) as f64 / tick);
            set(&resident, s.rss_pages.saturating_mul(page));
            set(&virt, s.vsize);
            set(&threads, s.threads);
            if let Some(boot) = boot {
                start.set(boot as f64 + s.start_ticks as f64 / tick);
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            set(&fds, dir.count() as u64);
        }
        set(&max_fds, crate::pool::open_file_limit() as u64);
    })
}

fn set(g: &IntGauge, v: u64) {
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
}

/// Moves a counter up to `total` (it never goes down).
fn follow(c: &prometheus::Counter, total: f64) {
    let more = total - c.get();
    if more > 0.0 {
        c.inc_by(more);
    }
}

/// The fields of `/proc/self/stat` these families need.
struct Stat {
    utime: u64,
    stime: u64,
    threads: u64,
    start_ticks: u64,
    vsize: u64,
    rss_pages: u64,
}

impl Stat {
    fn read() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/self/stat").ok()?)
    }

    /// proc(5): fields after the command (in parentheses, which may hold
    /// spaces and parentheses itself: everything up to the last `)`),
    /// counted from 3 (state).
    fn parse(text: &str) -> Option<Self> {
        let rest = &text[text.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
        Some(Self {
            utime: field(14)?,
            stime: field(15)?,
            threads: field(20)?,
            start_ticks: field(22)?,
            vsize: field(23)?,
            rss_pages: field(24)?,
        })
    }
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`; 100 where unknown).
fn clock_ticks() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as f64,
        _ => 100.0,
    }
}

fn page_size() -> u64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE) {
        Ok(Some(p)) if p > 0 => u64::try_from(p).unwrap_or(4096),
        _ => 4096,
    }
}

/// When the machine booted, in seconds since the epoch (`btime` of
/// `/proc/stat`).
fn boot_time() -> Option<u64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::Stat;

    #[test]
    fn a_stat_line_parses_even_with_parentheses_in_the_command() {
        let line = "4242 (odd) name)) S 1 4242 4242 0 -1 4194560 1 0 0 0 250 50 0 0 20 0 7 0 12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let s = Stat::parse(line).unwrap();
        assert_eq!((s.utime, s.stime), (250, 50));
        assert_eq!(s.threads, 7);
        assert_eq!(s.start_ticks, 12345);
        assert_eq!(s.vsize, 104_857_600);
        assert_eq!(s.rss_pages, 2560);
        assert!(Stat::parse("garbage").is_none());
        assert!(Stat::read().is_some(), "this process's own stat");
    }
}
