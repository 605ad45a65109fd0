//! What a reservation does to the backing: gives each reserved range memory
//! files that back nothing outside it, so a same-node process that maps
//! what it was granted (all of each file, even) sees only that allocation.
//!
//! Small ranges (up to [`OWN_FILE_MAX`]) get a file of their own, made and
//! populated here (bounded work: about 0.1 ms per piece on 4 KiB pages);
//! the pages they replace are released and come back when the range is
//! freed. Larger ranges keep the files that
//! back them, which become theirs; whatever else those files backed (free
//! memory only) is cut off and backed anew by the refiller, off the
//! request path (a file may be handed to a process as soon as the range
//! is reserved). Either way a reservation costs the same at every size.
//! This module never decides which range is reserved (the free list does).

use std::sync::Arc;

use super::file::{open_files, MemFile, Part};
use super::refill::Refill;
use super::{FileBudget, Inner, PoolError, State};

/// Ranges up to this size (at least one page) get a file of their own.
pub const OWN_FILE_MAX: u64 = 128 << 10;

/// A reserved range's backing.
pub(super) struct Carved {
    /// The files behind the range, in offset order: what a process that
    /// maps it receives.
    pub parts: Vec<Part>,
    /// What backed the range before it got a file of its own, to put back
    /// when it is freed (if those files are still free memory's).
    pub restore: Vec<(u64, Part)>,
    /// The user charged for the file made for it.
    pub file_of: Option<u32>,
}

/// Backs `[offset, offset + len)`, just taken from the free list and
/// counted as used, with files of its own.
///
/// # Errors
/// A small range's file could not be made; the range is then given back
/// (or queued to be backed again) and no longer counted as used.
pub(super) fn carve(
    inner: &Inner,
    st: &mut State,
    offset: u64,
    len: u64,
    user: Option<u32>,
) -> Result<Carved, PoolError> {
    if len <= OWN_FILE_MAX.max(inner.page) {
        own_file(inner, st, offset, len, user)
    } else {
        take_files(inner, st, offset, len)
    }
}

fn own_file(
    inner: &Inner,
    st: &mut State,
    offset: u64,
    len: u64,
    user: Option<u32>,
) -> Result<Carved, PoolError> {
    // A run split in two around the range, and the range's own file.
    let budget = FileBudget::now();
    let held = user.map_or(0, |uid| st.user_files.get(&uid).copied().unwrap_or(0));
    let refused = no_room(inner, st, &budget, 1).or_else(|| {
        let open = open_files();
        if user.is_some() && st.user_files.values().sum::<usize>() >= budget.users() {
            return Some(PoolError::Descriptors {
                open,
                budget: budget.users(),
                limit: budget.limit,
            });
        }
        user.filter(|_| held >= budget.share())
            .map(|uid| PoolError::DescriptorShare {
                uid,
                held,
                share: budget.share(),
            })
    });
    if let Some(e) = refused {
        give_back(st, offset, len);
        return Err(e);
    }
    let file = match MemFile::create(len, inner.huge) {
        Ok(f) => f,
        Err(e) => {
            give_back(st, offset, len);
            return Err(PoolError::from_file(e, len));
        }
    };
    let restore = st.backing.take(offset, len);
    // Released first: with huge pages, the new file needs these very pages.
    for (_, p) in &restore {
        p.file.punch(p.file_off, p.len);
    }
    let mapped = match inner.addr(offset) {
        // SAFETY: the range is inside a slab, was just taken from the free
        // list (nothing reads or writes it) and is page-aligned.
        Some(addr) => unsafe { file.map_at(addr, 0, len) },
        None => Err(super::file::FileError::Map(nix::Error::EFAULT)),
    };
    if let Err(e) = mapped {
        st.used -= len;
        st.scrubbing += len;
        st.dirty.push_back(Refill::Freed {
            offset,
            len,
            parts: Vec::new(),
            restore,
        });
        inner.freed.notify_one();
        return Err(PoolError::from_file(e, len));
    }
    file.own();
    st.held_runs += 1;
    if let Some(uid) = user {
        *st.user_files.entry(uid).or_default() += 1;
    }
    Ok(Carved {
        parts: vec![Part::whole(file)],
        restore,
        file_of: user,
    })
}

fn take_files(inner: &Inner, st: &mut State, offset: u64, len: u64) -> Result<Carved, PoolError> {
    // What the range cuts off its files is backed anew by the refiller:
    // at most two new files (one at each end), and as many new runs.
    if let Some(e) = no_room(inner, st, &FileBudget::now(), 2) {
        give_back(st, offset, len);
        return Err(e);
    }
    let taken = st.backing.take(offset, len);
    // Each file with the pool offset of its first byte.
    let mut files: Vec<(Arc<MemFile>, u64)> = Vec::new();
    let mut seen = std::collections::HashSet::with_capacity(taken.len());
    for (o, p) in &taken {
        if seen.insert(Arc::as_ptr(&p.file)) {
            files.push((Arc::clone(&p.file), o.saturating_sub(p.file_off)));
        }
    }
    // The rest of what those files back must be free memory, all of it
    // still in the free list; and the runs must tile the range.
    let others: Vec<(u64, u64)> = files
        .iter()
        // A file wholly inside the range has no other runs.
        .filter(|(f, base)| *base < offset || base + f.len() > offset + len)
        .flat_map(|(f, base)| st.backing.of_file(f, *base))
        .collect();
    let mut next = offset;
    let tiles = taken.iter().all(|(o, p)| {
        let ok = *o == next;
        next = o + p.len;
        ok
    }) && next == offset + len;
    let why = if !tiles {
        Some("a reserved range is not wholly backed")
    } else if files.iter().any(|(f, _)| f.owned() || f.shared()) {
        Some("a free range is backed by an allocation's file")
    } else if !others.iter().all(|&(o, l)| st.free.holds(o, l)) {
        Some("a file backs memory that is neither free nor this range's")
    } else {
        None
    };
    if let Some(why) = why {
        tracing::error!(
            offset,
            len,
            why,
            "pool bookkeeping inconsistent; reservation refused"
        );
        for (o, p) in taken {
            st.backing.insert(o, p);
        }
        give_back(st, offset, len);
        return Err(PoolError::Inconsistent(why));
    }
    for (file, _) in &files {
        file.own();
    }
    // Cut off the rest of what the files back, so they back only this
    // range from now on.
    for (o, l) in others {
        for (at, old) in st.backing.take(o, l) {
            st.free.take_range(at, old.len);
            st.scrubbing += old.len;
            st.dirty.push_back(Refill::Detached { offset: at, old });
        }
    }
    inner.freed.notify_one();
    st.held_runs += taken.len();
    Ok(Carved {
        parts: taken.into_iter().map(|(_, p)| p).collect(),
        restore: Vec::new(),
        file_of: None,
    })
}

/// Why the pool cannot take `new_files` more files (and two more runs)
/// now: too many mappings, or past the file budget; `None` if it can.
fn no_room(inner: &Inner, st: &State, budget: &FileBudget, new_files: usize) -> Option<PoolError> {
    let runs = st.backing.runs() + st.held_runs + 2;
    let open = open_files();
    if runs > inner.max_runs {
        Some(PoolError::Fragmented {
            runs,
            limit: inner.max_runs,
        })
    } else if open + new_files > budget.files {
        Some(PoolError::Descriptors {
            open,
            budget: budget.files,
            limit: budget.limit,
        })
    } else {
        None
    }
}

/// Undoes the caller's take of a range nothing was done to yet.
fn give_back(st: &mut State, offset: u64, len: u64) {
    st.free.give(offset, len);
    st.used -= len;
}
