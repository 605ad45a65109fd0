//! The refiller: backs freed ranges (and free ranges cut off a file that an
//! allocation took) with memory nobody else holds, off the request path,
//! and only then returns them to the free list.
//!
//! One thread per pool. A freed range whose files were never handed to a
//! process is zeroed in place and its files back free memory again (the
//! fast path: a memset; runs an extent borrowed go back to their files).
//! Otherwise its files are punched first (a process still mapping them
//! sees zeros, never a later tenant's bytes), then the range is backed
//! again: where it had other files before it got its own, by those, when
//! they still back only free memory; the rest by fresh files of the pool's
//! file size each, which come back to the free list one by one as they are
//! ready (fresh files come from the kernel zeroed). It never backs a range
//! an extent holds.

use std::time::Duration;

use super::file::{MemFile, Part};
use super::Inner;

/// The refiller's nice value: about a tenth of a CPU's share beside a
/// request thread at nice 0.
const NICE: i32 = 10;
/// Pause before trying again after the kernel refused memory.
const RETRY: Duration = Duration::from_secs(1);

/// A range waiting to be backed again.
pub(super) enum Refill {
    /// A freed allocation's range: its `parts` are released; `restore` is
    /// what backed it before (small ranges).
    Freed {
        offset: u64,
        len: u64,
        parts: Vec<Part>,
        restore: Vec<(u64, Part)>,
    },
    /// Free memory cut off `old.file` when an allocation took that file.
    Detached { offset: u64, old: Part },
}

/// Runs until the pool shuts down, at a low CPU priority: refilling is
/// background work and must not slow the requests beside it.
pub(super) fn run(inner: &Inner) {
    lower_priority();
    loop {
        let item = {
            let mut st = inner.lock();
            loop {
                if st.shutdown {
                    return;
                }
                if let Some(item) = st.dirty.pop_front() {
                    break item;
                }
                st = inner.freed.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        match item {
            Refill::Freed {
                offset,
                len,
                parts,
                restore,
            } => {
                if restore.is_empty() && !parts.is_empty() && parts.iter().all(|p| !p.file.shared())
                {
                    zero_in_place(inner, offset, parts);
                    continue;
                }
                for p in &parts {
                    p.file.punch(p.file_off, p.len);
                }
                drop(parts);
                for (at, n) in put_back(inner, offset, len, &restore) {
                    fresh(inner, at, n);
                }
            }
            Refill::Detached { offset, old } => {
                old.file.punch(old.file_off, old.len);
                fresh(inner, offset, old.len);
            }
        }
    }
}

/// Zeroes a freed range whose files never left the agent and gives it
/// back to the free list, its files free memory's again: all of it at
/// once, under one lock, so no reservation can take one of its files while
/// another of its runs is still on its way back.
fn zero_in_place(inner: &Inner, offset: u64, parts: Vec<Part>) {
    let len: u64 = parts.iter().map(|p| p.len).sum();
    let ptr = inner.ptr(offset);
    if ptr.is_null() || inner.ptr(offset + len - 1).is_null() {
        tracing::error!(offset, len, "retired extent outside the pool; not reused");
        return;
    }
    // SAFETY: the range was retired by the extent that held it (its last
    // user dropped it) and is not in the free list yet, so nothing else
    // reads or writes it; it lies inside one slab, mapped by its parts.
    unsafe { std::ptr::write_bytes(ptr, 0, usize::try_from(len).unwrap_or(0)) };
    let mut st = inner.lock();
    let mut at = offset;
    for part in parts {
        // A run the extent borrowed is of a file that is not its own
        // (lending files are never owned): it returns to its file.
        if part.file.owned() {
            part.file.disown();
        } else {
            part.file.returned();
        }
        let n = part.len;
        st.backing.insert(at, part);
        at += n;
    }
    st.free.give(offset, len);
    st.scrubbing -= len;
    drop(st);
    inner.cleaned.notify_all();
}

/// Backs what it can of a freed range with the runs that backed it before
/// it got files of its own (`restore`), if their files still back only
/// free memory, and returns them to the free list; returns the rest of the
/// range, to be backed anew (all of it when nothing can be put back).
fn put_back(inner: &Inner, offset: u64, len: u64, restore: &[(u64, Part)]) -> Vec<(u64, u64)> {
    let whole = vec![(offset, len)];
    if restore.is_empty() {
        return whole;
    }
    let mut st = inner.lock();
    // Under the lock: no reservation can take one of these files meanwhile.
    if restore.iter().any(|(_, p)| p.file.owned()) {
        return whole;
    }
    for (at, p) in restore {
        // SAFETY: the range was retired by the extent that held it and is
        // not in the free list: nothing reads or writes it.
        if let Err(e) = unsafe { inner.map_file(&p.file, *at, p.file_off, p.len) } {
            tracing::debug!(error = ?e, "cannot put back a range's former backing");
            return whole;
        }
    }
    let mut rest = Vec::new();
    let mut next = offset;
    for (at, p) in restore {
        st.backing.insert(*at, p.clone());
        st.free.give(*at, p.len);
        st.scrubbing -= p.len;
        if *at > next {
            rest.push((next, at - next));
        }
        next = at + p.len;
    }
    if next < offset + len {
        rest.push((next, offset + len - next));
    }
    drop(st);
    inner.cleaned.notify_all();
    rest
}

/// Backs `[offset, offset + len)` with fresh files, each returned to the
/// free list as soon as it is ready; what the kernel refuses is queued
/// again after a pause.
fn fresh(inner: &Inner, offset: u64, len: u64) {
    let step = inner.file_len;
    let mut at = offset;
    while at < offset + len {
        let n = step.min(offset + len - at);
        let made = match inner.addr(at) {
            // SAFETY: as in `put_back`: a retired range nobody touches.
            Some(addr) => unsafe { MemFile::create_at(n, inner.huge, addr) },
            None => Err(super::file::FileError::Map(nix::Error::EFAULT)),
        };
        let mut st = inner.lock();
        match made {
            Ok(part) => {
                st.backing.insert(at, part);
                st.free.give(at, n);
                st.scrubbing -= n;
                drop(st);
                inner.cleaned.notify_all();
            }
            Err(e) => {
                tracing::error!(error = ?e, offset = at, len = n, "cannot back freed pool memory; trying again");
                st.dirty.push_back(Refill::Freed {
                    offset: at,
                    len: n,
                    parts: Vec::new(),
                    restore: Vec::new(),
                });
                drop(st);
                std::thread::sleep(RETRY);
            }
        }
        at += n;
    }
}

/// Lowers this thread's priority to nice [`NICE`]: it yields to request
/// threads when they want the CPU, yet keeps a share under sustained load
/// (an idle-class thread could starve, and freed memory with it).
fn lower_priority() {
    // SAFETY: gettid has no preconditions; setpriority on a thread id
    // changes only that thread's nice value.
    let set = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, u32::try_from(tid).unwrap_or(0), NICE)
    };
    if set != 0 {
        tracing::debug!("cannot lower the refiller's priority; it runs at normal priority");
    }
}
