//! The Oncilla node daemon as a library: `oncillad`'s binary is one call to
//! [`main_with`], and `ocmctl demo` starts real daemon processes by running
//! the same entry point. This file binds the shared gRPC port, starts the
//! roles the configuration asks for (`roles/`), the health and metrics
//! endpoints, serves, and owns shutdown.

pub mod agent;
pub mod config;
pub mod error;
pub mod fabric;
pub mod grpc;
pub mod hca;
pub mod health;
pub mod listen;
pub mod master;
pub mod memory;
pub mod metrics;
pub mod peers;
pub mod pool;
pub mod quota_file;
mod roles;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::Server;

use config::{Cli, Config};

/// Why the daemon stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DaemonError {
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
    #[error("--etcd: {0}")]
    Etcd(#[from] oncilla_etcd::EtcdError),
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Refused(#[from] agent::membership::Refused),
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
    let metrics = metrics::Metrics::new(&config.name);
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
    let (master_ready, master_ready_rx) = watch::channel(health::MasterReady::NotYet);
    let (agent_ready, agent_ready_rx) = watch::channel(false);
    let master = match master_token {
        Some(token) => Some(roles::master::start(
            &config,
            token,
            trust.clone(),
            &metrics,
            master_ready,
            config.advertised(grpc_addr),
            stop_rx.clone(),
        )?),
        None => None,
    };
    let (master, election) = match master {
        Some(m) => (Some(m.service), m.election),
        None => (None, None),
    };
    let mut router = tcp_server.add_optional_service(master);

    let agent = roles::agent::start(
        &config,
        grpc_addr,
        trust.clone(),
        &metrics,
        agent_ready,
        stop_rx.clone(),
    )?;
    let mut unix = None;
    let mut membership = None;
    let mut leave = None;
    if let Some(started) = agent {
        router = router.add_service(started.service);
        unix = Some((started.socket, started.sessions));
        membership = Some(started.membership);
        leave = Some(started.leave);
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

    // Shared: a server that fails stops the roles too (below).
    let stop_tx = Arc::new(stop_tx);
    let on_signal = Arc::clone(&stop_tx);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = on_signal.send(true);
    });
    // A master that refuses this node for good stops the daemon, which
    // then exits saying why.
    let refused = Arc::new(std::sync::Mutex::new(None));
    // Ended before the node says it leaves: it must not register again.
    let membership_abort = membership
        .as_ref()
        .map(tokio::task::JoinHandle::abort_handle);
    if let Some(membership) = membership {
        let (stop, refused) = (Arc::clone(&stop_tx), Arc::clone(&refused));
        tokio::spawn(async move {
            if let Ok(Err(why)) = membership.await {
                tracing::error!(error = %why, "stopping");
                *refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                let _ = stop.send(true);
            }
        });
    }
    // At the stop, at once (serving may wait long for open streams to
    // end): a node's pool goes with its process, so it stops heartbeating
    // (it must not register again) and tells the master it leaves; not
    // when the master refused it (it is not in the cluster).
    let leaving = {
        let mut stop = stop_rx.clone();
        let refused = Arc::clone(&refused);
        tokio::spawn(async move {
            let _ = stop.changed().await;
            if let Some(abort) = membership_abort {
                abort.abort();
            }
            let refused_now = refused.lock().unwrap_or_else(|e| e.into_inner()).is_some();
            if let (Some(leave), false) = (leave, refused_now) {
                leave.tell().await;
            }
        })
    };
    let mut rx = stop_rx.clone();
    // Connection count, preface deadline, accept backoff and no Nagle:
    // see `listen::incoming`.
    let served = router
        .serve_with_incoming_shutdown(listen::incoming::Incoming::new(grpc_listener), async move {
            let _ = rx.changed().await;
        })
        .await;
    // However serving ended: the election gives its lease up, and the
    // node has left (bounded by the leave's own deadline).
    let _ = stop_tx.send(true);
    let _ = leaving.await;
    if let Some(election) = election {
        // It gives its lease up on the stop: a standby takes over at once.
        if tokio::time::timeout(std::time::Duration::from_secs(5), election)
            .await
            .is_err()
        {
            tracing::warn!("the election did not end within 5 s; its lease expires by itself");
        }
    }
    if let Some((path, task)) = unix {
        let _ = task.await;
        for p in [oncilla_net::map_socket(&path), path] {
            if let Err(e) = std::fs::remove_file(&p) {
                tracing::warn!(path = %p.display(), error = %e, "cannot remove socket");
            }
        }
    }
    if let Some(why) = refused.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(why.into());
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
pub(crate) fn limited(builder: Server) -> Server {
    builder
        .concurrency_limit_per_connection(GRPC_CONCURRENCY_PER_CONNECTION)
        .max_concurrent_streams(GRPC_MAX_STREAMS)
        .timeout(GRPC_REQUEST_TIMEOUT)
        .http2_keepalive_interval(Some(GRPC_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(GRPC_KEEPALIVE_TIMEOUT))
        .http2_max_header_list_size(GRPC_MAX_HEADER_LIST)
}

pub(crate) fn bind_error(
    what: &'static str,
    addr: SocketAddr,
    source: std::io::Error,
) -> DaemonError {
    DaemonError::Bind {
        what,
        addr: addr.to_string(),
        source,
    }
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
