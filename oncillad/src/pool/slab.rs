//! One slab: a range of this process's address space that the pool owns,
//! aligned to the page size in use, which memory files are mapped into
//! ([`super::file::MemFile::map_at`]).
//!
//! A slab is the unit extents never straddle. It reserves address space
//! only (inaccessible until a file is mapped over it); it never creates,
//! maps or hands out memory itself.

use std::num::NonZeroUsize;
use std::ptr::NonNull;

use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

/// A reserved, page-aligned range of address space.
pub struct Slab {
    base: NonNull<u8>,
    len: u64,
    start: u64,
}

// SAFETY: the range is owned by the slab for its whole life; the slab only
// hands out raw pointers, and whoever writes through them owns the range
// (the free list gives each range to one holder at a time).
unsafe impl Send for Slab {}
// SAFETY: as above; `&Slab` exposes no interior state.
unsafe impl Sync for Slab {}

impl Slab {
    /// Reserves `len` bytes (a multiple of `page`) aligned to `page`, for
    /// pool offsets from `start`.
    ///
    /// # Errors
    /// The address space cannot be reserved.
    pub fn reserve(start: u64, len: u64, page: u64) -> Result<Self, nix::Error> {
        let size = usize::try_from(len).map_err(|_| nix::Error::ENOMEM)?;
        let align = usize::try_from(page).map_err(|_| nix::Error::EINVAL)?;
        let padded = size
            .checked_add(align)
            .and_then(NonZeroUsize::new)
            .ok_or(nix::Error::ENOMEM)?;
        // SAFETY: a fresh private, inaccessible anonymous mapping at an
        // address the kernel picks; it aliases nothing.
        let raw = unsafe {
            mmap_anonymous(
                None,
                padded,
                ProtFlags::PROT_NONE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }?;
        let first = raw.as_ptr() as usize;
        let aligned = first.div_ceil(align) * align;
        let head = aligned - first;
        let tail = padded.get() - head - size;
        if head > 0 {
            // SAFETY: the unaligned front of the reservation just made.
            unsafe { munmap(raw, head) }?;
        }
        if tail > 0 {
            let end = NonNull::new((aligned + size) as *mut std::ffi::c_void)
                .ok_or(nix::Error::EINVAL)?;
            // SAFETY: the part of the reservation past `len`, never used.
            unsafe { munmap(end, tail) }?;
        }
        let base = NonNull::new(aligned as *mut u8).ok_or(nix::Error::EINVAL)?;
        Ok(Self { base, len, start })
    }

    /// Address of the slab's first byte in this process.
    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Address of pool offset `offset`, which must lie in this slab.
    pub(super) fn at(&self, offset: u64) -> Option<NonNull<u8>> {
        let within = usize::try_from(offset.checked_sub(self.start)?).ok()?;
        (offset < self.start + self.len).then(|| {
            // SAFETY: `within` is less than the slab's length, so the
            // result stays inside the reservation.
            unsafe { self.base.add(within) }
        })
    }

    /// Length in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Pool offset of the slab's first byte.
    pub fn start(&self) -> u64 {
        self.start
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        let len = usize::try_from(self.len).unwrap_or(0);
        // SAFETY: the reservation made in `reserve` with this length (files
        // mapped into it go with it); the pool drops slabs only when no
        // extent refers to them.
        if let Err(e) = unsafe { munmap(self.base.cast(), len) } {
            tracing::error!(error = %e, "cannot unmap slab");
        }
    }
}
