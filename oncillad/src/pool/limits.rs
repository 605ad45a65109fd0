//! What the kernel lets the pool hold, read when it is asked: open files
//! (the budget of memory files), mappings, locked memory, huge pages,
//! physical memory and the page size. It decides nothing about which
//! memory goes where.

use super::PoolError;
use oncilla_model::size::HumanBytes;

/// How many memory files the pool may hold, from the open-file limit in
/// force now (an operator may change it with `prlimit`): a quarter of it
/// stays for connections, leases and logs,
/// so running out of files is a refused allocation, never an agent that
/// cannot accept a connection.
#[derive(Debug, Clone, Copy)]
pub(super) struct FileBudget {
    pub limit: usize,
    pub files: usize,
}

impl FileBudget {
    pub(super) fn now() -> Self {
        let limit = open_file_limit();
        Self {
            limit,
            files: limit - limit / 4,
        }
    }

    /// Most files one user's small allocations may hold: half, so one
    /// tenant never takes the last of them from the others.
    pub(super) fn share(&self) -> usize {
        self.files / 2
    }

    /// Most files all users' small allocations may hold together: three
    /// quarters, so operators (and large allocations) always have room.
    pub(super) fn users(&self) -> usize {
        self.files * 3 / 4
    }
}

/// The open-file limit in force now (soft; 1,024 if it cannot be read):
/// what the kernel holds this process to, for descriptors open and in
/// flight alike.
pub fn open_file_limit() -> usize {
    use nix::sys::resource::{getrlimit, Resource};
    getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| {
        usize::try_from(soft).unwrap_or(usize::MAX)
    })
}

/// Every file of the pool holds a descriptor: take the whole hard limit
/// on open files, not the soft default (often 1,024).
pub(super) fn raise_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(error = %e, soft, hard, "cannot raise the open-file limit");
            }
        }
    }
}

/// `vm.max_map_count`: the most mappings this process may have.
pub(super) fn max_map_count() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65_530)
}

/// The system's huge pages, from /proc/meminfo.
#[derive(Debug, Default)]
pub(super) struct HugePageInfo {
    pub size: u64,
    pub total: u64,
    pub free: u64,
}

impl HugePageInfo {
    pub(super) fn shortfall(&self, needed: u64) -> String {
        if self.size == 0 {
            return "this kernel reports no huge page size".into();
        }
        format!(
            "{} of {} huge pages free, {} needed",
            self.free,
            HumanBytes(self.size),
            needed
        )
    }
}

pub(super) fn huge_page_info() -> HugePageInfo {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    parse_meminfo(&text)
}

pub(super) fn parse_meminfo(text: &str) -> HugePageInfo {
    let mut info = HugePageInfo::default();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(key), Some(value)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(value) = value.parse::<u64>() else {
            continue;
        };
        match key {
            "HugePages_Total:" => info.total = value,
            "HugePages_Free:" => info.free = value,
            "Hugepagesize:" => info.size = value * 1024,
            _ => {}
        }
    }
    info
}

pub(super) fn pages_needed(capacity: u64, page: u64) -> u64 {
    if page == 0 {
        0
    } else {
        capacity.div_ceil(page)
    }
}

/// Fails fast, before minutes of pre-faulting, when the locked-memory limit
/// cannot cover `len` and the process may not exceed it.
pub(super) fn check_memlock(len: u64) -> Result<(), PoolError> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    let Ok((soft, _)) = getrlimit(Resource::RLIMIT_MEMLOCK) else {
        return Ok(());
    };
    if soft == RLIM_INFINITY || soft >= len || can_lock_freely() {
        return Ok(());
    }
    Err(PoolError::MemlockLimit {
        len,
        limit: memlock_limit(),
    })
}

/// Whether this process holds CAP_IPC_LOCK (locks memory past the limit).
pub(super) fn can_lock_freely() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

pub(super) fn memlock_limit() -> String {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    match getrlimit(Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) if soft == RLIM_INFINITY => "unlimited".into(),
        Ok((soft, _)) => HumanBytes(soft).to_string(),
        Err(e) => format!("unknown ({e})"),
    }
}

pub(super) fn base_page() -> u64 {
    use nix::unistd::{sysconf, SysconfVar};
    sysconf(SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(oncilla_model::PAGE)
}

/// Physical memory of this node in bytes.
pub(super) fn physical_memory() -> u64 {
    use nix::unistd::{sysconf, SysconfVar};
    let pages = sysconf(SysconfVar::_PHYS_PAGES).ok().flatten().unwrap_or(0);
    u64::try_from(pages)
        .unwrap_or(0)
        .saturating_mul(base_page())
}
