//! Byte ranges of an allocation as `(offset, len)` pairs, in order and
//! never overlapping: an extent's overlap with them, a node's extents
//! merged into them, their difference and intersection. Pure functions
//! on values; the other `master/` modules build on them and this module
//! imports none of its siblings.

use oncilla_model::alloc::Extent;

/// Whether extent `e` holds any byte of `ranges` (in order, never
/// overlapping): a binary search, as a striped allocation has tens of
/// thousands of extents and ranges.
pub(super) fn overlaps(e: &Extent, ranges: &[(u64, u64)]) -> bool {
    let end = e.alloc_offset + e.len;
    // The last range that starts before the extent ends.
    let before = ranges.partition_point(|&(o, _)| o < end);
    before > 0 && {
        let (o, l) = ranges[before - 1];
        o + l > e.alloc_offset
    }
}

/// Extents' ranges, adjacent ones merged, in order.
pub(super) fn merged<'a>(extents: impl Iterator<Item = &'a Extent>) -> Vec<(u64, u64)> {
    let mut r: Vec<(u64, u64)> = extents.map(|e| (e.alloc_offset, e.len)).collect();
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (o, l) in r {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == o => last.1 += l,
            _ => out.push((o, l)),
        }
    }
    out
}

/// The bytes of `ranges` outside `minus` (both in order, never
/// overlapping), in order.
pub(super) fn subtract(ranges: &[(u64, u64)], minus: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(offset, len) in ranges {
        let (mut at, end) = (offset, offset + len);
        for &(o, l) in minus {
            if o >= end || o + l <= at {
                continue;
            }
            if o > at {
                out.push((at, o - at));
            }
            at = at.max(o + l);
        }
        if at < end {
            out.push((at, end - at));
        }
    }
    out
}

/// The bytes in both `a` and `b` (both in order, never overlapping), in
/// order.
pub(super) fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(o, l) in a {
        for &(p, m) in b {
            let (from, until) = (o.max(p), (o + l).min(p + m));
            if from < until {
                out.push((from, until - from));
            }
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::{intersect, subtract};

    #[test]
    fn ranges_subtract_and_intersect() {
        let a = [(0, 100), (200, 100)];
        assert_eq!(subtract(&a, &[(50, 200)]), [(0, 50), (250, 50)]);
        assert_eq!(
            subtract(&a, &[(0, 10), (20, 10), (200, 100)]),
            [(10, 10), (30, 70)]
        );
        assert_eq!(subtract(&a, &[]), a);
        assert!(subtract(&a, &[(0, 300)]).is_empty());
        assert_eq!(intersect(&a, &[(50, 200)]), [(50, 50), (200, 50)]);
        assert!(intersect(&a, &[(100, 100)]).is_empty());
    }
}
