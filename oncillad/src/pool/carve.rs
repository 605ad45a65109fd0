//! What a reservation does to the backing: gives each reserved range memory
//! files that back nothing outside it, so a same-node process that maps
//! what it was granted (all of each file, even) sees only that allocation.
//!
//! Small ranges (up to [`OWN_FILE_MAX`]) that a process may map
//! ([`Access::Mapped`]) get a file of their own, made and populated here
//! (bounded work: about 0.1 ms per piece on 4 KiB pages); the pages they
//! replace are released and come back when the range is freed. Small
//! ranges nobody may map ([`Access::Copied`]: a session's memory on
//! another node than the session's) borrow the runs of free memory's
//! files that back them ([`MemFile::lend`]): no file, no descriptor, and
//! no file is ever handed out for them. Larger ranges keep the files that
//! back them, which become theirs; whatever else those files backed (free
//! memory only) is cut off and backed anew by the refiller, off the
//! request path (a file may be handed to a process as soon as the range
//! is reserved). A file at either end that also backs a borrowed range
//! stays free memory's: the span of the range its runs back gets a new
//! file here instead (one per such file, so in practice at most two, each
//! at most the pool's file size: populating one is the only work in a
//! reservation that grows with the pool, about a millisecond per 4 MiB),
//! and its runs go back to it when the range is freed. Otherwise a
//! reservation costs the same at every size. This module never
//! decides which range is reserved (the free list does).

use std::sync::Arc;

use super::file::{open_files, MemFile, Part};
use super::refill::Refill;
use super::{FileBudget, Inner, PoolError, State};

/// Ranges up to this size (at least one page) get a file of their own,
/// or borrow runs of free memory's files when nobody may map them.
pub const OWN_FILE_MAX: u64 = 128 << 10;

/// Who may reach a reserved range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A same-node process may map it: it gets memory files that back
    /// nothing else.
    Mapped,
    /// Only copies reach it (the agent's data path, RDMA): a small range
    /// then holds no memory file of its own, and none is ever handed out.
    Copied,
}

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
/// counted as used, as `access` needs: with files of its own, or (small
/// and never mapped) with the runs that back it now.
///
/// # Errors
/// A file could not be made, or the budget of files or mappings is spent;
/// the range is then given back (or queued to be backed again) and no
/// longer counted as used.
pub(super) fn carve(
    inner: &Inner,
    st: &mut State,
    offset: u64,
    len: u64,
    user: Option<u32>,
    access: Access,
) -> Result<Carved, PoolError> {
    if len > OWN_FILE_MAX.max(inner.page) {
        take_files(inner, st, offset, len)
    } else if access == Access::Copied {
        borrow(inner, st, offset, len)
    } else {
        own_file(inner, st, offset, len, user)
    }
}

fn borrow(inner: &Inner, st: &mut State, offset: u64, len: u64) -> Result<Carved, PoolError> {
    // No file: only the runs the range is cut out of.
    if let Some(e) = no_room(inner, st, &FileBudget::now(), 0) {
        give_back(st, offset, len);
        return Err(e);
    }
    let taken = st.backing.take(offset, len);
    if let Some(why) = untiled(&taken, offset, len).or_else(|| {
        taken
            .iter()
            .any(|(_, p)| p.file.owned() || p.file.shared())
            .then_some("a free range is backed by an allocation's file")
    }) {
        return Err(refuse(st, taken, offset, len, why));
    }
    for (_, p) in &taken {
        p.file.lend();
    }
    st.held_runs += taken.len();
    Ok(Carved {
        parts: taken.into_iter().map(|(_, p)| p).collect(),
        restore: Vec::new(),
        file_of: None,
    })
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
    // SAFETY: the range is inside a slab, was just taken from the free
    // list (nothing reads or writes it) and is page-aligned.
    if let Err(e) = unsafe { inner.map_file(&file, offset, 0, len) } {
        inner.requeue(st, offset, len, Vec::new(), restore);
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
    // What the range cuts off its files is backed anew by the refiller: at
    // most two new files (one at each end), and as many new runs.
    if let Some(e) = no_room(inner, st, &FileBudget::now(), 2) {
        give_back(st, offset, len);
        return Err(e);
    }
    let taken = st.backing.take(offset, len);
    let why = untiled(&taken, offset, len).or_else(|| {
        taken
            .iter()
            .any(|(_, p)| p.file.owned() || p.file.shared())
            .then_some("a free range is backed by an allocation's file")
    });
    if let Some(why) = why {
        return Err(refuse(st, taken, offset, len, why));
    }
    // Where files that lend runs back the range, a new file replaces
    // every run, and the runs go back when the extent is freed.
    let spans = lending_spans(&taken);
    let (restore, kept): (Vec<_>, Vec<_>) = taken
        .into_iter()
        .partition(|(o, _)| spans.iter().any(|&(s, n)| (s..s + n).contains(o)));
    // The files of the other runs become the extent's, each with the pool
    // offset of its first byte (a file backs one contiguous pool range,
    // file offset for pool offset).
    let mut files: Vec<(Arc<MemFile>, u64)> = Vec::new();
    let mut seen = std::collections::HashSet::with_capacity(kept.len());
    for (o, p) in &kept {
        if seen.insert(Arc::as_ptr(&p.file)) {
            files.push((Arc::clone(&p.file), o.saturating_sub(p.file_off)));
        }
    }
    // The rest of what those files back must be free memory, all of it
    // still in the free list.
    let others: Vec<(u64, u64)> = files
        .iter()
        .flat_map(|(f, base)| st.backing.of_file(f, *base))
        .collect();
    let why = if files.iter().any(|(f, _)| f.lent()) {
        Some("a file that lends runs backs a reserved range outside its runs' span")
    } else if !others.iter().all(|&(o, l)| st.free.holds(o, l)) {
        Some("a file backs memory that is neither free nor this range's")
    } else {
        None
    };
    let runs_back = |st: &mut State, restore: Vec<(u64, Part)>, kept: Vec<(u64, Part)>| {
        for (o, p) in restore.into_iter().chain(kept) {
            st.backing.insert(o, p);
        }
    };
    if let Some(why) = why {
        let mut all = restore;
        all.extend(kept);
        all.sort_by_key(|(o, _)| *o);
        return Err(refuse(st, all, offset, len, why));
    }
    // The new files, made before anything changes.
    let mut fresh = Vec::with_capacity(spans.len());
    let budget = (!spans.is_empty())
        .then(|| no_room(inner, st, &FileBudget::now(), spans.len() + 2))
        .flatten();
    if let Some(e) = budget {
        runs_back(st, restore, kept);
        give_back(st, offset, len);
        return Err(e);
    }
    for &(from, n) in &spans {
        match MemFile::create(n, inner.huge) {
            Ok(file) => fresh.push((from, n, file)),
            Err(e) => {
                runs_back(st, restore, kept);
                give_back(st, offset, len);
                return Err(PoolError::from_file(e, n));
            }
        }
    }
    // Released first: with huge pages, the new files need these pages.
    for (_, p) in &restore {
        p.file.punch(p.file_off, p.len);
    }
    let mut parts = kept;
    let mut mapped = Ok(());
    for (from, n, file) in fresh {
        if mapped.is_ok() {
            // SAFETY: the span is inside a slab, was just taken from the
            // free list (nothing reads or writes it) and is page-aligned.
            mapped = unsafe { inner.map_file(&file, from, 0, n) }
                .map_err(|e| PoolError::from_file(e, n));
        }
        file.own();
        parts.push((from, Part::whole(file)));
    }
    parts.sort_by_key(|(o, _)| *o);
    if let Err(e) = mapped {
        // The runs it took are released, those of the spans go back to
        // their files.
        inner.requeue(
            st,
            offset,
            len,
            parts.into_iter().map(|(_, p)| p).collect(),
            restore,
        );
        return Err(e);
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
    st.held_runs += parts.len();
    Ok(Carved {
        parts: parts.into_iter().map(|(_, p)| p).collect(),
        restore,
        file_of: None,
    })
}

/// The spans of `taken` (runs in offset order) that files lending runs
/// back: for each such file, from its first run to the end of its last,
/// merged where they overlap (other files' runs may lie between).
fn lending_spans(taken: &[(u64, Part)]) -> Vec<(u64, u64)> {
    let mut by_file: Vec<(*const MemFile, u64, u64)> = Vec::new();
    for (o, p) in taken.iter().filter(|(_, p)| p.file.lent()) {
        let end = o + p.len;
        match by_file
            .iter_mut()
            .find(|(f, _, _)| *f == Arc::as_ptr(&p.file))
        {
            Some((_, _, e)) => *e = end,
            None => by_file.push((Arc::as_ptr(&p.file), *o, end)),
        }
    }
    by_file.sort_by_key(|&(_, s, _)| s);
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for (_, s, e) in by_file {
        match spans.last_mut() {
            Some((ls, ln)) if s <= *ls + *ln => *ln = (*ln).max(e - *ls),
            _ => spans.push((s, e - s)),
        }
    }
    spans
}

/// Why `taken` does not tile `[offset, offset + len)` exactly, if so.
fn untiled(taken: &[(u64, Part)], offset: u64, len: u64) -> Option<&'static str> {
    let mut next = offset;
    let tiles = taken.iter().all(|(o, p)| {
        let ok = *o == next;
        next = o + p.len;
        ok
    }) && next == offset + len;
    (!tiles).then_some("a reserved range is not wholly backed")
}

/// Refuses a reservation whose bookkeeping is inconsistent: the runs go
/// back, the range to the free list.
fn refuse(
    st: &mut State,
    taken: Vec<(u64, Part)>,
    offset: u64,
    len: u64,
    why: &'static str,
) -> PoolError {
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
    PoolError::Inconsistent(why)
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
