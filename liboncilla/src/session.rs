//! The application's session with the cluster: the library's runtime, the
//! control channel to the local agent over its Unix socket, and the calls
//! that make, attach, free and detach allocations.
//!
//! The session stream stays open for the life of the [`Oncilla`] value:
//! when the process exits, the agent sees it close and the cluster frees
//! the session's allocations. Copies never pass through here: they go
//! straight to the nodes that hold the bytes (`fabric`).

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

use crate::allocation::Allocation;
use crate::descriptor::Kind;
use crate::device::Staging;
use crate::error::{Error, Result};
use crate::fabric::DataPath;
use crate::options::Options;
use crate::spec::{AllocSpec, Fabric};

pub(crate) struct Inner {
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) socket: PathBuf,
    pub(crate) token: Token,
    pub(crate) fabric: Fabric,
    session: SessionClient,
    session_id: String,
    pub(crate) node: String,
    /// Shared with batches running in the background.
    pub(crate) data: Arc<DataPath>,
    /// Page-locked staging rings for device copies, one per GPU.
    pub(crate) staging: Staging,
}

/// A session with the cluster. Cheap to clone; thread-safe.
#[derive(Clone)]
pub struct Oncilla {
    pub(crate) inner: Arc<Inner>,
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
                data: Arc::new(DataPath::new(opts.token, opts.streams, &opts.rdma)),
                staging: Staging::new(opts.gpu_staging),
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
        Allocation::open(self, wire, fabric)
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
        Allocation::open(self, wire, self.inner.fabric)
    }

    pub(crate) fn free_id(&self, id: u64, force: bool) -> Result<()> {
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

    pub(crate) fn detach_id(&self, id: u64) -> Result<()> {
        let req = pb::DetachRequest {
            session_id: self.inner.session_id.clone(),
            id,
        };
        let mut client = self.inner.session.clone();
        self.inner.rt.block_on(client.detach(req))?;
        Ok(())
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

fn program_name() -> String {
    std::env::args()
        .next()
        .as_deref()
        .map(Path::new)
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
