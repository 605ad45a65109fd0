//! An allocation handle: opening (validating the descriptor, deciding the
//! route of every extent once, mapping this node's extents, making a local
//! GPU allocation's device memory), copies to and from it, and its release.
//!
//! It never chooses a fabric per copy: the routes decided here travel with
//! every copy ([`crate::route`]). It never frees memory it did not open.

use std::sync::Arc;

use oncilla_cuda::{DeviceMem, Gpu};
use oncilla_model::alloc::Allocation as Record;

use crate::client::Client;
use crate::descriptor::{Descriptor, Kind};
use crate::error::{Error, Result};
use crate::fabric::shm::Mapping;
use crate::fabric::tcp::IoBuf;
use crate::fabric::{Target, Transfer};
use crate::failover::{Failover, FAILOVER_WAIT};
use crate::map::{MapOptions, Mapped};
use crate::route::{self, Route};
use crate::spec::Fabric;

/// An allocation. Dropping it frees it, or, for a persistent (or named)
/// allocation, detaches this process from it; call [`Allocation::free`] to
/// free it and see the result.
pub struct Allocation {
    /// The session: kept alive as long as the handle.
    pub(crate) client: Arc<Client>,
    /// Shared with batches in flight, which keep it (and the mapping)
    /// alive until they end.
    pub(crate) desc: Arc<Descriptor>,
    /// How each extent is reached, in extent order.
    pub(crate) routes: Arc<[Route]>,
    /// The extents on this node, mapped; copies to them are memcpy.
    pub(crate) local: Option<Arc<Mapping>>,
    /// A local GPU allocation's device memory, in this process.
    pub(crate) device: Option<Arc<DeviceMem>>,
    /// Its way through a lost node or a move (shared with its batches).
    pub(crate) failover: Arc<Failover>,
    /// Freed or detached already.
    pub(crate) done: bool,
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("id", &self.desc.id)
            .field("size", &self.desc.size)
            .field("kind", &self.desc.kind)
            .finish_non_exhaustive()
    }
}

impl Allocation {
    /// Wraps a wire allocation in a handle: decides every extent's route
    /// for `fabric` and maps the extents routed through shared memory.
    ///
    /// # Errors
    /// A malformed allocation, a preference that cannot reach an extent
    /// ([`Error::InvalidArgument`]), mapping and device-memory failures.
    pub(crate) fn open(client: &Arc<Client>, mut record: Record, fabric: Fabric) -> Result<Self> {
        let data = &client.data;
        let me = client.node.as_str();
        // By what was asked, not by the copies there are now: one
        // opened while its lost copies are being re-created is still
        // looked up again through a loss.
        let failover = Arc::new(Failover::open(client, &record, fabric)?);
        record.replicas.clear();
        let desc = Descriptor::from_record(record)?;
        let mut alloc = Allocation {
            client: Arc::clone(client),
            routes: Arc::from([]),
            desc: Arc::new(desc),
            local: None,
            device: None,
            failover,
            done: false,
        };
        if alloc.desc.kind == Kind::LocalGpu {
            // Its bytes are in this process: no copy takes a route, which
            // only says what `fabrics` reports.
            alloc.routes = alloc
                .desc
                .extents
                .iter()
                .map(|e| Route::decide(e, me, fabric, &data.rdma_for(e)).unwrap_or(Route::Tcp))
                .collect();
            let index = alloc
                .desc
                .extents
                .first()
                .and_then(|e| e.gpu)
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "local GPU allocation {} names no device",
                        alloc.desc.id
                    ))
                })?;
            let mem = Gpu::open(index)?.alloc(alloc.desc.size)?;
            alloc.device = Some(Arc::new(mem));
            return Ok(alloc);
        }
        let mut routes = route::decide_all(&alloc.desc.extents, me, fabric, |e| data.rdma_for(e))?;
        let local: Vec<_> = alloc
            .desc
            .extents
            .iter()
            .zip(&routes)
            .filter(|(_, r)| **r == Route::Mapped)
            .map(|(e, _)| e)
            .collect();
        if !local.is_empty() {
            match Mapping::open(
                &client.socket,
                &client.credential.current(),
                alloc.desc.id,
                &alloc.desc.key,
                &local,
                &client.staging.pins,
            ) {
                Ok(mapping) => alloc.local = Some(Arc::new(mapping)),
                // The agent holds as many mappings for this user as it
                // gives one user (each mapped handle is one): remote host
                // memory that happens to be on this node goes over TCP, as
                // another node's would, unless shared memory was asked
                // for by name. Local host memory is asked for as memory
                // to map (`localbuf`): its refusal stands.
                Err(Error::CapacityExhausted(why))
                    if fabric == Fabric::Auto && alloc.desc.kind != Kind::LocalHost =>
                {
                    tracing::debug!(id = alloc.desc.id, %why, "not mapped; its bytes go over TCP");
                    for r in routes.iter_mut().filter(|r| **r == Route::Mapped) {
                        *r = Route::Tcp;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        alloc.routes = routes.into();
        Ok(alloc)
    }

    /// What the data path needs to copy to and from it.
    pub(crate) fn target(&self) -> Target<'_> {
        Target {
            desc: &self.desc,
            routes: &self.routes,
            local: self.local.as_deref(),
        }
    }

    pub fn id(&self) -> u64 {
        self.desc.id
    }

    pub fn size(&self) -> u64 {
        self.desc.size
    }

    pub fn kind(&self) -> Kind {
        self.desc.kind
    }

    /// Where the bytes live.
    pub fn descriptor(&self) -> &Descriptor {
        &self.desc
    }

    /// True when any byte lives on another node.
    pub fn is_remote(&self) -> bool {
        self.desc.extents.iter().any(|e| e.node != self.client.node)
    }

    /// The name, for a named allocation.
    pub fn name(&self) -> Option<&str> {
        self.desc.name.as_deref()
    }

    /// The fabric this process uses for each extent, in extent order.
    pub fn fabrics(&self) -> Vec<Fabric> {
        let data = &self.client.data;
        self.desc
            .extents
            .iter()
            .zip(self.routes.iter())
            .map(|(e, r)| data.hop(e, *r).map_or(Fabric::Tcp, Route::fabric))
            .collect()
    }

    /// Writes `src` at `offset`; returns once the bytes are visible to
    /// every later reader (this node's extents by memcpy, the others over
    /// the network, all nodes in parallel). A replicated allocation is
    /// written through its primary, which returns once every replica has
    /// the bytes; when a node holding a copy is lost, the write waits
    /// (up to 30 s) for the master to promote a replica or drop the lost
    /// copy, and goes on there without the caller seeing the failure.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`]; fabric failures; [`Error::NotFound`] once the
    /// allocation was freed (by anyone).
    pub fn copy_in(&self, offset: u64, src: &[u8]) -> Result<()> {
        if let Some(mem) = &self.device {
            // Bounds checked there: the device memory is the allocation's size.
            return Ok(mem.write(offset, src)?);
        }
        self.failover.write(offset, src, FAILOVER_WAIT, |src| {
            self.client.data.run([Transfer {
                target: self.target(),
                offset,
                buf: IoBuf::Write(src),
            }])
        })
    }

    /// Reads `dst.len()` bytes from `offset`. A replicated allocation is
    /// read from the copy with the most bytes on this node (the primary
    /// on a tie), and from the next copy when a node cannot be reached or
    /// fails the read, so a lost replica holder costs the caller nothing;
    /// when every copy fails, as [`Allocation::copy_in`] waits.
    ///
    /// # Errors
    /// As [`Allocation::copy_in`]; for a replicated allocation, the last
    /// copy's failure once every copy failed for 30 s.
    pub fn copy_out(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        if let Some(mem) = &self.device {
            // Bounds checked there: the device memory is the allocation's size.
            return Ok(mem.read(offset, dst)?);
        }
        self.failover.read(offset, dst, FAILOVER_WAIT, |dst| {
            self.client.data.run([Transfer {
                target: self.target(),
                offset,
                buf: IoBuf::Read(dst),
            }])
        })
    }

    /// Maps the allocation into this process: its bytes at
    /// [`Mapped::as_ptr`], fetched block by block as they are touched
    /// (userfaultfd demand paging over the allocation's own route), written
    /// back at [`Mapped::flush`], eviction and unmap. An allocation wholly
    /// in this node's memory is mapped directly, with no paging.
    ///
    /// # Errors
    /// [`Error::Map`] for GPU memory, or where this process may not use
    /// userfaultfd (the message names what to change);
    /// [`Error::InvalidArgument`] for options out of range.
    pub fn map(&self, options: MapOptions) -> Result<Mapped<'_>> {
        crate::map::map(self, &self.client, options)
    }

    /// The bytes of an allocation that lies wholly in this node's memory,
    /// as one plain slice in this process (shared with the agent's pool:
    /// no copy is involved).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an allocation with bytes elsewhere (or
    /// opened with the TCP fabric); use [`Allocation::copy_in`] and
    /// [`Allocation::copy_out`] for those.
    pub fn localbuf(&mut self) -> Result<&mut [u8]> {
        let (ptr, len) = self.local_range()?;
        // SAFETY: the mapping is valid for `len` contiguous bytes (checked
        // by `local_range`) for as long as `self` lives, and `&mut self`
        // makes this the only reference into it from this process for the
        // slice's lifetime.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// Where an allocation that lies wholly in this node's memory, mapped
    /// in one piece, starts in this process, and its length: for views
    /// that other code keeps (the Python bindings' NumPy and DLPack
    /// views). The range stays mapped while this handle lives; nothing
    /// here orders access to it (see [`Allocation::localbuf`] for a slice).
    ///
    /// # Errors
    /// As [`Allocation::localbuf`].
    pub fn local_range(&self) -> Result<(*mut u8, usize)> {
        let id = self.desc.id;
        let ptr = self
            .local
            .as_ref()
            .and_then(|m| m.contiguous(self.desc.size))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "allocation {id} is not local host memory mapped in one piece (bytes on other nodes, striped, GPU memory, or the TCP fabric); use copy_in/copy_out"
                ))
            })?;
        let len = usize::try_from(self.desc.size)
            .map_err(|_| Error::Internal("offset beyond the address space".into()))?;
        Ok((ptr, len))
    }

    /// Frees the allocation now. A persistent allocation that other
    /// processes are attached to is refused ([`Error::InUse`]).
    ///
    /// # Errors
    /// [`Error::NotFound`] when someone already freed it; [`Error::InUse`];
    /// control-path failures.
    pub fn free(self) -> Result<()> {
        self.release(false)
    }

    /// Frees the allocation even while other processes are attached; their
    /// next copy fails with [`Error::NotFound`].
    ///
    /// # Errors
    /// As [`Allocation::free`], never [`Error::InUse`].
    pub fn force_free(self) -> Result<()> {
        self.release(true)
    }

    /// Frees the allocation now (`force`: even while other processes are
    /// attached), through a handle that stays usable when the free is
    /// refused: for bindings whose objects outlive a failed call. Once it
    /// succeeds (or someone else freed it) the handle is inert: copies
    /// fail and dropping it does nothing.
    ///
    /// # Errors
    /// As [`Allocation::free`] and [`Allocation::force_free`].
    pub fn try_free(&mut self, force: bool) -> Result<()> {
        if self.done {
            return Err(Error::NotFound(format!(
                "no such allocation: {} was freed through this handle",
                self.desc.id
            )));
        }
        let outcome = self.client.free_id(self.desc.id, force);
        if matches!(outcome, Ok(()) | Err(Error::NotFound(_))) {
            self.finish();
        }
        outcome
    }

    /// Detaches this process from a persistent (or named) allocation now,
    /// as dropping the handle does, and reports the outcome.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an allocation of this session (free
    /// it instead); [`Error::NotFound`] once someone freed it; control-path
    /// failures.
    pub fn detach(mut self) -> Result<()> {
        if self.desc.owner.is_some() {
            return Err(Error::InvalidArgument(format!(
                "allocation {} belongs to this session: free it (only persistent allocations are detached)",
                self.desc.id
            )));
        }
        self.finish();
        self.client.detach_id(self.desc.id)
    }

    /// A local GPU allocation's device memory (for kernels); `None` for
    /// every other kind.
    pub fn device_mem(&self) -> Option<&DeviceMem> {
        self.device.as_deref()
    }

    fn release(mut self, force: bool) -> Result<()> {
        self.finish();
        self.client.free_id(self.desc.id, force)
    }

    /// Marks the handle done (its drop frees and detaches nothing) and lets
    /// go of the mapping and the device memory.
    pub(crate) fn finish(&mut self) {
        self.done = true;
        self.local = None;
        self.device = None;
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.local = None;
        self.device = None;
        // A closed session's end released it already.
        if self.done || self.client.is_closed() {
            return;
        }
        let (client, id) = (Arc::clone(&self.client), self.desc.id);
        let persistent = self.desc.owner.is_none();
        let release = move || {
            let outcome = if persistent {
                client.detach_id(id)
            } else {
                client.free_id(id, false)
            };
            match outcome {
                // Freed by someone else already: nothing left to do.
                Ok(()) | Err(Error::NotFound(_)) => {}
                Err(e) => tracing::warn!(id, error = %e, "cannot release allocation on drop"),
            }
        };
        // Dropped in async code: released in the background of the
        // session's runtime, so no executor thread waits for the master
        // (a session that ends first releases it with everything else).
        if tokio::runtime::Handle::try_current().is_ok() {
            drop(self.client.rt.spawn_blocking(release));
        } else {
            release();
        }
    }
}
