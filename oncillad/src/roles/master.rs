//! The master role: its core (membership, placement, the table), the
//! liveness loop that logs each node's changes, its readiness and its
//! metrics, served as the `Master` service to holders of the cluster
//! token. Without an election the core leads from the start; with one
//! ([`super::election`]) a core exists only while this daemon leads.

use std::sync::Arc;

use oncilla_model::quota::Quotas;
use oncilla_net::auth::Token;
use oncilla_net::credential::{Authenticate, Keyring};
use oncilla_net::tls::ClientTls;
use tokio::sync::watch;

use super::election;
use crate::config::Config;
use crate::grpc::links::GrpcAgentLink;
use crate::master::seat::Seat;
use crate::master::tenure::Tenure;
use crate::{grpc, health, master, metrics, quota_file};

/// Makes the core of one term of leadership (`None`: no election).
pub(crate) struct Cores {
    token: Token,
    trust: Option<ClientTls>,
    liveness: master::Liveness,
    quota_file: Option<std::path::PathBuf>,
    /// The quotas read at start: the first core's.
    quotas: std::sync::Mutex<Option<Quotas>>,
}

impl Cores {
    /// A new core: empty, recovering, with the quotas as its file says
    /// now (a later term sees what an earlier one set).
    pub(crate) fn make(&self, tenure: Option<&Arc<Tenure>>) -> Arc<master::Master<GrpcAgentLink>> {
        let mut link = GrpcAgentLink::new(self.token.clone(), self.trust.clone());
        if let Some(t) = tenure {
            link = link.elected(Arc::clone(t));
        }
        let first = self.quotas.lock().unwrap_or_else(|e| e.into_inner()).take();
        let (quotas, store) = match &self.quota_file {
            Some(path) => {
                let q = match first {
                    Some(q) => q,
                    None => quota_file::load(path).unwrap_or_else(|e| {
                        tracing::error!(error = %e, "cannot read the quota file again; no quotas this term");
                        Default::default()
                    }),
                };
                (
                    q,
                    Some(Box::new(quota_file::QuotaFile { path: path.clone() })
                        as Box<dyn master::QuotaStore>),
                )
            }
            None => (Default::default(), None),
        };
        let mut core = master::Master::new(link, self.liveness).with_quotas(quotas, store);
        if let Some(t) = tenure {
            core = core.with_term(t.term());
        }
        tracing::info!(
            incarnation = format!("{:016x}", core.incarnation()),
            term = core.term(),
            heartbeat_ms = self.liveness.heartbeat.as_millis(),
            suspect_after_ms = self.liveness.suspect_after.as_millis(),
            down_after_ms = self.liveness.down_after.as_millis(),
            recovery_ms = self.liveness.recovery().as_millis(),
            "master starting: waits for agents to re-register before changing the table"
        );
        Arc::new(core)
    }
}

/// Starts the master role and its background tasks; the service to serve.
/// `ready` says whether this daemon leads and its recovery window is over.
/// With an election, `advertised` is the address standbys name as the
/// leader's, and once `stop` turns the daemon stops campaigning and gives
/// up a leadership it holds.
///
/// # Errors
/// An etcd endpoint that cannot be used.
pub(crate) fn start(
    config: &Config,
    token: Token,
    trust: Option<ClientTls>,
    metrics: &metrics::Metrics,
    ready: watch::Sender<bool>,
    advertised: String,
    stop: watch::Receiver<bool>,
) -> Result<grpc::master::Served, crate::DaemonError> {
    let cores = Cores {
        token: token.clone(),
        trust,
        liveness: config.liveness,
        quota_file: config.quotas.as_ref().map(|(p, _)| p.clone()),
        quotas: std::sync::Mutex::new(config.quotas.as_ref().map(|(_, q)| q.clone())),
    };
    let (seat, seated) = watch::channel(Seat::Standby { leader: None });
    match &config.election {
        None => {
            seat.send_replace(Seat::Leading {
                core: cores.make(None),
                tenure: None,
            });
            // Dropped: the seat never changes again.
            drop(seat);
        }
        Some(election) => {
            let etcd = oncilla_etcd::Etcd::new(&election.etcd, election::ETCD_TIMEOUT)?;
            tracing::info!(
                etcd = %election.etcd.join(","),
                lease_s = election.lease.as_secs(),
                advertised = %advertised,
                "master standing for election: stands by until etcd elects it"
            );
            let candidate = election::Candidate {
                etcd,
                lease: election.lease,
                me: advertised,
                cores,
            };
            tokio::spawn(election::run(candidate, seat, stop));
        }
    }
    metrics.watch_master(seated.clone());
    tokio::spawn(health::master_ready(seated.clone(), ready));
    let ticking = seated.clone();
    let heartbeat = config.liveness.heartbeat;
    tokio::spawn(async move {
        let mut every = tokio::time::interval(heartbeat);
        loop {
            every.tick().await;
            let core = ticking.borrow().leading().cloned();
            if let Some(core) = core {
                core.tick();
            }
        }
    });
    Ok(grpc::master::MasterService::new(seated)
        .server(Authenticate::members(Keyring::Cluster(token))))
}
