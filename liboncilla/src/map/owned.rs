//! A mapping that holds its allocation ([`OwnedMapping`]), for bindings
//! whose objects cannot borrow (the C handle table, Python objects): it
//! keeps an `Arc` of the allocation, so the allocation cannot be freed
//! while it is mapped, where [`Mapped`] ties the two by a lifetime. It
//! adds nothing to paging.

use std::ops::Deref;
use std::sync::Arc;

use super::{MapOptions, Mapped};
use crate::allocation::Allocation;
use crate::error::Result;

/// A mapped allocation that owns a share of its allocation: the mapping
/// ([`Mapped`], through `Deref`) is dropped, written back and unmapped,
/// before that share is let go.
pub struct OwnedMapping {
    /// Dropped first: fields drop in declaration order.
    mapped: Mapped<'static>,
    alloc: Arc<Allocation>,
}

impl std::fmt::Debug for OwnedMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedMapping")
            .field("allocation", &self.alloc.id())
            .field("mapped", &self.mapped)
            .finish()
    }
}

impl OwnedMapping {
    /// Maps `alloc` as [`Allocation::map`] does, holding it until unmapped.
    ///
    /// # Errors
    /// As [`Allocation::map`].
    pub fn new(alloc: Arc<Allocation>, options: MapOptions) -> Result<Self> {
        // 'static is sound here: `alloc` is held below for as long as the
        // mapping lives, and nothing can free an allocation behind an Arc
        // (freeing takes it by value).
        let mapped = super::map(&alloc, &alloc.client, options)?;
        Ok(Self { mapped, alloc })
    }

    /// The allocation mapped.
    pub fn allocation(&self) -> &Arc<Allocation> {
        &self.alloc
    }

    /// Writes dirty blocks back and releases the range, then the share of
    /// the allocation.
    ///
    /// # Errors
    /// As [`Mapped::unmap`].
    pub fn unmap(self) -> Result<()> {
        let OwnedMapping { mapped, alloc } = self;
        let outcome = mapped.unmap();
        drop(alloc);
        outcome
    }
}

impl Deref for OwnedMapping {
    type Target = Mapped<'static>;

    fn deref(&self) -> &Mapped<'static> {
        &self.mapped
    }
}
