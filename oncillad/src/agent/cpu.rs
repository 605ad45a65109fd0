//! The CPU time this process has used, for the agent's status report
//! (benchmarks divide its growth by the bytes moved). It only asks the
//! kernel; it never changes anything.

use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeVal;

/// CPU time this process has used, user and system, in nanoseconds (0 if
/// the kernel will not say).
pub fn process_cpu_ns() -> u64 {
    let Ok(u) = getrusage(UsageWho::RUSAGE_SELF) else {
        return 0;
    };
    let ns = |t: TimeVal| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_usec()).unwrap_or(0) * 1_000
    };
    ns(u.user_time()) + ns(u.system_time())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        let before = process_cpu_ns();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = process_cpu_ns();
        assert!(after > before, "{before} -> {after}");
    }
}
