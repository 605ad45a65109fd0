//! The application's handle on the cluster: a session with the local agent
//! and the allocations made through it.
//!
//! Control calls go to the local agent over its Unix socket; copies go
//! straight to the nodes that hold the bytes ([`DataPath`]). The session
//! stream stays open for the life of the [`Oncilla`] value: when the process
//! exits, the agent sees it close and the cluster frees the session's
//! allocations.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
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
use crate::fabric::DataPath;

/// How to reach the local agent.
#[derive(Debug, Clone)]
pub struct Options {
    /// The agent's Unix socket.
    pub socket: PathBuf,
    pub token: Token,
}

impl Options {
    /// `ONCILLA_SOCKET` (default `/run/oncilla/agent.sock`) and the token
    /// from `ONCILLA_TOKEN` / `ONCILLA_TOKEN_FILE`.
    ///
    /// # Errors
    /// [`Error::Token`] when no token is configured.
    pub fn from_env() -> Result<Self> {
        let socket = std::env::var_os("ONCILLA_SOCKET").map_or_else(
            || PathBuf::from(oncilla_proto::DEFAULT_SOCKET),
            PathBuf::from,
        );
        Ok(Self {
            socket,
            token: Token::from_env()?,
        })
    }
}

/// What to allocate.
#[derive(Debug, Clone)]
pub struct AllocSpec {
    pub size: u64,
    pub kind: Kind,
    /// Nodes to split the allocation over equally; empty lets the master choose.
    pub nodes: Vec<String>,
    /// Outlive this session until freed explicitly.
    pub persistent: bool,
}

impl AllocSpec {
    /// `size` bytes of `kind`, placed by the master, owned by the session.
    pub fn new(size: u64, kind: Kind) -> Self {
        Self {
            size,
            kind,
            nodes: Vec::new(),
            persistent: false,
        }
    }

    /// Split over these nodes.
    #[must_use]
    pub fn on_nodes<S: Into<String>>(mut self, nodes: impl IntoIterator<Item = S>) -> Self {
        self.nodes = nodes.into_iter().map(Into::into).collect();
        self
    }

    /// Keep the allocation after the session ends.
    #[must_use]
    pub fn persistent(mut self) -> Self {
        self.persistent = true;
        self
    }
}

struct Inner {
    rt: tokio::runtime::Runtime,
    socket: PathBuf,
    token: Token,
    session: SessionClient,
    session_id: String,
    node: String,
    data: DataPath,
}

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
                session,
                session_id,
                node,
                data: DataPath::new(opts.token),
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
    /// [`Error::InvalidArgument`], [`Error::NodeDown`], [`Error::Unavailable`]
    /// when the master cannot be reached.
    pub fn alloc_with(&self, spec: &AllocSpec) -> Result<Allocation> {
        let req = pb::AllocRequest {
            session_id: self.inner.session_id.clone(),
            size: spec.size,
            kind: spec.kind.to_wire() as i32,
            nodes: spec.nodes.clone(),
            persistent: spec.persistent,
        };
        let mut client = self.inner.session.clone();
        let wire = self.inner.rt.block_on(client.alloc(req))?.into_inner();
        let mut alloc = Allocation {
            ocm: self.clone(),
            desc: Descriptor::from_wire(wire)?,
            local: None,
            freed: false,
        };
        if alloc.desc.kind == Kind::LocalHost {
            // Local memory is mapped straight into this process.
            alloc.local = Some(Mapping::open(
                &self.inner.socket,
                &self.inner.token,
                alloc.desc.id,
                &alloc.desc.key,
                &alloc.desc.extents,
            )?);
        }
        Ok(alloc)
    }

    /// Copies `len` bytes from one allocation to another through a local
    /// buffer, chunk by chunk.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for either range; fabric failures.
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

    fn free_id(&self, id: u64) -> Result<()> {
        let req = pb::FreeRequest {
            id,
            session_id: self.inner.session_id.clone(),
        };
        let mut client = self.inner.session.clone();
        self.inner.rt.block_on(client.free(req))?;
        Ok(())
    }
}

/// An allocation. Dropping it frees it (unless it is persistent); call
/// [`Allocation::free`] to see the result.
pub struct Allocation {
    ocm: Oncilla,
    desc: Descriptor,
    /// The mapping of a local allocation; copies to it are memcpy.
    local: Option<Mapping>,
    freed: bool,
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

    /// Writes `src` at `offset`; returns once the bytes are visible to
    /// every later reader.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`]; fabric failures.
    pub fn copy_in(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.desc.check_range(offset, src.len() as u64)?;
        match &self.local {
            Some(map) => {
                // SAFETY: the range was checked against the allocation, which
                // the mapping covers whole, and the mapping lives as long as
                // `self`; `src` is caller memory, so the two cannot overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.as_ptr(),
                        map.as_ptr().add(to_usize(offset)?),
                        src.len(),
                    )
                };
                Ok(())
            }
            None => self.ocm.inner.data.write(&self.desc, offset, src),
        }
    }

    /// Reads `dst.len()` bytes from `offset`.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`]; fabric failures.
    pub fn copy_out(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.desc.check_range(offset, dst.len() as u64)?;
        match &self.local {
            Some(map) => {
                // SAFETY: as in `copy_in`, with the roles of the buffers swapped.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        map.as_ptr().add(to_usize(offset)?),
                        dst.as_mut_ptr(),
                        dst.len(),
                    )
                };
                Ok(())
            }
            None => self.ocm.inner.data.read(&self.desc, offset, dst),
        }
    }

    /// The bytes of a local allocation as plain memory in this process
    /// (shared with the agent's pool: no copy is involved).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an allocation that is not local; use
    /// [`Allocation::copy_in`] and [`Allocation::copy_out`] for those.
    pub fn localbuf(&mut self) -> Result<&mut [u8]> {
        let id = self.desc.id;
        let map = self.local.as_ref().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "allocation {id} is not local; use copy_in/copy_out"
            ))
        })?;
        // SAFETY: the mapping is valid for `len` bytes for as long as `self`
        // lives, and `&mut self` makes this the only reference into it from
        // this process for the slice's lifetime.
        Ok(unsafe { std::slice::from_raw_parts_mut(map.as_ptr(), map.len()) })
    }

    /// Frees the allocation now.
    ///
    /// # Errors
    /// [`Error::NotFound`] when someone already freed it; control-path failures.
    pub fn free(mut self) -> Result<()> {
        self.freed = true;
        self.local = None;
        self.ocm.free_id(self.desc.id)
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.local = None;
        if self.freed || self.desc.owner.is_none() {
            return;
        }
        if let Err(e) = self.ocm.free_id(self.desc.id) {
            tracing::warn!(id = self.desc.id, error = %e, "cannot free allocation on drop");
        }
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
