//! Which memory file backs each free range of the pool: pool offset ->
//! [`Part`] (a run of one file), in offset order.
//!
//! The map holds exactly the free memory (what the free list holds): a
//! range leaves it when it is reserved (the extent then holds its parts)
//! and comes back, backed anew, when the refiller returns it. Pure
//! bookkeeping: this module never maps, punches or creates a file.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::file::{MemFile, Part};

/// Free pool ranges and the files behind them.
#[derive(Default)]
pub struct Backing {
    parts: BTreeMap<u64, Part>,
}

impl Backing {
    /// Number of runs (each one mapping in the agent's address space).
    pub fn runs(&self) -> usize {
        self.parts.len()
    }

    /// Records that `part` backs the range at `offset`, merged with a
    /// neighbouring run of the same file at the adjacent file offsets (the
    /// kernel merges their mappings too), so runs put back do not pile up.
    pub fn insert(&mut self, offset: u64, mut part: Part) {
        let mut start = offset;
        if let Some((&o, left)) = self.parts.range(..offset).next_back() {
            if o + left.len == offset
                && Arc::ptr_eq(&left.file, &part.file)
                && left.file_off + left.len == part.file_off
            {
                start = o;
                part.file_off = left.file_off;
                part.len += left.len;
                self.parts.remove(&o);
            }
        }
        let end = offset + part.len - (offset - start);
        let right = self
            .parts
            .get(&end)
            .filter(|r| Arc::ptr_eq(&r.file, &part.file) && part.file_off + part.len == r.file_off);
        if let Some(r) = right {
            part.len += r.len;
            self.parts.remove(&end);
        }
        self.parts.insert(start, part);
    }

    /// Cuts the run that strictly contains `offset` in two.
    fn split_at(&mut self, offset: u64) {
        let Some((&start, part)) = self.parts.range(..offset).next_back() else {
            return;
        };
        if start + part.len <= offset {
            return;
        }
        let head = offset - start;
        let tail = Part {
            file: Arc::clone(&part.file),
            file_off: part.file_off + head,
            len: part.len - head,
        };
        if let Some(p) = self.parts.get_mut(&start) {
            p.len = head;
        }
        self.parts.insert(offset, tail);
    }

    /// Removes and returns the runs backing `[offset, offset + len)`, cut
    /// at both ends, in offset order.
    pub fn take(&mut self, offset: u64, len: u64) -> Vec<(u64, Part)> {
        self.split_at(offset);
        self.split_at(offset + len);
        let keys: Vec<u64> = self
            .parts
            .range(offset..offset + len)
            .map(|(&k, _)| k)
            .collect();
        keys.into_iter()
            .filter_map(|k| self.parts.remove(&k).map(|p| (k, p)))
            .collect()
    }

    /// Every range `file` still backs here, as (offset, len). `base` is
    /// the pool offset of the file's first byte: a file's runs keep their
    /// place (pool offset = base + file offset), so they all lie in
    /// `[base, base + file length)` and only that part of the map is read.
    pub fn of_file(&self, file: &Arc<MemFile>, base: u64) -> Vec<(u64, u64)> {
        self.parts
            .range(base..base.saturating_add(file.len()))
            .filter(|(_, p)| Arc::ptr_eq(&p.file, file))
            .map(|(&o, p)| (o, p.len))
            .collect()
    }

    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Part)> {
        self.parts.iter().map(|(&o, p)| (o, p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4096;

    #[test]
    fn take_cuts_runs_at_both_ends() {
        let a = Arc::new(MemFile::create(8 * P, false).unwrap());
        let b = Arc::new(MemFile::create(4 * P, false).unwrap());
        let mut m = Backing::default();
        m.insert(
            0,
            Part {
                file: Arc::clone(&a),
                file_off: 0,
                len: 8 * P,
            },
        );
        m.insert(
            8 * P,
            Part {
                file: Arc::clone(&b),
                file_off: 0,
                len: 4 * P,
            },
        );
        let got = m.take(6 * P, 4 * P);
        let got: Vec<_> = got
            .iter()
            .map(|(o, p)| (*o, Arc::ptr_eq(&p.file, &a), p.file_off, p.len))
            .collect();
        assert_eq!(got, [(6 * P, true, 6 * P, 2 * P), (8 * P, false, 0, 2 * P)]);
        let left: Vec<_> = m.iter().map(|(o, p)| (o, p.file_off, p.len)).collect();
        assert_eq!(left, [(0, 0, 6 * P), (10 * P, 2 * P, 2 * P)]);
        assert_eq!(m.of_file(&a, 0), [(0, 6 * P)]);
        assert_eq!(m.of_file(&b, 8 * P), [(10 * P, 2 * P)]);
        assert_eq!(m.runs(), 2);
        // Put back, the runs of `a` merge again; `b`'s stays apart.
        for (o, p) in m.take(0, 6 * P).into_iter().chain(got_back(&a, &b)) {
            m.insert(o, p);
        }
        let runs: Vec<_> = m.iter().map(|(o, p)| (o, p.file_off, p.len)).collect();
        assert_eq!(runs, [(0, 0, 8 * P), (8 * P, 0, 4 * P)]);
    }

    /// The runs `take` returned in the test above, rebuilt.
    fn got_back(a: &Arc<MemFile>, b: &Arc<MemFile>) -> Vec<(u64, Part)> {
        vec![
            (
                6 * P,
                Part {
                    file: Arc::clone(a),
                    file_off: 6 * P,
                    len: 2 * P,
                },
            ),
            (
                8 * P,
                Part {
                    file: Arc::clone(b),
                    file_off: 0,
                    len: 2 * P,
                },
            ),
        ]
    }
}
