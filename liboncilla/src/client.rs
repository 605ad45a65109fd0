//! The application's handle on the cluster: a session with the local agent
//! and the allocations made through it.
//!
//! Control calls go to the local agent over its Unix socket; copies go
//! straight to the nodes that hold the bytes ([`DataPath`]). The session
//! stream stays open for the life of the [`Oncilla`] value: when the process
//! exits, the agent sees it close and the cluster frees the session's
//! allocations.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hyper_util::rt::TokioIo;
use oncilla_cuda::pinned::PinnedRing;
use oncilla_cuda::{pipeline, DeviceMem, Gpu};
use oncilla_proto::auth::{AttachToken, Token};
use oncilla_proto::client::{SessionClient, CALL_TIMEOUT};
use oncilla_proto::pb;
use tokio::net::UnixStream;
use tokio_stream::StreamExt;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Endpoint, Uri};

use crate::descriptor::{Descriptor, Kind};
use crate::error::{Error, Result};
use crate::fabric::shm::Mapping;
use crate::fabric::tcp::IoBuf;
use crate::fabric::{DataPath, DeviceTransfer, Transfer};
use crate::spec::{AllocSpec, Fabric};

/// How to reach the local agent, and how to move bytes.
#[derive(Debug, Clone)]
pub struct Options {
    /// The agent's Unix socket.
    pub socket: PathBuf,
    pub token: Token,
    /// Fabric preference for every allocation of the session.
    pub fabric: Fabric,
    /// Most TCP connections one copy uses per node (each moves at least
    /// [`STREAM_MIN`](crate::fabric::STREAM_MIN) bytes).
    pub streams: usize,
}

impl Options {
    /// `ONCILLA_SOCKET` (default `/run/oncilla/agent.sock`), the token from
    /// `ONCILLA_TOKEN` / `ONCILLA_TOKEN_FILE`, and `ONCILLA_FABRIC`
    /// (`auto`, `tcp` or `shm`; default `auto`), and `ONCILLA_STREAMS`
    /// (connections per node for one copy, 1 to 64; default
    /// [`DEFAULT_STREAMS`](crate::fabric::DEFAULT_STREAMS)).
    ///
    /// # Errors
    /// [`Error::Token`] when no token is configured;
    /// [`Error::InvalidArgument`] for an unknown fabric or a bad stream count.
    pub fn from_env() -> Result<Self> {
        let socket = std::env::var_os("ONCILLA_SOCKET").map_or_else(
            || PathBuf::from(oncilla_proto::DEFAULT_SOCKET),
            PathBuf::from,
        );
        let fabric = match std::env::var("ONCILLA_FABRIC") {
            Ok(v) => Fabric::parse(&v)
                .map_err(|e| Error::InvalidArgument(format!("ONCILLA_FABRIC: {e}")))?,
            Err(_) => Fabric::Auto,
        };
        let streams = match std::env::var("ONCILLA_STREAMS") {
            Ok(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "ONCILLA_STREAMS: {v:?} is not a number from 1 to 64"
                    ))
                })?,
            Err(_) => crate::fabric::DEFAULT_STREAMS,
        };
        Ok(Self {
            socket,
            token: Token::from_env()?,
            fabric,
            streams,
        })
    }

    /// The agent at `socket` with `token`, fabric chosen automatically.
    pub fn new(socket: impl Into<PathBuf>, token: Token) -> Self {
        Self {
            socket: socket.into(),
            token,
            fabric: Fabric::Auto,
            streams: crate::fabric::DEFAULT_STREAMS,
        }
    }

    /// Uses up to `n` connections per node for one copy (at least one).
    #[must_use]
    pub fn streams(mut self, n: usize) -> Self {
        self.streams = n.max(1);
        self
    }
}

struct Inner {
    rt: tokio::runtime::Runtime,
    socket: PathBuf,
    token: Token,
    fabric: Fabric,
    session: SessionClient,
    session_id: String,
    node: String,
    /// Shared with batches running in the background.
    data: Arc<DataPath>,
    /// Page-locked staging rings for copies between device memory in this
    /// process and anything else, one per GPU, made on first use and kept.
    /// A copy holds its device's ring for its duration.
    staging: Mutex<HashMap<u32, PinnedRing>>,
}

/// Buffers in a staging ring: the network fills one while the device
/// drains another and a third waits, so neither side idles on a hiccup.
const STAGING_SLOTS: usize = 3;
/// Default bytes per staging buffer (`ONCILLA_GPU_STAGING`).
pub const STAGING_DEFAULT: usize = 8 << 20;

/// A session with the cluster. Cheap to clone; thread-safe.
#[derive(Clone)]
pub struct Oncilla {
    inner: Arc<Inner>,
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
    /// Must not be called from inside an async runtime: the library runs
    /// its own small one and blocks the calling thread.
    ///
    /// # Errors
    /// [`Error::AgentUnreachable`], [`Error::PermissionDenied`] for a wrong token.
    pub fn connect_with(opts: Options) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("oncilla-client")
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("cannot start runtime: {e}")))?;
        let socket = opts.socket.clone();
        let unreachable = |reason: String| Error::AgentUnreachable {
            path: socket.display().to_string(),
            reason,
        };
        let (session, session_id, node) = rt.block_on(async {
            let channel = uds_channel(&opts.socket)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let mut client = SessionClient::new(InterceptedService::new(
                channel,
                AttachToken::new(&opts.token),
            ));
            let open = pb::OpenRequest {
                pid: std::process::id(),
                program: program_name(),
            };
            let mut stream = client.open(open).await.map_err(Error::from)?.into_inner();
            let first = tokio::time::timeout(CALL_TIMEOUT, stream.next())
                .await
                .map_err(|_| unreachable("no answer to session open".into()))?
                .ok_or_else(|| unreachable("session closed at once".into()))?
                .map_err(Error::from)?;
            // Hold the stream for the life of the runtime: its end is how
            // the agent learns that this process is gone.
            tokio::spawn(async move {
                while let Some(event) = stream.next().await {
                    if let Err(e) = event {
                        tracing::warn!(error = %e.message(), "session with the local agent ended");
                        break;
                    }
                }
            });
            Ok::<_, Error>((client, first.session_id, first.node))
        })?;
        tracing::debug!(session = %session_id, node = %node, "session opened");
        Ok(Self {
            inner: Arc::new(Inner {
                rt,
                socket: opts.socket,
                token: opts.token.clone(),
                fabric: opts.fabric,
                session,
                session_id,
                node,
                data: Arc::new(DataPath::new(opts.token, opts.streams)),
                staging: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Name of the local node.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// This session's id, as `ocmctl allocs` shows it.
    pub fn session_id(&self) -> &str {
        &self.inner.session_id
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
        let req = pb::AllocRequest {
            session_id: self.inner.session_id.clone(),
            spec: Some(spec.to_wire(self.inner.fabric)),
        };
        let mut client = self.inner.session.clone();
        let wire = self.inner.rt.block_on(client.alloc(req))?.into_inner();
        let fabric = spec.fabric.unwrap_or(self.inner.fabric);
        // Should opening fail (no device memory, no mapping), dropping the
        // half-built handle frees what the cluster recorded.
        self.open(wire, fabric)
    }

    /// Attaches the persistent allocation called `name`, made by any
    /// process on any node. Dropping the handle detaches; the allocation
    /// stays until freed.
    ///
    /// # Errors
    /// [`Error::NotFound`], and fabric errors when this session's fabric
    /// cannot reach its extents.
    pub fn attach(&self, name: &str) -> Result<Allocation> {
        self.attach_ref(pb::AllocRef {
            id: 0,
            name: name.to_string(),
        })
    }

    /// Attaches the persistent allocation with this id.
    ///
    /// # Errors
    /// As [`Oncilla::attach`].
    pub fn attach_id(&self, id: u64) -> Result<Allocation> {
        self.attach_ref(pb::AllocRef {
            id,
            name: String::new(),
        })
    }

    fn attach_ref(&self, alloc: pb::AllocRef) -> Result<Allocation> {
        let req = pb::AttachRequest {
            session_id: self.inner.session_id.clone(),
            alloc: Some(alloc),
        };
        let mut client = self.inner.session.clone();
        let wire = self.inner.rt.block_on(client.attach(req))?.into_inner();
        self.open(wire, self.inner.fabric)
    }

    /// Wraps a wire allocation in a handle and maps the extents that this
    /// node holds, when the fabric says shared memory.
    fn open(&self, wire: pb::Allocation, fabric: Fabric) -> Result<Allocation> {
        let mut alloc = Allocation {
            ocm: self.clone(),
            desc: Arc::new(Descriptor::from_wire(wire)?),
            fabric,
            local: None,
            device: None,
            done: false,
        };
        if alloc.desc.kind == Kind::LocalGpu {
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
        let mut local = Vec::new();
        for e in &alloc.desc.extents {
            let chosen = oncilla_model::fabric::choose(
                &e.node,
                e.memory(),
                &self.inner.node,
                fabric,
                &self.inner.data.rdma_for(&e.node, &e.agent_addr),
            )
            .map_err(|err| Error::InvalidArgument(err.to_string()))?;
            if chosen == Fabric::Shm {
                local.push(e);
            }
        }
        if !local.is_empty() {
            let mapping = Mapping::open(
                &self.inner.socket,
                &self.inner.token,
                alloc.desc.id,
                &alloc.desc.key,
                &local,
            )?;
            alloc.local = Some(Arc::new(mapping));
        }
        Ok(alloc)
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
    /// - Otherwise (host memory, or GPU memory an agent holds) through a
    ///   local buffer, chunk by chunk.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for either range; fabric and GPU failures.
    pub fn copy(
        &self,
        dst: &Allocation,
        dst_offset: u64,
        src: &Allocation,
        src_offset: u64,
        len: u64,
    ) -> Result<()> {
        dst.desc.check_range(dst_offset, len)?;
        src.desc.check_range(src_offset, len)?;
        match (&src.device, &dst.device) {
            (Some(s), Some(d)) => return Ok(d.copy_from(dst_offset, s, src_offset, len)?),
            (None, Some(d)) => {
                if let Some(done) = self.inner.data.gpu_direct(DeviceTransfer {
                    desc: &src.desc,
                    local: src.local.as_deref(),
                    offset: src_offset,
                    fabric: src.fabric,
                    mem: d,
                    mem_offset: dst_offset,
                    len,
                    read: true,
                }) {
                    return done;
                }
                self.with_staging(d, |ring| {
                    pipeline::stream_in(&mut ring.upload(d, dst_offset), len, |c, buf| {
                        src.copy_out(src_offset + c.offset, buf)
                    })
                })?;
                return Ok(());
            }
            (Some(s), None) => {
                if let Some(done) = self.inner.data.gpu_direct(DeviceTransfer {
                    desc: &dst.desc,
                    local: dst.local.as_deref(),
                    offset: dst_offset,
                    fabric: dst.fabric,
                    mem: s,
                    mem_offset: src_offset,
                    len,
                    read: false,
                }) {
                    return done;
                }
                self.with_staging(s, |ring| {
                    pipeline::stream_out(&mut ring.download(s, src_offset), len, |c, bytes| {
                        dst.copy_in(dst_offset + c.offset, bytes)
                    })
                })?;
                return Ok(());
            }
            (None, None) => {}
        }
        let chunk = len.min(crate::fabric::tcp::CHUNK * 4);
        let mut buf = vec![
            0u8;
            usize::try_from(chunk)
                .map_err(|_| Error::Internal("chunk too large".into()))?
        ];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk);
            let part = &mut buf[..usize::try_from(n).unwrap_or(0)];
            src.copy_out(src_offset + done, part)?;
            dst.copy_in(dst_offset + done, part)?;
            done += n;
        }
        Ok(())
    }

    /// Runs `f` with the staging ring of `mem`'s device, made on first use
    /// (`ONCILLA_GPU_STAGING` bytes per buffer, default 8 MiB).
    fn with_staging<T>(
        &self,
        mem: &DeviceMem,
        f: impl FnOnce(&mut PinnedRing) -> Result<T>,
    ) -> Result<T> {
        let index = mem.gpu().index();
        // A panic inside `f` leaves the ring drained or dropped: still usable.
        let mut rings = self.inner.staging.lock().unwrap_or_else(|e| e.into_inner());
        let ring = match rings.entry(index) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let len = staging_len()?;
                v.insert(PinnedRing::new(mem.gpu(), STAGING_SLOTS, len)?)
            }
        };
        f(ring)
    }

    /// Starts every copy of `batch` in the background and returns at once;
    /// the copies run in parallel (nodes at once, each over several
    /// connections, pipelined), with no order among them. Wait for them
    /// with [`Pending::wait`] or poll with [`Pending::is_done`].
    pub fn submit(&self, batch: Batch) -> Pending {
        let data = Arc::clone(&self.inner.data);
        let task = self.inner.rt.spawn_blocking(move || {
            let mut ops = batch.ops;
            // Device memory of this process: copied here, the rest by the
            // data path, which reaches only cluster-held memory.
            let mut first_error = None;
            for op in ops.iter_mut() {
                let Some(mem) = &op.device else { continue };
                // DeviceMem checks bounds (its size is the allocation's).
                let moved = if op.write {
                    mem.write(op.offset, &op.buf)
                } else {
                    mem.read(op.offset, &mut op.buf)
                };
                if let Err(e) = moved {
                    first_error.get_or_insert(e.into());
                }
            }
            let outcome =
                data.run(
                    ops.iter_mut()
                        .filter(|op| op.device.is_none())
                        .map(|op| Transfer {
                            desc: &op.desc,
                            local: op.local.as_deref(),
                            fabric: op.fabric,
                            offset: op.offset,
                            buf: if op.write {
                                IoBuf::Write(&op.buf)
                            } else {
                                IoBuf::Read(&mut op.buf)
                            },
                        }),
                );
            let outcome = match first_error {
                Some(e) => Err(e),
                None => outcome,
            };
            let buffers = ops.into_iter().map(|op| op.buf).collect();
            (outcome, buffers)
        });
        Pending {
            ocm: self.clone(),
            task,
        }
    }

    fn free_id(&self, id: u64, force: bool) -> Result<()> {
        let req = pb::FreeRequest {
            alloc: Some(pb::AllocRef {
                id,
                name: String::new(),
            }),
            session_id: self.inner.session_id.clone(),
            force,
        };
        let mut client = self.inner.session.clone();
        self.inner.rt.block_on(client.free(req))?;
        Ok(())
    }

    fn detach_id(&self, id: u64) -> Result<()> {
        let req = pb::DetachRequest {
            session_id: self.inner.session_id.clone(),
            id,
        };
        let mut client = self.inner.session.clone();
        self.inner.rt.block_on(client.detach(req))?;
        Ok(())
    }
}

/// An allocation. Dropping it frees it, or, for a persistent (or named)
/// allocation, detaches this process from it; call [`Allocation::free`] to
/// free it and see the result.
pub struct Allocation {
    ocm: Oncilla,
    /// Shared with batches in flight, which keep it (and the mapping)
    /// alive until they end.
    desc: Arc<Descriptor>,
    /// The fabric preference this handle was opened with.
    fabric: Fabric,
    /// The extents on this node, mapped; copies to them are memcpy.
    local: Option<Arc<Mapping>>,
    /// A local GPU allocation's device memory, in this process.
    device: Option<Arc<DeviceMem>>,
    /// Freed or detached already.
    done: bool,
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
        self.desc
            .extents
            .iter()
            .any(|e| e.node != self.ocm.inner.node)
    }

    /// The name, for a named allocation.
    pub fn name(&self) -> Option<&str> {
        self.desc.name.as_deref()
    }

    /// The fabric this process uses for each extent, in extent order.
    pub fn fabrics(&self) -> Vec<Fabric> {
        self.desc
            .extents
            .iter()
            .map(|e| {
                oncilla_model::fabric::choose(
                    &e.node,
                    e.memory(),
                    self.ocm.node(),
                    self.fabric,
                    &self.ocm.inner.data.rdma_for(&e.node, &e.agent_addr),
                )
                .unwrap_or(Fabric::Tcp)
            })
            .collect()
    }

    /// Writes `src` at `offset`; returns once the bytes are visible to
    /// every later reader (this node's extents by memcpy, the others over
    /// the network, all nodes in parallel).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`]; fabric failures; [`Error::NotFound`] once the
    /// allocation was freed (by anyone).
    pub fn copy_in(&self, offset: u64, src: &[u8]) -> Result<()> {
        if let Some(mem) = &self.device {
            // Bounds checked there: the device memory is the allocation's size.
            return Ok(mem.write(offset, src)?);
        }
        let local = self.local.as_deref();
        let fabric = self.fabric;
        self.ocm
            .inner
            .data
            .write(&self.desc, offset, src, local, fabric)
    }

    /// Reads `dst.len()` bytes from `offset`.
    ///
    /// # Errors
    /// As [`Allocation::copy_in`].
    pub fn copy_out(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        if let Some(mem) = &self.device {
            // Bounds checked there: the device memory is the allocation's size.
            return Ok(mem.read(offset, dst)?);
        }
        let local = self.local.as_deref();
        let fabric = self.fabric;
        self.ocm
            .inner
            .data
            .read(&self.desc, offset, dst, local, fabric)
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
        let len = to_usize(self.desc.size)?;
        // SAFETY: the mapping is valid for `size` contiguous bytes (checked
        // by `contiguous`) for as long as `self` lives, and `&mut self`
        // makes this the only reference into it from this process for the
        // slice's lifetime.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
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

    /// A local GPU allocation's device memory (for kernels); `None` for
    /// every other kind.
    pub fn device_mem(&self) -> Option<&DeviceMem> {
        self.device.as_deref()
    }

    fn release(mut self, force: bool) -> Result<()> {
        self.done = true;
        self.local = None;
        self.device = None;
        self.ocm.free_id(self.desc.id, force)
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.local = None;
        self.device = None;
        if self.done {
            return;
        }
        let outcome = if self.desc.owner.is_none() {
            self.ocm.detach_id(self.desc.id)
        } else {
            self.ocm.free_id(self.desc.id, false)
        };
        match outcome {
            // Freed by someone else already: nothing left to do.
            Ok(()) | Err(Error::NotFound(_)) => {}
            Err(e) => {
                tracing::warn!(id = self.desc.id, error = %e, "cannot release allocation on drop")
            }
        }
    }
}

/// Copies to run together in the background ([`Oncilla::submit`]). Each
/// owns its buffer: a write's source, or the buffer a read fills; all come
/// back from [`Pending::wait`] in the order they were added.
#[derive(Default)]
pub struct Batch {
    ops: Vec<BatchOp>,
}

struct BatchOp {
    desc: Arc<Descriptor>,
    local: Option<Arc<Mapping>>,
    device: Option<Arc<DeviceMem>>,
    fabric: Fabric,
    offset: u64,
    write: bool,
    buf: Vec<u8>,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a write of `data` at `offset` of `alloc`.
    pub fn write(&mut self, alloc: &Allocation, offset: u64, data: Vec<u8>) -> &mut Self {
        self.push(alloc, offset, true, data)
    }

    /// Adds a read of `buf.len()` bytes at `offset` of `alloc` into `buf`.
    pub fn read(&mut self, alloc: &Allocation, offset: u64, buf: Vec<u8>) -> &mut Self {
        self.push(alloc, offset, false, buf)
    }

    fn push(&mut self, alloc: &Allocation, offset: u64, write: bool, buf: Vec<u8>) -> &mut Self {
        self.ops.push(BatchOp {
            desc: Arc::clone(&alloc.desc),
            local: alloc.local.clone(),
            device: alloc.device.clone(),
            fabric: alloc.fabric,
            offset,
            write,
            buf,
        });
        self
    }

    /// Copies added so far.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// A submitted [`Batch`]. Dropping it does not cancel the copies; they run
/// to their end and their buffers are dropped.
pub struct Pending {
    ocm: Oncilla,
    task: tokio::task::JoinHandle<(Result<()>, Vec<Vec<u8>>)>,
}

impl Pending {
    /// True once every copy has ended (then [`Pending::wait`] returns at once).
    pub fn is_done(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for every copy; returns the buffers in the order they were
    /// added, reads filled.
    ///
    /// # Errors
    /// The first failure of any copy, as the blocking copies report them
    /// (the other copies still ran to their end).
    pub fn wait(self) -> Result<Vec<Vec<u8>>> {
        let (outcome, buffers) = self
            .ocm
            .inner
            .rt
            .block_on(self.task)
            .map_err(|e| Error::Internal(format!("batch task failed: {e}")))?;
        outcome.map(|()| buffers)
    }
}

async fn uds_channel(
    path: &Path,
) -> std::result::Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI is required by the API and ignored: the connector dials the socket.
    Endpoint::from_static("http://oncillad.local")
        .connect_timeout(oncilla_proto::client::CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

/// `ONCILLA_GPU_STAGING`: bytes per staging buffer (64 KiB to 1 GiB).
fn staging_len() -> Result<usize> {
    match std::env::var("ONCILLA_GPU_STAGING") {
        Ok(v) => oncilla_model::size::parse_size(&v)
            .ok()
            .filter(|n| (64 << 10..=1 << 30).contains(n))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "ONCILLA_GPU_STAGING: {v:?} is not a size from 64KiB to 1GiB"
                ))
            }),
        Err(_) => Ok(STAGING_DEFAULT),
    }
}

fn to_usize(v: u64) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::Internal("offset beyond the address space".into()))
}

fn program_name() -> String {
    std::env::args()
        .next()
        .as_deref()
        .map(Path::new)
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
