//! What /proc says of a daemon: its CPU time and resident memory, for the
//! tests and benchmarks that report them. It reads; it never signals or
//! waits for a process.

use std::time::Duration;

/// A process's or thread's name and its user-space and kernel CPU time,
/// from its /proc `stat` file (`/proc/PID/stat`, `/proc/PID/task/TID/stat`);
/// `None` when it is gone or unreadable.
pub fn stat(path: &str) -> Option<(String, Duration, Duration)> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The name is in parentheses and may hold spaces; fields follow it.
    let name = stat[stat.find('(')? + 1..stat.rfind(')')?].to_string();
    let mut fields = stat[stat.rfind(')')? + 2..].split_whitespace().skip(11);
    let hz = clk_tck();
    let mut time = || -> Option<Duration> {
        let ticks: u64 = fields.next()?.parse().ok()?;
        Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
    };
    let user = time()?;
    let kernel = time()?;
    Some((name, user, kernel))
}

/// Process `pid`'s CPU time so far, user and kernel together.
pub fn cpu(pid: u32) -> Option<Duration> {
    stat(&format!("/proc/{pid}/stat")).map(|(_, user, kernel)| user + kernel)
}

/// Process `pid`'s resident memory in bytes (`VmRSS`).
pub fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// `sysconf(_SC_CLK_TCK)`: the unit of /proc's CPU times.
fn clk_tck() -> u64 {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100);
    u64::try_from(ticks).unwrap_or(100)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let (name, _, _) = super::stat(&format!("/proc/{me}/stat")).unwrap();
        assert!(!name.is_empty());
        assert!(super::cpu(me).is_some());
        assert!(super::rss(me).unwrap() > 0);
        assert_eq!(super::cpu(u32::MAX), None);
    }
}
