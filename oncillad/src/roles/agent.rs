//! The agent role: the node's pool, what it offers (GPUs, RDMA ports),
//! the TCP data server and the same-node map server on threads of their
//! own, the membership loop that keeps the node known to the master, and
//! the `Agent` service (for the master and peers) and `Session` service
//! (for local applications, on a Unix socket).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use oncilla_model::size::HumanBytes;
use oncilla_net::credential::{Authenticate, Keyring};
use oncilla_net::tls::ClientTls;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Server;

use crate::config::Config;
use crate::{agent, fabric, grpc, hca, listen, metrics, pool, DaemonError};

/// A started agent role.
pub(crate) struct Started {
    /// The `Agent` service, for the shared gRPC port.
    pub service: grpc::agent::Served,
    /// The session socket, removed (with its map socket) at shutdown.
    pub socket: PathBuf,
    /// The session socket's server; ends once `stop` turns.
    pub sessions: JoinHandle<Result<(), tonic::transport::Error>>,
    /// The membership loop: it ends only when the master refuses the
    /// node for good (then the daemon stops).
    pub membership: JoinHandle<Result<(), agent::membership::Refused>>,
    /// Says to the master that this node leaves, at a clean stop.
    pub leave: Leave,
}

/// What a stopping agent tells the master: its pool goes with it.
pub(crate) struct Leave {
    master: grpc::links::MasterLink,
    name: String,
    incarnation: u64,
}

/// How long a stopping agent waits for the master to hear it leave.
const LEAVE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

impl Leave {
    /// Tells the master, within [`LEAVE_DEADLINE`]; a master that does not
    /// answer learns it from the missed heartbeats, as from a crash.
    pub async fn tell(self) {
        match tokio::time::timeout(
            LEAVE_DEADLINE,
            self.master.leave(&self.name, self.incarnation),
        )
        .await
        {
            Ok(Ok(lost)) => {
                tracing::info!(node = %self.name, lost_allocations = lost, "left the cluster");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "could not tell the master this node leaves"),
            Err(_) => tracing::warn!(
                "the master did not answer this node's leaving within {} s",
                LEAVE_DEADLINE.as_secs()
            ),
        }
    }
}

/// Starts the agent role, where the configuration has one, on `grpc_addr`
/// (the shared gRPC port, as peers reach it): `ready` turns true once the
/// master knows the node; the session socket's server stops when `stop`
/// turns.
///
/// # Errors
/// The pool cannot be made, or a listener cannot be bound.
pub(crate) fn start(
    config: &Config,
    grpc_addr: std::net::SocketAddr,
    trust: Option<ClientTls>,
    metrics: &metrics::Metrics,
    ready: watch::Sender<bool>,
    stop: watch::Receiver<bool>,
) -> Result<Option<Started>, DaemonError> {
    let (Some(agent_cfg), Some(node_keys)) = (&config.agent, &config.node_keys) else {
        return Ok(None);
    };
    let keys = Keyring::Node(Arc::clone(node_keys));
    let started = Instant::now();
    let pool = pool::Pool::new(pool::PoolSpec::new(
        agent_cfg.capacity,
        agent_cfg.huge_pages,
    ))?;
    tracing::info!(
        capacity = %HumanBytes(pool.capacity()),
        slabs = pool.slabs().len(),
        page = %HumanBytes(pool.page_size()),
        huge_pages = pool.huge_pages(),
        elapsed_ms = started.elapsed().as_millis(),
        "pool ready: pre-faulted and locked"
    );

    let data = std::net::TcpListener::bind(agent_cfg.data_listen)
        .map_err(|source| crate::bind_error("data", agent_cfg.data_listen, source))?;
    let data_addr = data
        .local_addr()
        .map_err(|source| crate::bind_error("data", agent_cfg.data_listen, source))?;
    // A deeper accept queue than std's 128: a burst of connections (a
    // flood's churn among them) must not drop a client's SYN into a 1 s
    // retransmit.
    nix::sys::socket::listen(&data, nix::sys::socket::Backlog::MAXCONN)
        .map_err(|e| crate::bind_error("data", data_addr, e.into()))?;
    let (gpu_devices, gpu_note) = gpus();
    let rdma = Arc::new(hca::Rdma::start(&agent_cfg.rdma_devices, &pool));
    let mut fabrics = vec!["tcp".to_string(), "shm".to_string()];
    if rdma.available() {
        fabrics.push("verbs".into());
    }
    let (rdma_ports, rdma_note) = rdma.report();
    let (gpu_rdma, gpu_rdma_note) = rdma.probe_gpu(gpu_devices.first().map(|g| g.index));
    let node = oncilla_model::node::NodeInfo {
        name: config.name.clone(),
        zone: agent_cfg.zone.clone(),
        agent_addr: config.advertised(grpc_addr),
        data_addr: config.advertised(data_addr),
        capacity: pool.capacity(),
        fabrics,
        page_size: pool.page_size(),
        pool_note: pool.note().unwrap_or_default().to_string(),
        rdma: rdma_ports,
        rdma_note,
        gpu_devices,
        gpu_note,
        gpu_rdma,
        gpu_rdma_note,
    };
    let agent = Arc::new(agent::Agent::new(
        node,
        Arc::new(pool),
        rdma,
        agent_cfg.credential_lifetime,
    ));
    metrics.watch_agent(&agent);
    tracing::info!(
        incarnation = format!("{:016x}", agent.incarnation()),
        "agent starting with an empty pool: allocations held by an earlier run of this node are gone"
    );
    let held = agent.held();
    let admission = fabric::Admission {
        keys: keys.clone(),
        ended: agent.ended_here(),
    };
    let data_admission = admission.clone();
    let data_tls = config.tls.as_ref().map(|t| Arc::clone(t.serve.data()));
    let pulls = fabric::pull::Pulls {
        peers: agent.peers(),
        tls: trust.clone(),
        pace: fabric::pace::Pace::new(Some(agent_cfg.pull_rate)),
        mint: Some(Arc::clone(node_keys)),
    };
    let replicas = fabric::replicate::Replicas {
        peers: agent.peers(),
        tls: trust.clone(),
        keys: Arc::clone(node_keys),
    };

    let data_replicas = replicas.clone();
    std::thread::Builder::new()
        .name("oncilla-data-accept".into())
        .spawn({
            let transfers = Arc::clone(&metrics.data);
            let rings = Arc::new(fabric::device::DeviceRings::new());
            move || {
                fabric::tcp::serve(
                    data,
                    held,
                    data_admission,
                    data_tls,
                    (pulls, data_replicas),
                    rings,
                    transfers,
                )
            }
        })
        .map_err(|source| crate::bind_error("data", data_addr, source))?;

    let map_path = oncilla_net::map_socket(&agent_cfg.socket);
    let map_listener = bind_unix(&map_path)?
        .into_std()
        .map_err(|e| DaemonError::Socket {
            path: map_path.display().to_string(),
            reason: e.to_string(),
        })?;
    map_listener
        .set_nonblocking(false)
        .map_err(|e| DaemonError::Socket {
            path: map_path.display().to_string(),
            reason: e.to_string(),
        })?;
    let (held, leases) = (agent.held(), agent.leases());
    let transfers = Arc::clone(&metrics.data);
    std::thread::Builder::new()
        .name("oncilla-map".into())
        .spawn(move || fabric::shm::serve(map_listener, held, leases, admission, transfers))
        .map_err(|source| crate::bind_error("map", data_addr, source))?;

    let master =
        grpc::links::MasterLink::new(&agent_cfg.join, node_keys.credential(), trust.as_ref())?;
    let membership = tokio::spawn(agent::membership::run(
        Arc::clone(&agent),
        master.clone(),
        ready,
    ));
    let leave = Leave {
        master: master.clone(),
        name: config.name.clone(),
        incarnation: agent.incarnation(),
    };
    if agent.rdma().available() {
        tokio::spawn(watch_rdma_ports(Arc::clone(&agent)));
    }
    let service = grpc::agent::AgentService::new(Arc::clone(&agent), replicas.clone())
        .server(Authenticate::new(keys.clone()));
    let listener = bind_unix(&agent_cfg.socket)?;
    let session =
        grpc::session::SessionService::new(agent, master, Arc::clone(node_keys), trust.as_ref())
            .server(Authenticate::local(keys));
    let mut rx = stop;
    let sessions = tokio::spawn(
        crate::limited(Server::builder())
            .add_service(session)
            .serve_with_incoming_shutdown(listen::incoming::Incoming::new(listener), async move {
                let _ = rx.changed().await;
            }),
    );
    tracing::info!(node = %config.name, data = %data_addr, socket = %agent_cfg.socket.display(), join = %agent_cfg.join.join(","), "agent role ready");
    Ok(Some(Started {
        service,
        socket: agent_cfg.socket.clone(),
        sessions,
        membership,
        leave,
    }))
}

/// The node's GPUs as the CUDA driver reports them, and why there are
/// none where there are none.
fn gpus() -> (Vec<oncilla_model::node::GpuDevice>, String) {
    match oncilla_cuda::gpus() {
        Ok(list) => {
            for g in &list {
                tracing::info!(index = g.index, name = %g.name, total = g.total, free = g.free, "GPU");
            }
            let note = if list.is_empty() {
                "the CUDA driver reports no device".to_string()
            } else {
                String::new()
            };
            let devices = list
                .into_iter()
                .map(|g| oncilla_model::node::GpuDevice {
                    index: g.index,
                    name: g.name,
                    total: g.total,
                    free: g.free,
                })
                .collect();
            (devices, note)
        }
        Err(e) => {
            tracing::info!("{e}; GPU kinds are refused on this node");
            let note = e.to_string();
            (
                Vec::new(),
                note.strip_prefix("no GPU: ").unwrap_or(&note).to_string(),
            )
        }
    }
}

/// How often the agent looks whether its RDMA devices are still there.
const RDMA_SWEEP: std::time::Duration = std::time::Duration::from_secs(1);

/// Lets go of RDMA ports whose devices went away, within [`RDMA_SWEEP`]
/// (a provider such as rxe cannot remove a device until we do).
async fn watch_rdma_ports(agent: Arc<agent::Agent>) {
    let mut every = tokio::time::interval(RDMA_SWEEP);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let a = Arc::clone(&agent);
        if tokio::task::spawn_blocking(move || a.sweep_rdma())
            .await
            .is_err()
        {
            tracing::error!(
                "the RDMA port sweep panicked; ports that go away are no longer noticed"
            );
            return;
        }
    }
}

/// Binds the session socket: owner and group only. What is at `path`
/// already is replaced only when it is a socket nothing answers on (a
/// stale one); a live agent's socket, a regular file, a directory, a
/// symbolic link or anything else is left alone and refused.
fn bind_unix(path: &Path) -> Result<UnixListener, DaemonError> {
    let err = |reason: String| DaemonError::Socket {
        path: path.display().to_string(),
        reason,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| {
            err(format!(
                "cannot create {}: {e}; pass --socket with a writable path",
                dir.display()
            ))
        })?;
    }
    // The entry itself, not what a link points at.
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(format!("cannot inspect it: {e}"))),
        Ok(meta) => {
            use std::os::unix::fs::FileTypeExt;
            let t = meta.file_type();
            let what = if t.is_socket() {
                None
            } else if t.is_symlink() {
                Some("a symbolic link")
            } else if t.is_dir() {
                Some("a directory")
            } else if t.is_file() {
                Some("a regular file")
            } else {
                Some("a device or FIFO")
            };
            if let Some(what) = what {
                return Err(err(format!(
                    "it is {what}, not a socket; refusing to replace it: remove it or pass --socket with another path"
                )));
            }
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(err(format!(
                    "another agent is listening on {}",
                    path.display()
                )));
            }
            std::fs::remove_file(path)
                .map_err(|e| err(format!("cannot remove stale socket: {e}")))?;
        }
    }
    let listener = UnixListener::bind(path).map_err(|e| err(e.to_string()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| err(format!("cannot restrict permissions: {e}")))?;
    Ok(listener)
}
