//! Attacks through same-node memory, on a real loopback cluster: what a
//! client does to the pool memory it was given must never crash the agent
//! or reach memory it was not given. Each test performs the attack, checks
//! the harmless outcome, then that the cluster still serves a normal
//! allocation, copy and free. Every wait is bounded.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use liboncilla::Kind;
use support::Cluster;

/// The file behind the mapping that holds `ptr` in this process, opened
/// read-write through /proc/self/map_files (as a client that kept the fd
/// it was sent could use it); `None` where the kernel does not allow it.
fn file_behind(ptr: *const u8) -> Option<std::fs::File> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let at = ptr as usize;
    let range = maps.lines().find_map(|l| {
        let range = l.split_whitespace().next()?;
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        (lo <= at && at < hi && l.contains("oncilla-pool")).then(|| range.to_string())
    })?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/map_files/{range}"))
        .ok()
}

/// Before, a client truncated the slab memfd it had been handed; when the
/// allocation was freed the agent's scrubber touched the vanished pages and
/// the agent died with SIGBUS, losing every allocation on the node.
#[test]
fn truncating_the_shared_memory_cannot_crash_the_agent() {
    let c = Cluster::start(2, "32MiB");
    let ocm = c.client(0);
    let keep = ocm.alloc(1 << 20, Kind::RemoteHost).unwrap();
    keep.copy_in(0, b"other tenant").unwrap();
    let mut a = ocm.alloc(1 << 20, Kind::LocalHost).unwrap();
    let ptr = {
        let buf = a.localbuf().unwrap();
        buf[..4].copy_from_slice(b"mine");
        buf.as_ptr()
    };
    let Some(file) = file_behind(ptr) else {
        println!("skipped: /proc/self/map_files is not readable here (needs CAP_SYS_ADMIN)");
        return;
    };
    let pid = c.agent_pid(0).unwrap();
    let err = file.set_len(0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc_eperm()), "{err}");
    let err = file.set_len(1 << 40).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc_eperm()), "{err}");
    drop(file);
    // Freeing makes the agent scrub the range: it must still be memory.
    a.free().unwrap();
    assert!(Cluster::eventually(Cluster::EVENT, || {
        c.node("node-0").is_some_and(|n| n["state"] == "up")
    }));
    assert_eq!(c.agent_pid(0), Some(pid), "the agent is the same process");
    let mut back = [0u8; 12];
    keep.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"other tenant");
    keep.free().unwrap();
    c.still_serves();
}

/// Everything in `file`, read as a process that kept the fd it was sent
/// could: the whole file, not just the part it was granted.
fn read_all(file: &std::fs::File) -> Vec<u8> {
    let mut bytes = vec![0u8; usize::try_from(file.metadata().unwrap().len()).unwrap()];
    std::os::unix::fs::FileExt::read_exact_at(file, &mut bytes, 0).unwrap();
    bytes
}

/// Before, the map socket handed out the whole slab's memfd: a client that
/// read all of it saw other allocations' bytes, and after a free it saw
/// the next tenant's. Now every file a client receives backs only its own
/// allocation: reading all of each (a small allocation's file of its own,
/// and a large one's share of a pool file) shows only its bytes and zeros,
/// while other allocations of the node hold bytes; and a file kept after
/// the free shows zeros while a new tenant fills the node.
#[test]
fn mapped_memory_reaches_only_its_own_allocation() {
    let c = Cluster::start(1, "48MiB");
    let ocm = c.client(0);
    let neighbours: Vec<_> = [64 << 10, 4 << 20]
        .into_iter()
        .map(|n| {
            let a = ocm.alloc(n, Kind::LocalHost).unwrap();
            a.copy_in(0, &vec![0xEE; n as usize]).unwrap();
            a
        })
        .collect();
    let mut files = Vec::new();
    let mut mine = Vec::new();
    for (n, byte) in [(48u64 << 10, 0x11u8), (6 << 20, 0x22)] {
        let mut a = ocm.alloc(n, Kind::LocalHost).unwrap();
        let ptr = {
            let buf = a.localbuf().unwrap();
            buf.fill(byte);
            buf.as_ptr()
        };
        let Some(file) = file_behind(ptr) else {
            println!("skipped: /proc/self/map_files is not readable here (needs CAP_SYS_ADMIN)");
            return;
        };
        let seen = read_all(&file);
        assert!(
            seen.iter().all(|&b| b == byte || b == 0),
            "a {n}-byte allocation's file shows another allocation's bytes"
        );
        let own = seen.iter().filter(|&&b| b == byte).count() as u64;
        assert!(own > 0 && own <= n, "{own} of its {n} bytes");
        files.push(file);
        mine.push(a);
    }
    // The neighbours still hold their bytes: they were there to be seen.
    for a in &neighbours {
        let mut back = vec![0u8; a.size() as usize];
        a.copy_out(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0xEE));
    }
    for a in mine.into_iter().chain(neighbours) {
        a.free().unwrap();
    }
    // A new tenant takes (nearly) the whole node and writes all of it.
    let tenant = c.client(0);
    let mut big = None;
    assert!(Cluster::eventually(Duration::from_secs(20), || {
        big = tenant.alloc(40 << 20, Kind::LocalHost).ok();
        big.is_some()
    }));
    let big = big.unwrap();
    big.copy_in(0, &vec![0x5A; 40 << 20]).unwrap();
    for f in &files {
        assert!(
            read_all(f).iter().all(|&b| b == 0),
            "a file kept past the free shows only zeros"
        );
    }
    big.free().unwrap();
    c.still_serves();
}

/// EPERM, which a sealed memfd answers to a resize.
fn libc_eperm() -> i32 {
    nix::errno::Errno::EPERM as i32
}
