//! The Oncilla node daemon as a library: `oncillad`'s binary is one call to
//! [`main_with`], and `ocmctl demo` starts real daemon processes by running
//! the same entry point. This file wires configuration, the pool, the roles
//! and the servers together and owns start-up and shutdown.

pub mod agent;
pub mod config;
pub mod error;
pub mod fabric;
pub mod grpc;
pub mod health;
pub mod listen;
pub mod master;
pub mod memory;
pub mod metrics;
pub mod peers;
pub mod pool;
pub mod quota_file;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use oncilla_model::size::HumanBytes;
use oncilla_net::credential::{Authenticate, Keyring};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tonic::transport::Server;

use config::{Cli, Config};

/// Why the daemon stopped.
#[derive(Debug, thiserror::Error)]
enum DaemonError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Pool(#[from] pool::PoolError),
    #[error("cannot listen for {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("unix socket {path}: {reason}")]
    Socket { path: String, reason: String },
    #[error(transparent)]
    Addr(#[from] oncilla_proto::client::AddrError),
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// Runs the daemon with command-line `args` (the first is the program
/// name) until SIGTERM or SIGINT; returns the process exit code.
pub fn main_with<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: logs in files and journals stay plain.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init()
        .ok();
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            // --help and --version land here too, with exit code 0.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let check = cli.check_config;
    let config = match Config::load(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("oncillad: {e}");
            return ExitCode::from(2);
        }
    };
    if check {
        print!("{}", config.describe());
        return ExitCode::SUCCESS;
    }
    match main_exec(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "oncillad stopped");
            eprintln!("oncillad: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main_exec(config: Config) -> Result<(), DaemonError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("oncillad")
        .build()
        .map_err(DaemonError::Runtime)?
        .block_on(run(config))
}

async fn run(config: Config) -> Result<(), DaemonError> {
    // The master holds the token (the configuration requires it); an agent
    // holds its node's keys, loaded or derived from the token.
    let master_token = config.token.clone().filter(|_| config.master);
    let grpc_listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| bind_error("gRPC", config.listen, source))?;
    let grpc_addr = grpc_listener
        .local_addr()
        .map_err(|source| bind_error("gRPC", config.listen, source))?;
    let (stop_tx, stop_rx) = watch::channel(false);

    // TLS, when configured, on the TCP listeners only (gRPC here, the data
    // port below); the session socket stays a Unix socket.
    let mut tcp_server = match &config.tls {
        Some(tls) => limited(Server::builder()).tls_config(tls.serve.grpc())?,
        None => limited(Server::builder()),
    };
    let trust = config.tls.as_ref().map(|t| t.trust.clone());
    // Readiness, per role (see `health`); the health service itself needs
    // no credential (it tells only whether the daemon serves).
    let (reporter, health_service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let metrics = metrics::Metrics::new();
    // Bound before any role starts, so once a node is seen up its metrics
    // port accepts; it is served once every family is registered (below).
    let metrics_listener = match config.metrics.clone() {
        Some((addr, token)) => {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| bind_error("metrics", addr, source))?;
            Some((listener, addr, token))
        }
        None => None,
    };
    let (master_ready, master_ready_rx) = watch::channel(false);
    let (agent_ready, agent_ready_rx) = watch::channel(false);
    let mut router = tcp_server.add_optional_service(master_token.map(|token| {
        let link = grpc::links::GrpcAgentLink::new(token.clone(), trust.clone());
        let (quotas, store) = match config.quotas.clone() {
            Some((path, q)) => (
                q,
                Some(Box::new(quota_file::QuotaFile { path }) as Box<dyn master::QuotaStore>),
            ),
            None => (Default::default(), None),
        };
        let core = Arc::new(master::Master::new(link, config.liveness).with_quotas(quotas, store));
        tracing::info!(
            incarnation = format!("{:016x}", core.incarnation()),
            heartbeat_ms = config.liveness.heartbeat.as_millis(),
            suspect_after_ms = config.liveness.suspect_after.as_millis(),
            down_after_ms = config.liveness.down_after.as_millis(),
            recovery_ms = config.liveness.recovery().as_millis(),
            "master starting: waits for agents to re-register before changing the table"
        );
        metrics.watch_master(&core);
        let recovering = Arc::clone(&core);
        tokio::spawn(health::master_ready(
            move || recovering.recovering(),
            master_ready,
        ));
        let watcher = Arc::clone(&core);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(watcher.liveness().heartbeat);
            loop {
                every.tick().await;
                watcher.tick();
            }
        });
        grpc::master::MasterService::new(core)
            .server(Authenticate::members(Keyring::Cluster(token)))
    }));

    let mut unix = None;
    if let (Some(agent_cfg), Some(node_keys)) = (&config.agent, &config.node_keys) {
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
            .map_err(|source| bind_error("data", agent_cfg.data_listen, source))?;
        let data_addr = data
            .local_addr()
            .map_err(|source| bind_error("data", agent_cfg.data_listen, source))?;
        // A deeper accept queue than std's 128: a burst of connections (a
        // flood's churn among them) must not drop a client's SYN into a 1 s
        // retransmit.
        nix::sys::socket::listen(&data, nix::sys::socket::Backlog::MAXCONN)
            .map_err(|e| bind_error("data", data_addr, e.into()))?;
        let (gpu_devices, gpu_note) = match oncilla_cuda::gpus() {
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
        };
        let rdma = Arc::new(fabric::verbs::Rdma::start(&agent_cfg.rdma_devices, &pool));
        let mut fabrics = vec!["tcp".to_string(), "shm".to_string()];
        if rdma.available() {
            fabrics.push("verbs".into());
        }
        let (rdma_ports, rdma_note) = rdma.report();
        let (gpu_rdma, gpu_rdma_note) = rdma.probe_gpu(gpu_devices.first().map(|g| g.index));
        let node = oncilla_model::node::NodeInfo {
            name: config.name.clone(),
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
                        pulls,
                        rings,
                        transfers,
                    )
                }
            })
            .map_err(|source| bind_error("data", data_addr, source))?;

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
            .map_err(|source| bind_error("map", data_addr, source))?;

        let master =
            grpc::links::MasterLink::new(&agent_cfg.join, node_keys.credential(), trust.as_ref())?;
        tokio::spawn(agent::membership::run(
            Arc::clone(&agent),
            master.clone(),
            agent_ready,
        ));
        if agent.rdma().available() {
            tokio::spawn(watch_rdma_ports(Arc::clone(&agent)));
        }
        router = router.add_service(
            grpc::agent::AgentService::new(Arc::clone(&agent))
                .server(Authenticate::new(keys.clone())),
        );
        let listener = bind_unix(&agent_cfg.socket)?;
        let session = grpc::session::SessionService::new(
            agent,
            master,
            Arc::clone(node_keys),
            trust.as_ref(),
        )
        .server(Authenticate::local(keys));
        let mut rx = stop_rx.clone();
        unix = Some((
            agent_cfg.socket.clone(),
            tokio::spawn(
                limited(Server::builder())
                    .add_service(session)
                    .serve_with_incoming_shutdown(
                        listen::incoming::Incoming::new(listener),
                        async move {
                            let _ = rx.changed().await;
                        },
                    ),
            ),
        ));
        tracing::info!(node = %config.name, data = %data_addr, socket = %agent_cfg.socket.display(), join = %agent_cfg.join, "agent role ready");
    }
    if config.master {
        tracing::info!(listen = %grpc_addr, "master role ready");
    }
    router = router.add_service(health_service);
    if let Some((listener, addr, token)) = metrics_listener {
        let bound = listener
            .local_addr()
            .map_err(|source| bind_error("metrics", addr, source))?;
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        tracing::info!(listen = %bound, scheme, "metrics at /metrics");
        let tls = config.tls.as_ref().map(|t| Arc::clone(t.serve.data()));
        tokio::spawn(metrics::serve::serve(
            listener,
            Arc::clone(&metrics),
            token,
            tls,
        ));
    }
    tokio::spawn(health::publish(
        reporter,
        config.master.then_some(master_ready_rx),
        config.agent.is_some().then_some(agent_ready_rx),
    ));
    let transport = if config.tls.is_some() { "tls" } else { "plain" };
    tracing::info!(grpc = %grpc_addr, transport, "oncillad ready");

    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });
    let mut rx = stop_rx.clone();
    // Connection count, preface deadline, accept backoff and no Nagle:
    // see `listen::incoming`.
    let served = router
        .serve_with_incoming_shutdown(listen::incoming::Incoming::new(grpc_listener), async move {
            let _ = rx.changed().await;
        })
        .await;
    if let Some((path, task)) = unix {
        let _ = task.await;
        for p in [oncilla_net::map_socket(&path), path] {
            if let Err(e) = std::fs::remove_file(&p) {
                tracing::warn!(path = %p.display(), error = %e, "cannot remove socket");
            }
        }
    }
    served.map_err(Into::into)
}

/// Most requests one gRPC connection has in service at once (more wait).
pub const GRPC_CONCURRENCY_PER_CONNECTION: usize = 64;
/// Most HTTP/2 streams one gRPC connection may open at once.
pub const GRPC_MAX_STREAMS: u32 = 128;
/// A gRPC request whose answer (a unary reply, or a stream's first
/// message) takes longer than this fails with `Cancelled`; no call here
/// legitimately takes near it.
pub const GRPC_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// HTTP/2 pings on a quiet gRPC connection this often...
pub const GRPC_KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(20);
/// ...and a peer that does not answer one within this is dropped.
pub const GRPC_KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Largest header block a gRPC request may carry.
pub const GRPC_MAX_HEADER_LIST: u32 = 64 << 10;

/// The limits every gRPC server here runs with (the TCP port's connection
/// limits are in [`listen::incoming`]).
fn limited(builder: Server) -> Server {
    builder
        .concurrency_limit_per_connection(GRPC_CONCURRENCY_PER_CONNECTION)
        .max_concurrent_streams(GRPC_MAX_STREAMS)
        .timeout(GRPC_REQUEST_TIMEOUT)
        .http2_keepalive_interval(Some(GRPC_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(GRPC_KEEPALIVE_TIMEOUT))
        .http2_max_header_list_size(GRPC_MAX_HEADER_LIST)
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

fn bind_error(what: &'static str, addr: SocketAddr, source: std::io::Error) -> DaemonError {
    DaemonError::Bind {
        what,
        addr: addr.to_string(),
        source,
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

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            tracing::warn!("cannot install signal handlers; stop with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}
