//! The scrubber: zeroes freed extents off the request path and only then
//! returns them to the free list.
//!
//! One thread per pool. It works in bounded chunks so that a freed 4 GiB
//! extent becomes reusable progressively and a waiting reservation is served
//! as soon as enough is clean. It never hands out memory and never zeroes
//! memory that an extent still owns (only what `retire` queued).

use super::Inner;

/// Largest piece zeroed between two trips to the free list.
const CHUNK: u64 = 64 << 20;

/// Runs until the pool shuts down.
pub(super) fn run(inner: &Inner) {
    loop {
        let (offset, len) = {
            let mut st = inner.lock();
            loop {
                if st.shutdown {
                    return;
                }
                if let Some((offset, len)) = st.dirty.pop_front() {
                    // Chunks stay page-aligned: extents start on a page and
                    // the chunk is a whole number of pages.
                    let now = len.min(super::round_up(CHUNK, inner.page));
                    if len > now {
                        st.dirty.push_front((offset + now, len - now));
                    }
                    break (offset, now);
                }
                st = inner.freed.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        let ptr = inner.ptr(offset);
        if ptr.is_null() {
            tracing::error!(offset, len, "retired extent outside the pool; not reused");
            continue;
        }
        // SAFETY: [offset, offset + len) was retired by the extent that owned
        // it (its last user dropped it) and is not in the free list yet, so
        // nothing else reads or writes it; it lies inside one slab.
        unsafe {
            std::ptr::write_bytes(ptr, 0, usize::try_from(len).unwrap_or(0));
        }
        let mut st = inner.lock();
        st.free.give(offset, len);
        st.scrubbing -= len;
        drop(st);
        inner.cleaned.notify_all();
    }
}
