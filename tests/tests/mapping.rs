//! Remote allocations mapped into a process (`Allocation::map`): demand
//! paging through userfaultfd against a real cluster of separate processes,
//! with the allocation on another node than the mapping's session. Every
//! test checks bytes, not that code ran: what threads read and write
//! through the pointer, what another session sees after `flush` and what
//! the mapping sees after `invalidate`, every byte of a walk through an
//! allocation 16 times its budget, a dead node's block raising SIGBUS in a
//! child process while the rest stays readable, and children confined as a
//! container's seccomp profile confines them: without userfaultfd, a clear
//! refusal naming what to change; with only its user-mode-only form, a
//! mapping that works through the pointer, and a `read(2)` into a page not
//! fetched yet failing with EFAULT as documented.

#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Error, Kind, MapOptions, Oncilla, Options, Policy};
use support::Cluster;

const ROLE_ENV: &str = "ONCILLA_TEST_ROLE";

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed).to_le_bytes()[2])
        .collect()
}

/// `len` bytes at `offset` of the mapping, read through the pointer.
fn read_mapped(m: &liboncilla::Mapped<'_>, offset: usize, len: usize) -> Vec<u8> {
    assert!(offset + len <= m.len());
    let mut out = vec![0u8; len];
    // SAFETY: inside the mapping, which lives for the call.
    unsafe { std::ptr::copy_nonoverlapping(m.as_ptr().add(offset), out.as_mut_ptr(), len) };
    out
}

fn write_mapped(m: &liboncilla::Mapped<'_>, offset: usize, data: &[u8]) {
    assert!(offset + data.len() <= m.len());
    // SAFETY: inside the mapping, which lives for the call.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), m.as_ptr().add(offset), data.len()) };
}

/// The bytes of local memory the mapping at `base` holds (its `Rss` in
/// /proc/self/smaps).
fn resident(base: *mut u8) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let start = format!("{:x}-", base as usize);
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
    assert!(lines.next().is_some(), "the mapping is in /proc/self/smaps");
    let rss = lines
        .find(|l| l.starts_with("Rss:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .unwrap();
    rss * 1024
}

/// A mapping that gives up on a block after 2 s and reads no further
/// ahead than the block touched.
fn short_timeout() -> MapOptions {
    MapOptions::default()
        .timeout(Duration::from_secs(2))
        .read_ahead(64 << 10)
}

#[test]
fn threads_read_and_write_through_the_pointer_and_flush_and_invalidate_order_it() {
    let c = Cluster::start(2, "64MiB");
    let ocm = c.client(0);
    let other = c.client(1);
    let size = (8 << 20) + 12_345;
    let spec = AllocSpec::new(size as u64, Kind::RemoteHost)
        .on_nodes(["node-1"])
        .named("mapped-table");
    let a = ocm.alloc_with(&spec).unwrap();
    let first = pattern(size, 1);
    a.copy_in(0, &first).unwrap();
    let m = a.map(MapOptions::default()).unwrap();
    assert!(m.is_paged() && m.len() == size);
    assert_eq!(
        m.stats().resident,
        0,
        "nothing is read before it is touched"
    );

    // Four threads read their quarter, then write a new pattern over it.
    let second = pattern(size, 2);
    let quarter = size.div_ceil(4);
    std::thread::scope(|s| {
        for t in 0..4 {
            let (m, first, second) = (&m, &first, &second);
            s.spawn(move || {
                let start = t * quarter;
                let end = (start + quarter).min(size);
                assert!(
                    read_mapped(m, start, end - start) == first[start..end],
                    "quarter {t}"
                );
                write_mapped(m, start, &second[start..end]);
            });
        }
    });
    assert!(read_mapped(&m, 0, size) == second);

    // Another session sees the writes only once they are flushed.
    let theirs = other.attach("mapped-table").unwrap();
    let mut seen = vec![0u8; size];
    theirs.copy_out(0, &mut seen).unwrap();
    assert!(
        seen == first,
        "writes through the pointer are not visible before flush"
    );
    m.flush(0, size as u64).unwrap();
    theirs.copy_out(0, &mut seen).unwrap();
    assert!(seen == second, "flush made every write visible");

    // Another writer's bytes show only after invalidate (clean blocks).
    let third = pattern(1 << 20, 3);
    theirs.copy_in(0, &third).unwrap();
    assert!(
        read_mapped(&m, 0, 1 << 20) == second[..1 << 20],
        "cached until invalidated"
    );
    m.invalidate(0, 1 << 20).unwrap();
    assert!(
        read_mapped(&m, 0, 1 << 20) == third,
        "the next touch refetches"
    );
    assert!(read_mapped(&m, 1 << 20, size - (1 << 20)) == second[1 << 20..]);

    let stats = m.stats();
    assert!(
        stats.faults > 0 && stats.fetched >= size as u64,
        "{stats:?}"
    );
    assert!(stats.written_back >= size as u64, "{stats:?}");
    assert_eq!(m.last_error(), None);
    m.unmap().unwrap();
    drop(theirs);
    a.free().unwrap();
}

#[test]
fn a_walk_through_sixteen_times_the_budget_keeps_every_byte_and_the_footprint() {
    let c = Cluster::start(2, "320MiB");
    let ocm = c.client(0);
    let size: usize = 256 << 20;
    let budget: u64 = 16 << 20;
    let a = ocm
        .alloc_with(&AllocSpec::new(size as u64, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    let options = MapOptions::default().budget(budget);
    let m = a.map(options).unwrap();
    let want = pattern(size, 7);
    // The kernel's count (smaps) walks the page tables while blocks come
    // and go, so a sample taken mid-walk can see a block leave and another
    // arrive: it is checked where nothing moves (after each pass, once
    // read-ahead settled), and bounded mid-pass by what can be in motion
    // (the read-ahead window and one block per thread). The pager's own
    // count is exact at every sample.
    let in_motion = options.read_ahead + options.block * options.threads as u64;
    let mut peak = 0;
    let mut sample = |m: &liboncilla::Mapped<'_>| {
        let held = m.stats().resident;
        assert!(
            held <= budget,
            "the pager holds {held} bytes, past its budget {budget}"
        );
        peak = peak.max(resident(m.as_ptr()));
    };
    let settled = |m: &liboncilla::Mapped<'_>, pass: &str| {
        assert!(
            Cluster::eventually(Cluster::EVENT, || resident(m.as_ptr()) <= budget),
            "after the {pass} pass the mapping holds {} bytes, past its budget {budget}",
            resident(m.as_ptr())
        );
    };
    // Write every byte through the pointer, 1 MiB at a time...
    for (i, chunk) in want.chunks(1 << 20).enumerate() {
        write_mapped(&m, i << 20, chunk);
        if i % 16 == 15 {
            sample(&m);
        }
    }
    settled(&m, "write");
    // ...then read every byte back: all evicted blocks come back.
    for (i, chunk) in want.chunks(1 << 20).enumerate() {
        assert!(read_mapped(&m, i << 20, chunk.len()) == chunk, "MiB {i}");
        if i % 16 == 15 {
            sample(&m);
        }
    }
    settled(&m, "read");
    assert!(
        peak <= budget + in_motion,
        "the kernel counted {peak} bytes mid-pass, past the budget {budget} + {in_motion} in motion"
    );
    let stats = m.stats();
    assert!(
        stats.evicted as usize >= (size - budget as usize) / (64 << 10),
        "{stats:?}"
    );
    m.unmap().unwrap();
    // What unmap wrote back is the allocation's.
    let mut back = vec![0u8; size];
    a.copy_out(0, &mut back).unwrap();
    assert!(
        back == want,
        "every byte written through the pointer reached the allocation"
    );
}

/// The child's side of the dead-node test: maps the named allocation,
/// reads node-1's block, then touches node-2's (which must kill it).
/// How much of userfaultfd a confined child keeps.
#[derive(Clone, Copy, PartialEq)]
enum Confine {
    /// None of it: the system call and /dev/userfaultfd's ioctl fail.
    NoUserfaultfd,
    /// Only the system call with `UFFD_USER_MODE_ONLY`.
    UserModeOnly,
}

/// Confines this thread, and the threads it starts from now on, with a
/// seccomp filter that refuses (EPERM) what `how` takes away, as a
/// container runtime's default profile does.
fn confine(how: Confine) {
    use libc::{
        sock_filter, sock_fprog, BPF_ABS, BPF_ALU, BPF_AND, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD,
        BPF_RET, BPF_W, SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO,
    };
    const USERFAULTFD_IOC_NEW: u32 = 0xAA00;
    const UFFD_USER_MODE_ONLY: u32 = 1;
    let stmt = |code: u32, k: u32| sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let deny = SECCOMP_RET_ERRNO | libc::EPERM as u32;
    // seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (low word first).
    let mut prog = vec![
        stmt(BPF_LD | BPF_W | BPF_ABS, 4),
        jump(BPF_JMP | BPF_JEQ | BPF_K, 0xC000_003E, 1, 0), // AUDIT_ARCH_X86_64
        stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        stmt(BPF_LD | BPF_W | BPF_ABS, 0),
        jump(BPF_JMP | BPF_JEQ | BPF_K, libc::SYS_ioctl as u32, 0, 3),
        stmt(BPF_LD | BPF_W | BPF_ABS, 24),
        jump(BPF_JMP | BPF_JEQ | BPF_K, USERFAULTFD_IOC_NEW, 0, 1),
        stmt(BPF_RET | BPF_K, deny),
        jump(
            BPF_JMP | BPF_JEQ | BPF_K,
            libc::SYS_userfaultfd as u32,
            1,
            0,
        ),
        stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    ];
    if how == Confine::UserModeOnly {
        prog.extend([
            stmt(BPF_LD | BPF_W | BPF_ABS, 16),
            stmt(BPF_ALU | BPF_AND | BPF_K, UFFD_USER_MODE_ONLY),
            jump(BPF_JMP | BPF_JEQ | BPF_K, UFFD_USER_MODE_ONLY, 0, 1),
            stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        ]);
    }
    prog.push(stmt(BPF_RET | BPF_K, deny));
    let fprog = sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integers; PR_SET_SECCOMP reads the
    // program `fprog` points at (alive for the call), which only ever
    // allows or refuses system calls.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &fprog),
            0,
            "{}",
            std::io::Error::last_os_error()
        );
    }
}

#[test]
fn role() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return; // only meaningful as a child of the tests below
    };
    match role.as_str() {
        "touch-dead" => touch_dead(),
        "no-userfaultfd" => {
            confine(Confine::NoUserfaultfd);
            let ocm = Oncilla::connect_with(Options::from_env().unwrap()).unwrap();
            let a = ocm.attach("confined").unwrap();
            let outcome = a.map(MapOptions::default()).map(drop);
            match outcome {
                Err(e) => println!("refused: {e}"),
                Ok(()) => println!("mapped without userfaultfd"),
            }
        }
        "user-mode-only" => {
            confine(Confine::UserModeOnly);
            let ocm = Oncilla::connect_with(Options::from_env().unwrap()).unwrap();
            let a = ocm.attach("confined").unwrap();
            let m = a.map(MapOptions::default().read_ahead(64 << 10)).unwrap();
            let want = pattern(m.len(), 5);
            assert!(read_mapped(&m, 0, 4096) == want[..4096]);
            println!("read through the pointer");
            // A system call writing into a page not fetched yet: the kernel
            // may not wait for this process's own pager.
            let (r, w) = nix::unistd::pipe().unwrap();
            nix::unistd::write(&w, &[7u8; 4096]).unwrap();
            let far = m.len() - 4096;
            // SAFETY: the last page of the mapping, alive for the call and
            // touched by nothing else.
            let page = unsafe { std::slice::from_raw_parts_mut(m.as_ptr().add(far), 4096) };
            match nix::unistd::read(&r, page) {
                Err(nix::errno::Errno::EFAULT) => {
                    println!("read(2) into an unfetched page: EFAULT")
                }
                other => println!("read(2) into an unfetched page: {other:?}"),
            }
            m.unmap().unwrap();
            println!("unmapped");
        }
        other => panic!("unknown role {other}"),
    }
}

/// The child of the SIGBUS test: reads a live node's byte, then a dead
/// node's (which must raise SIGBUS).
fn touch_dead() {
    let ocm = Oncilla::connect_with(Options::from_env().unwrap()).unwrap();
    let a = ocm.attach("striped").unwrap();
    let m = a.map(short_timeout()).unwrap();
    let dead = std::env::var("DEAD_AT").unwrap().parse::<usize>().unwrap();
    let live = std::env::var("LIVE_AT").unwrap().parse::<usize>().unwrap();
    let byte = read_mapped(&m, live, 1)[0];
    println!("live byte {byte} read");
    let started = Instant::now();
    let byte = read_mapped(&m, dead, 1)[0];
    // Reaching here is the failure: a dead node's bytes read as something.
    println!("dead byte {byte} read after {:?}", started.elapsed());
}

/// Runs this test binary's `role` as `role` in a child process against `c`.
fn child(c: &Cluster, role: &str, env: &[(&str, String)]) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "role", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .env("ONCILLA_SOCKET", c.socket(0))
        .env("ONCILLA_TOKEN_FILE", c.token_file())
        .env_remove("ONCILLA_TOKEN")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap()
}

#[test]
fn confined_processes_are_refused_clearly_or_page_within_user_mode_limits() {
    let c = Cluster::start(2, "32MiB");
    let ocm = c.client(0);
    let size = 1 << 20;
    let spec = AllocSpec::new(size as u64, Kind::RemoteHost)
        .on_nodes(["node-1"])
        .named("confined");
    let a = ocm.alloc_with(&spec).unwrap();
    a.copy_in(0, &pattern(size, 5)).unwrap();

    let out = child(&c, "no-userfaultfd", &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("refused: cannot map remote memory")
            || stdout.contains("refused: mapping remote memory needs userfaultfd"),
        "{stdout}"
    );
    for what in [
        "/dev/userfaultfd",
        "vm.unprivileged_userfaultfd",
        "CAP_SYS_PTRACE",
    ] {
        assert!(stdout.contains(what), "the refusal names {what}:\n{stdout}");
    }

    let out = child(&c, "user-mode-only", &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "read through the pointer",
        "read(2) into an unfetched page: EFAULT",
        "unmapped",
    ] {
        assert!(stdout.contains(line), "{line}:\n{stdout}");
    }
    // Nothing a confined child did changed the allocation.
    let mut back = vec![0u8; size];
    a.copy_out(0, &mut back).unwrap();
    assert!(back == pattern(size, 5));
}

#[test]
fn a_dead_nodes_block_raises_sigbus_and_the_rest_stays_readable() {
    let mut c = Cluster::start(3, "32MiB");
    let ocm = c.client(0);
    let stripe: usize = 1 << 20;
    let size = 4 * stripe;
    let spec = AllocSpec::new(size as u64, Kind::RemoteHost)
        .on_nodes(["node-1", "node-2"])
        .policy(Policy::Spread)
        .stripe(stripe as u64)
        .named("striped");
    let a = ocm.alloc_with(&spec).unwrap();
    let want = pattern(size, 9);
    a.copy_in(0, &want).unwrap();
    let on = |node: &str| {
        let e = a
            .descriptor()
            .extents
            .iter()
            .find(|e| e.node == node)
            .unwrap();
        e.alloc_offset as usize
    };
    let (live, dead) = (on("node-1"), on("node-2"));

    // Written through the pointer while node-2 lives, then lost with it.
    let m = a.map(short_timeout()).unwrap();
    write_mapped(&m, dead, b"lost");
    c.kill_agent(2);

    let started = Instant::now();
    let out = child(
        &c,
        "touch-dead",
        &[("DEAD_AT", dead.to_string()), ("LIVE_AT", live.to_string())],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(nix::sys::signal::Signal::SIGBUS as i32),
        "the touch of a dead node's block raises SIGBUS ({:?}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("live byte"),
        "node-1's block read first:\n{stdout}"
    );
    assert!(!stdout.contains("dead byte"), "{stdout}");
    assert!(
        started.elapsed() < Cluster::EVENT,
        "bounded by the mapping's timeout, not a hang"
    );

    // Here: node-1's bytes still read; unmap reports the write it lost.
    assert!(read_mapped(&m, live, stripe) == want[live..live + stripe]);
    let lost = m.unmap().unwrap_err();
    assert!(
        matches!(&lost, Error::Map(msg) if msg.contains("could not be written back")),
        "{lost}"
    );

    // Free works after all that, and nothing leaks: the master lists no
    // allocation, and node-1's agent reports its whole pool free again.
    a.free().unwrap();
    assert!(
        Cluster::eventually(Cluster::EVENT, || {
            let node = c.node("node-1").unwrap();
            c.allocation_count() == 0 && node["free"] == node["capacity"]
        }),
        "accounts after free: {} allocations, node-1 {:?}",
        c.allocation_count(),
        c.node("node-1")
    );
}

#[test]
fn mapping_refuses_bad_options_and_freed_memory_clearly() {
    let c = Cluster::start(2, "32MiB");
    let ocm = c.client(0);
    let other = c.client(1);
    let spec = AllocSpec::new(1 << 20, Kind::RemoteHost)
        .on_nodes(["node-1"])
        .named("short-lived");
    let a = ocm.alloc_with(&spec).unwrap();
    for (options, what) in [
        (MapOptions::default().block(1000), "page size"),
        (MapOptions::default().block(256 << 20), "page size"),
        (MapOptions::default().budget(4096), "smaller than one block"),
        (MapOptions::default().threads(0), "threads"),
    ] {
        let e = a.map(options).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(msg) if msg.contains(what)),
            "{e}"
        );
    }
    // Freed by another session: refused by name at map, not at a touch.
    other.attach("short-lived").unwrap().force_free().unwrap();
    let e = a.map(MapOptions::default()).unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e}");

    // An allocation in this node's memory is its own mapping: no paging,
    // and writes are the allocation's at once.
    let local = ocm.alloc(1 << 20, Kind::LocalHost).unwrap();
    let m = local.map(MapOptions::default()).unwrap();
    assert!(!m.is_paged());
    write_mapped(&m, 100, b"direct");
    let mut out = [0u8; 6];
    local.copy_out(100, &mut out).unwrap();
    assert_eq!(&out, b"direct");
    m.unmap().unwrap();
}
