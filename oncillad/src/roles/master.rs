//! The master role: its core (membership, placement, the table), the
//! liveness loop that logs each node's changes, its readiness and its
//! metrics, served as the `Master` service to holders of the cluster
//! token.

use std::sync::Arc;

use oncilla_net::auth::Token;
use oncilla_net::credential::{Authenticate, Keyring};
use oncilla_net::tls::ClientTls;
use tokio::sync::watch;

use crate::config::Config;
use crate::{grpc, health, master, metrics, quota_file};

/// Starts the master's core and its background tasks; the service to
/// serve. `ready` turns true once its recovery window is over.
pub(crate) fn start(
    config: &Config,
    token: Token,
    trust: Option<ClientTls>,
    metrics: &metrics::Metrics,
    ready: watch::Sender<bool>,
) -> grpc::master::Served {
    let link = grpc::links::GrpcAgentLink::new(token.clone(), trust);
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
    tokio::spawn(health::master_ready(move || recovering.recovering(), ready));
    let watcher = Arc::clone(&core);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(watcher.liveness().heartbeat);
        loop {
            every.tick().await;
            watcher.tick();
        }
    });
    grpc::master::MasterService::new(core).server(Authenticate::members(Keyring::Cluster(token)))
}
