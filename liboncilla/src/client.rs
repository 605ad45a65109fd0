//! The session's machinery below the public API: the library's runtime,
//! the control channel to the local agent over its Unix socket (opening
//! the session stream, alloc, attach, free, detach as wire calls), and what
//! every copy of the session shares (the data path, the staging rings).
//!
//! Allocations, device copies and batches hold it; it knows none of them,
//! and it never moves a byte of an allocation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use oncilla_model::alloc::{AllocRef, Allocation as Record, Invalid, MAX_BATCH};
use oncilla_model::cluster::FreeBatch;
use oncilla_net::credential::{AttachCredential, Credential, Renewable};
use oncilla_net::tls::ClientTls;
use oncilla_proto::calls::{self, CallError};
use oncilla_proto::client::CALL_TIMEOUT;
use tonic::service::interceptor::InterceptedService;

use crate::error::{Error, Result};
use crate::fabric::DataPath;
use crate::options::Options;
use crate::runtime::OwnRuntime;
use crate::spec::{AllocSpec, Fabric};
use crate::staging::Staging;

/// One session with the local agent. Shared (`Arc`) by the [`crate::Oncilla`]
/// handles, the allocations and the batches of the session, so the session
/// lasts as long as any of them.
pub(crate) struct Client {
    pub(crate) rt: OwnRuntime,
    pub(crate) socket: PathBuf,
    /// The session's credential (from the agent at open): what its copies
    /// present to agents; the cluster token is never needed after open.
    pub(crate) credential: Renewable,
    /// The session's fabric preference (`ONCILLA_FABRIC`).
    pub(crate) fabric: Fabric,
    session: calls::Session,
    pub(crate) session_id: String,
    pub(crate) node: String,
    /// Shared with batches running in the background.
    pub(crate) data: Arc<DataPath>,
    /// Page-locked staging rings for device copies, one per GPU.
    pub(crate) staging: Staging,
    /// The task that holds the session's stream open (its end is the
    /// session's end), until [`Client::close`].
    holder: Mutex<Option<tokio::task::AbortHandle>>,
    closed: AtomicBool,
    /// Open handles per attached allocation: the master keeps one
    /// attachment per session, so the session detaches when the last of
    /// its handles goes, not the first. Held across the attach and detach
    /// calls, so one never overtakes the other.
    attached: Mutex<HashMap<u64, usize>>,
    /// Turns of the async API's calls (`asynchronous.rs`), shared by every
    /// handle of the session.
    pub(crate) async_calls: Arc<tokio::sync::Semaphore>,
}

impl Client {
    /// Connects to the agent at `opts.socket` and opens a session.
    ///
    /// # Errors
    /// [`Error::AgentUnreachable`], [`Error::PermissionDenied`] for a wrong token
    /// (an application without one is admitted by the socket's permissions).
    pub(crate) fn connect(opts: Options) -> Result<Self> {
        let rt = OwnRuntime::new(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("oncilla-client")
                .enable_all()
                .build()
                .map_err(|e| Error::Internal(format!("cannot start runtime: {e}")))?,
        );
        let socket = opts.socket.clone();
        let unreachable = |reason: String| Error::AgentUnreachable {
            path: socket.display().to_string(),
            reason,
        };
        let (session, session_id, node, credential, tls, holder) = rt.block_on(async {
            let channel = oncilla_proto::client::unix(&opts.socket)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let present = opts
                .token
                .as_ref()
                .map_or_else(AttachCredential::none, |t| {
                    AttachCredential::new(&Credential::member(t))
                });
            let client = calls::Session::new(InterceptedService::new(channel.clone(), present));
            let mut stream = client.open(std::process::id(), program_name()).await?;
            let first = tokio::time::timeout(CALL_TIMEOUT, stream.next())
                .await
                .map_err(|_| unreachable("no answer to session open".into()))?
                .ok_or_else(|| unreachable("session closed at once".into()))?
                .map_err(Error::from)?;
            let credential = Credential::parse_session(&first.credential).map_err(|e| {
                Error::Internal(format!(
                    "the agent gave no usable session credential ({e}): is it older than this library?"
                ))
            })?;
            let credential = Renewable::new(credential);
            // Hold the stream for the life of the runtime: its end is how
            // the agent learns that this process is gone. Later events
            // bring fresh credentials (each good for a while only).
            let renewed = credential.clone();
            let holder = tokio::spawn(async move {
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(e) if !e.credential.is_empty() => {
                            if let Err(why) = renewed.renew(&e.credential) {
                                tracing::warn!(why, "the agent sent an unusable credential");
                            }
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e.message(), "session with the local agent ended");
                            break;
                        }
                    }
                }
            });
            // Every later call acts as this session, and only as it.
            let session = calls::Session::new(InterceptedService::new(
                channel,
                AttachCredential::renewable(&credential),
            ));
            // The cluster's TCP listeners speak TLS when the agent hands
            // over the cluster CA.
            let tls = if first.tls_ca.is_empty() {
                None
            } else {
                Some(ClientTls::from_pem(&first.tls_ca, "the agent's cluster CA").map_err(
                    |e| Error::Internal(format!("the agent's TLS settings are unusable: {e}")),
                )?)
            };
            Ok::<_, Error>((
                session,
                first.session_id,
                first.node,
                credential,
                tls,
                holder.abort_handle(),
            ))
        })?;
        tracing::debug!(session = %session_id, node = %node, "session opened");
        Ok(Self {
            rt,
            socket: opts.socket,
            credential: credential.clone(),
            fabric: opts.fabric,
            session,
            session_id,
            node,
            data: Arc::new(DataPath::new(credential, tls, opts.streams, &opts.rdma)),
            staging: Staging::new(opts.gpu_staging),
            holder: Mutex::new(Some(holder)),
            closed: AtomicBool::new(false),
            attached: Mutex::default(),
            async_calls: Arc::new(tokio::sync::Semaphore::new(
                crate::asynchronous::MAX_CALLS_IN_FLIGHT,
            )),
        })
    }

    /// Ends the session now, as the process's exit would: its stream is
    /// dropped, the agent ends the session (what it owns is freed, its
    /// attachments end), and later calls are refused. Closing again does
    /// nothing.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let holder = self
            .holder
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(h) = holder {
            h.abort();
            tracing::debug!(session = %self.session_id, "session closed");
        }
    }

    /// Whether [`Client::close`] ended the session.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Runs a session call; while the master is in its recovery window
    /// (just started, agents re-registering), waits it out (bounded, one
    /// log line saying why) instead of failing.
    fn call<'a, T, Fut>(&'a self, f: impl Fn(&'a calls::Session) -> Fut + Sync) -> Result<T>
    where
        T: Send,
        Fut: std::future::Future<Output = std::result::Result<T, CallError>> + Send,
    {
        if self.is_closed() {
            return Err(Error::InvalidArgument(format!(
                "session {} was closed; connect again",
                self.session_id
            )));
        }
        let waiting = |left: std::time::Duration, why| match why {
            oncilla_proto::client::Waiting::Recovery => tracing::info!(
                wait_ms = left.as_millis(),
                "the master has just started and waits for agents to re-register: waiting"
            ),
            oncilla_proto::client::Waiting::Election => {
                tracing::info!("no master leads yet (an election is under way): waiting")
            }
        };
        Ok(self.rt.block_on(oncilla_proto::client::through_recovery(
            || f(&self.session),
            waiting,
        ))?)
    }

    /// Asks the master (through the agent) for an allocation as `spec` says.
    pub(crate) fn alloc(&self, spec: &AllocSpec) -> Result<Record> {
        let spec = spec.to_model(self.fabric)?;
        if !spec.outlives_session() {
            return self.call(|s| s.alloc(&self.session_id, &spec));
        }
        // The master attaches the session that makes a persistent one.
        self.counted(|| self.call(|s| s.alloc(&self.session_id, &spec)))
    }

    /// Asks for `count` allocations as `spec` says, made together (all or
    /// none; the spec must be neither named nor persistent).
    pub(crate) fn alloc_many(&self, spec: &AllocSpec, count: usize) -> Result<Vec<Record>> {
        let n = u32::try_from(count)
            .ok()
            .filter(|n| (1..=MAX_BATCH).contains(n))
            .ok_or_else(|| Error::InvalidArgument(Invalid::BatchCount(count as u64).to_string()))?;
        let spec = spec.to_model(self.fabric)?;
        if spec.persistent || !spec.name.is_empty() {
            return Err(Error::InvalidArgument(Invalid::BatchPersistent.to_string()));
        }
        self.call(|s| s.alloc_many(&self.session_id, &spec, n))
    }

    /// Attaches a persistent allocation by id or name, for one more
    /// handle.
    pub(crate) fn attach(&self, alloc: AllocRef) -> Result<Record> {
        self.counted(|| self.call(|s| s.attach(&self.session_id, &alloc)))
    }

    /// Runs `attach`, a call that attaches this session to the allocation
    /// it returns, and counts one more handle of it: under the count's
    /// lock, so no detach of the same allocation overtakes it.
    fn counted(&self, attach: impl FnOnce() -> Result<Record>) -> Result<Record> {
        let mut attached = self.attached.lock().unwrap_or_else(PoisonError::into_inner);
        let record = attach()?;
        *attached.entry(record.id).or_default() += 1;
        Ok(record)
    }

    /// Allocation `id` as the master describes it now.
    pub(crate) fn lookup(&self, id: u64) -> Result<Record> {
        self.call(|s| s.lookup(&self.session_id, id))
    }

    pub(crate) fn free_id(&self, id: u64, force: bool) -> Result<()> {
        let alloc = AllocRef::Id(id);
        self.call(|s| s.free(&self.session_id, &alloc, force))
    }

    /// Frees `ids` together, all or none (checked as the agent checks
    /// them before anything is asked).
    pub(crate) fn free_many(&self, ids: &[u64]) -> Result<()> {
        let batch =
            FreeBatch::new(ids.to_vec()).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.call(|s| s.free_many(&self.session_id, batch.ids()))
    }

    /// One handle of attached allocation `id` is done: the session
    /// detaches once it was the last.
    pub(crate) fn detach_id(&self, id: u64) -> Result<()> {
        let mut attached = self.attached.lock().unwrap_or_else(PoisonError::into_inner);
        match attached.get_mut(&id) {
            Some(n) if *n > 1 => {
                *n -= 1;
                return Ok(());
            }
            Some(_) => {
                attached.remove(&id);
            }
            // Not counted (nothing here attached it): as asked.
            None => {}
        }
        self.call(|s| s.detach(&self.session_id, id))
    }
}

/// This executable's file name, as the agent accepts it.
fn program_name() -> String {
    std::env::args_os()
        .next()
        .as_deref()
        .map(Path::new)
        .and_then(Path::file_name)
        .map(|n| oncilla_model::alloc::program_name(&n.to_string_lossy()))
        .unwrap_or_default()
}
