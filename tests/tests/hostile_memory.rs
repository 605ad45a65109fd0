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
        (lo <= at && at < hi && l.contains("oncilla-slab")).then(|| range.to_string())
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
    assert!(Cluster::eventually(Duration::from_secs(5), || {
        c.node("node-0").is_some_and(|n| n["state"] == "up")
    }));
    assert_eq!(c.agent_pid(0), Some(pid), "the agent is the same process");
    let mut back = [0u8; 12];
    keep.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"other tenant");
    keep.free().unwrap();
    c.still_serves();
}

/// EPERM, which a sealed memfd answers to a resize.
fn libc_eperm() -> i32 {
    nix::errno::Errno::EPERM as i32
}
