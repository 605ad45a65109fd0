//! The application's session with the cluster, as the public API shows it:
//! connecting, making and attaching allocations, copies between two
//! allocations ([`crate::device`]) and batches ([`crate::batch`]). The
//! machinery (runtime, control channel) is [`crate::client`].
//!
//! The session stream stays open for the life of the [`Oncilla`] value:
//! when the process exits, the agent sees it close and the cluster frees
//! the session's allocations. Copies never pass through here: they go
//! straight to the nodes that hold the bytes (`fabric`).

use std::sync::Arc;

use oncilla_model::alloc::AllocRef;

use crate::allocation::Allocation;
use crate::batch::{self, Batch, Pending};
use crate::client::Client;
use crate::descriptor::Kind;
use crate::device;
use crate::error::{Error, Result};
use crate::options::Options;
use crate::spec::AllocSpec;

/// A session with the cluster. Cheap to clone; thread-safe.
#[derive(Clone)]
pub struct Oncilla {
    pub(crate) client: Arc<Client>,
}

impl Oncilla {
    /// Connects using [`Options::from_env`].
    ///
    /// # Errors
    /// No token, or the agent cannot be reached.
    pub fn connect() -> Result<Self> {
        Self::connect_with(Options::from_env()?)
    }

    /// Connects to the agent at `opts.socket` and opens a session.
    ///
    /// Blocks the calling thread (the library runs a small runtime of its
    /// own); from async code, [`crate::AsyncOncilla::connect_with`] does not.
    ///
    /// # Errors
    /// [`crate::Error::AgentUnreachable`], [`crate::Error::PermissionDenied`]
    /// for a wrong token.
    pub fn connect_with(opts: Options) -> Result<Self> {
        Ok(Self {
            client: Arc::new(Client::connect(opts)?),
        })
    }

    /// Name of the local node.
    pub fn node(&self) -> &str {
        &self.client.node
    }

    /// This session's id, as `ocmctl allocs` shows it.
    pub fn session_id(&self) -> &str {
        &self.client.session_id
    }

    /// Ends the session now, as this process's exit would: the agent
    /// ends it, so the allocations it owns (not persistent ones) are freed
    /// and its attachments end; later calls through it, and copies through
    /// handles it made, fail. Closing again does nothing. Dropping the
    /// last clone of the session (and every handle) ends it too.
    pub fn close(&self) {
        self.client.close();
    }

    /// Allocates `size` bytes of `kind`, placed by the master.
    ///
    /// # Errors
    /// As [`Oncilla::alloc_with`].
    pub fn alloc(&self, size: u64, kind: Kind) -> Result<Allocation> {
        self.alloc_with(&AllocSpec::new(size, kind))
    }

    /// Allocates as `spec` says.
    ///
    /// # Errors
    /// [`Error::CapacityExhausted`] (the message says what is free where),
    /// [`Error::InvalidArgument`], [`Error::AlreadyExists`] for a taken
    /// name, [`Error::NodeDown`], [`Error::Unavailable`] when the master
    /// cannot be reached.
    pub fn alloc_with(&self, spec: &AllocSpec) -> Result<Allocation> {
        let record = self.client.alloc(spec)?;
        let fabric = spec.fabric.unwrap_or(self.client.fabric);
        // Should opening fail (no device memory, no mapping), dropping the
        // half-built handle frees what the cluster recorded.
        Allocation::open(&self.client, record, fabric)
    }

    /// Frees `allocs` together: one call to the master, which checks and
    /// removes them all in one step and releases them with one call per
    /// agent, so many small frees cost a fraction of as many calls to
    /// [`Allocation::free`]. All or none: when one may not be freed
    /// (another process is attached to a persistent one, say), none is and
    /// every handle stays as it was. Once freed, the handles are inert
    /// (copies fail; dropping them does nothing).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for none or more than
    /// [`MAX_BATCH`](oncilla_model::alloc::MAX_BATCH) handles, one
    /// allocation twice, or a handle of another session;
    /// [`Error::NotFound`] for a handle freed already; otherwise as
    /// [`Allocation::free`], for the first refused.
    pub fn free_many(&self, allocs: &mut [Allocation]) -> Result<()> {
        let mut ids = Vec::with_capacity(allocs.len());
        for a in allocs.iter() {
            let id = a.descriptor().id;
            if !Arc::ptr_eq(&a.client, &self.client) {
                return Err(Error::InvalidArgument(format!(
                    "allocation {id} was opened by another session; free it there"
                )));
            }
            if a.done {
                return Err(Error::NotFound(format!(
                    "no such allocation: {id} was freed through this handle"
                )));
            }
            ids.push(id);
        }
        self.client.free_many(&ids)?;
        for a in allocs {
            a.finish();
        }
        Ok(())
    }

    /// Makes `count` allocations as `spec` says, together: one call to the
    /// master, which places them all in one step and reserves them with
    /// one call per agent, so many small allocations cost a fraction of
    /// `count` calls to [`Oncilla::alloc_with`]. All or none: on an error
    /// nothing is left allocated. Each handle is then an allocation of its
    /// own (freed on drop, copied to and from alone).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `count` outside 1 to
    /// [`MAX_BATCH`](oncilla_model::alloc::MAX_BATCH), a named or
    /// persistent spec (those are made one at a time), or when the
    /// batch's extents together would not fit one message; otherwise as
    /// [`Oncilla::alloc_with`].
    pub fn alloc_many(&self, spec: &AllocSpec, count: usize) -> Result<Vec<Allocation>> {
        let records = self.client.alloc_many(spec, count)?;
        let fabric = spec.fabric.unwrap_or(self.client.fabric);
        let mut made = Vec::with_capacity(records.len());
        let mut records = records.into_iter();
        while let Some(record) = records.next() {
            let id = record.id;
            match Allocation::open(&self.client, record, fabric) {
                Ok(a) => made.push(a),
                Err(e) => {
                    // The handles made so far free theirs as they drop;
                    // this one (unless its half-built handle did) and the
                    // rest are freed here (a failure to free is the
                    // session's to clean up when it ends).
                    // (`id` may be gone with its half-built handle: freed
                    // on its own, so the batch of the rest is not refused.)
                    let _ = self.client.free_id(id, false);
                    let rest: Vec<u64> = records.map(|r| r.id).collect();
                    if !rest.is_empty() {
                        let _ = self.client.free_many(&rest);
                    }
                    return Err(e);
                }
            }
        }
        Ok(made)
    }

    /// Attaches the persistent allocation called `name`, made by any
    /// process on any node. Dropping the handle detaches; the allocation
    /// stays until freed.
    ///
    /// # Errors
    /// [`Error::NotFound`], and fabric errors when this session's fabric
    /// cannot reach its extents.
    pub fn attach(&self, name: &str) -> Result<Allocation> {
        self.attach_ref(AllocRef::Name(name.to_string()))
    }

    /// Attaches the persistent allocation with this id.
    ///
    /// # Errors
    /// As [`Oncilla::attach`].
    pub fn attach_id(&self, id: u64) -> Result<Allocation> {
        self.attach_ref(AllocRef::Id(id))
    }

    fn attach_ref(&self, alloc: AllocRef) -> Result<Allocation> {
        let record = self.client.attach(alloc)?;
        Allocation::open(&self.client, record, self.client.fabric)
    }

    /// Copies `len` bytes from one allocation to another, of any kinds.
    ///
    /// - GPU memory of this process on both sides: on the device (peer to
    ///   peer between two GPUs).
    /// - Between GPU memory of this process and memory that verbs reaches
    ///   (with the `verbs` feature, where the HCA can register device
    ///   memory: nvidia-peermem or dma-buf): by RDMA straight to or from the
    ///   device, no staging (GPUDirect RDMA).
    /// - Otherwise into GPU memory of this process: through this GPU's
    ///   page-locked staging ring, the fabric filling one buffer while the
    ///   previous one goes to the device on a CUDA stream.
    /// - Out of GPU memory of this process: the same ring the other way.
    /// - Otherwise (host memory, or GPU memory an agent holds) with no
    ///   bounce through this process where none is needed: a side mapped
    ///   here is read into or written out of directly by the fabric, and
    ///   between two allocations both elsewhere the destination's agent
    ///   pulls the bytes from the source's (only device memory an agent
    ///   holds is filled through a buffer here).
    ///
    /// # Errors
    /// [`crate::Error::OutOfBounds`] for either range;
    /// [`crate::Error::InvalidArgument`] for overlapping ranges of one
    /// allocation; fabric and GPU failures.
    pub fn copy(
        &self,
        dst: &Allocation,
        dst_offset: u64,
        src: &Allocation,
        src_offset: u64,
        len: u64,
    ) -> Result<()> {
        let c = &self.client;
        device::copy(&c.data, &c.staging, dst, dst_offset, src, src_offset, len)
    }

    /// Starts every copy of `batch` in the background and returns at once;
    /// the copies run in parallel (nodes at once, each over several
    /// connections, pipelined), with no order among them. Wait for them
    /// with [`Pending::wait`] or poll with [`Pending::is_done`].
    pub fn submit(&self, batch: Batch) -> Pending {
        batch::submit(&self.client, batch)
    }
}
