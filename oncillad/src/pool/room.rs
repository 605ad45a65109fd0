//! How much ordinary memory this process may still take when the pool is
//! made: the kernel's estimate of what is available without swapping
//! (`MemAvailable`), and the limit of its memory cgroup less what the
//! cgroup already uses (v2 `memory.max`/`memory.current`, or v1
//! `memory.limit_in_bytes`/`memory.usage_in_bytes`). A pool of base pages
//! larger than that would be pre-faulted and locked into an OOM kill with
//! nothing in the log, so it is refused up front, saying which bound it
//! passes. Huge pages are reserved apart and not counted here. It only
//! reads; it never changes a limit.

use oncilla_model::size::HumanBytes;

use super::PoolError;

/// What bounds the memory this process may still take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Room {
    pub bytes: u64,
    /// Which bound it is, as an operator finds it.
    pub what: String,
}

/// The tighter of `available` (`MemAvailable`, bytes) and `cgroup` (its
/// path, limit and usage; `None`: no limit).
pub(super) fn room(available: Option<u64>, cgroup: Option<(String, u64, u64)>) -> Option<Room> {
    let mem = available.map(|bytes| Room {
        bytes,
        what: "MemAvailable in /proc/meminfo".into(),
    });
    let cg = cgroup.map(|(path, limit, usage)| Room {
        bytes: limit.saturating_sub(usage),
        what: format!(
            "the memory cgroup {path}: limit {}, {} in use",
            HumanBytes(limit),
            HumanBytes(usage)
        ),
    });
    match (mem, cg) {
        (Some(m), Some(c)) => Some(if c.bytes < m.bytes { c } else { m }),
        (m, c) => m.or(c),
    }
}

/// Refuses a base-page pool of `len` bytes that this process may not take.
pub(super) fn check(len: u64) -> Result<(), PoolError> {
    match room(mem_available(), cgroup_limit()) {
        Some(r) if len > r.bytes => Err(PoolError::AboveRoom {
            requested: len,
            room: r.bytes,
            what: r.what,
        }),
        _ => Ok(()),
    }
}

/// `MemAvailable`, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    kib.checked_mul(1024)
}

/// This process's memory cgroup, its limit and its usage, where it has a
/// limit. The usage leaves out the inactive file cache the kernel takes
/// back before it kills (a build's page cache would otherwise look like
/// memory in use).
fn cgroup_limit() -> Option<(String, u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    parse_cgroups(&text)
        .into_iter()
        .find_map(|(dir, max, current)| {
            let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
            let limit = read(max).and_then(|s| limit_of(&s))?;
            let usage: u64 = read(current)?.trim().parse().ok()?;
            let cache = read("memory.stat").map_or(0, |s| inactive_file(&s));
            Some((dir, limit, usage.saturating_sub(cache)))
        })
}

/// Inactive file cache in a `memory.stat` (v1's hierarchical total where
/// it is there).
pub(super) fn inactive_file(stat: &str) -> u64 {
    let field = |name: &str| {
        stat.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse::<u64>().ok()).flatten()
        })
    };
    field("total_inactive_file")
        .or_else(|| field("inactive_file"))
        .unwrap_or(0)
}

/// Where the memory cgroups of `/proc/self/cgroup` keep their limit and
/// usage: (directory, limit file, usage file), v2 and v1.
pub(super) fn parse_cgroups(text: &str) -> Vec<(String, &'static str, &'static str)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if controllers.is_empty() {
            out.push((
                format!("/sys/fs/cgroup{path}"),
                "memory.max",
                "memory.current",
            ));
        } else if controllers.split(',').any(|c| c == "memory") {
            out.push((
                format!("/sys/fs/cgroup/memory{path}"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            ));
        }
    }
    out
}

/// A limit as the file says it: "max" (v2), or v1's near-2^63 page-aligned
/// "unlimited", is none.
pub(super) fn limit_of(s: &str) -> Option<u64> {
    let v: u64 = s.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tighter_bound_is_named() {
        let gib = 1u64 << 30;
        let r = room(
            Some(8 * gib),
            Some(("/sys/fs/cgroup/x".into(), gib, gib / 4)),
        )
        .unwrap();
        assert_eq!(r.bytes, gib - gib / 4);
        assert!(
            r.what.contains("cgroup /sys/fs/cgroup/x: limit 1.0 GiB"),
            "{}",
            r.what
        );
        let r = room(Some(gib), Some(("c".into(), 8 * gib, 0))).unwrap();
        assert_eq!(
            (r.bytes, r.what.as_str()),
            (gib, "MemAvailable in /proc/meminfo")
        );
        assert_eq!(room(None, None), None);
        // A cgroup over its limit has no room, not a wrap-around.
        assert_eq!(room(None, Some(("c".into(), 10, 20))).unwrap().bytes, 0);
    }

    #[test]
    fn cgroup_files_are_found_for_v1_and_v2() {
        let v2 = parse_cgroups("0::/user.slice/oncilla\n");
        assert_eq!(
            v2,
            [(
                "/sys/fs/cgroup/user.slice/oncilla".to_string(),
                "memory.max",
                "memory.current"
            )]
        );
        let v1 = parse_cgroups("5:cpu,cpuacct:/\n4:memory:/a/b\n0::/\n");
        assert_eq!(v1[0].0, "/sys/fs/cgroup/memory/a/b");
        assert_eq!(v1[0].1, "memory.limit_in_bytes");
        assert_eq!(limit_of("max\n"), None);
        assert_eq!(limit_of("9223372036854771712\n"), None);
        assert_eq!(limit_of("209715200\n"), Some(200 << 20));
        let v1 = "cache 9\ninactive_file 5\ntotal_inactive_file 7\n";
        assert_eq!(inactive_file(v1), 7);
        assert_eq!(inactive_file("anon 1\ninactive_file 4096\n"), 4096);
        assert_eq!(inactive_file(""), 0);
    }
}
