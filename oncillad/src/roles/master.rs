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
    /// The quotas read last (at start, then at each term).
    quotas: std::sync::Mutex<Quotas>,
}

impl Cores {
    /// A new core: empty, recovering, with the quotas as its file says
    /// now (a later term sees what an earlier one set).
    pub(crate) fn make(&self, tenure: Option<&Arc<Tenure>>) -> Arc<master::Master<GrpcAgentLink>> {
        let mut link = GrpcAgentLink::new(self.token.clone(), self.trust.clone());
        if let Some(t) = tenure {
            link = link.elected(Arc::clone(t));
        }
        let mut last = self.quotas.lock().unwrap_or_else(|e| e.into_inner());
        let (quotas, store) = match &self.quota_file {
            // Read again at each term: a later term sees what an earlier
            // one set (when the masters share the file).
            Some(path) => match quota_file::load(path) {
                Ok(q) => {
                    *last = q.clone();
                    (
                        q,
                        Some(Box::new(quota_file::QuotaFile { path: path.clone() })
                            as Box<dyn master::QuotaStore>),
                    )
                }
                // Quotas never fail open: the last ones read stay, and
                // nothing overwrites a file this master cannot read.
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the quota file again: this term keeps the quotas read last and cannot change them");
                    (last.clone(), None)
                }
            },
            None => (last.clone(), None),
        };
        drop(last);
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
            recovery_ms = core.recovering().as_millis(),
            "master starting: waits for agents to re-register before changing the table"
        );
        Arc::new(core)
    }
}

/// A started master role: its service, and its election (to await at a
/// stop, so a leader gives its lease up before the process ends).
pub(crate) struct Started {
    pub service: grpc::master::Served,
    pub election: Option<tokio::task::JoinHandle<()>>,
}

/// Starts the master role and its background tasks.
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
    ready: watch::Sender<health::MasterReady>,
    advertised: String,
    stop: watch::Receiver<bool>,
) -> Result<Started, crate::DaemonError> {
    let cores = Cores {
        token: token.clone(),
        trust,
        liveness: config.liveness,
        quota_file: config.quotas.as_ref().map(|(p, _)| p.clone()),
        quotas: std::sync::Mutex::new(
            config
                .quotas
                .as_ref()
                .map(|(_, q)| q.clone())
                .unwrap_or_default(),
        ),
    };
    let (seat, seated) = watch::channel(Seat::Standby { leader: None });
    let election = match &config.election {
        None => {
            seat.send_replace(Seat::Leading {
                core: cores.make(None),
                tenure: None,
            });
            // Dropped: the seat never changes again.
            drop(seat);
            None
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
                election: format!("{}/master", election.prefix),
                lease: election.lease,
                me: advertised,
                cores,
            };
            Some(tokio::spawn(election::run(candidate, seat, stop)))
        }
    };
    metrics.watch_master(seated.clone());
    tokio::spawn(health::master_ready(seated.clone(), ready));
    let heartbeat = config.liveness.heartbeat;
    every_heartbeat(seated.clone(), heartbeat, |core| async move {
        core.tick().await
    });
    // Lost copies are made again, and drained nodes' allocations moved,
    // in a loop of their own: a fill may take many ticks, which must go
    // on meanwhile.
    every_heartbeat(seated.clone(), heartbeat, move |core| async move {
        core.refill().await;
        // Moves for about a heartbeat, so re-creating lost copies (which
        // protect bytes) waits for no more than one move.
        let started = std::time::Instant::now();
        for _ in 0..MOVES_PER_ROUND {
            if started.elapsed() > heartbeat || !core.move_one().await {
                break;
            }
        }
    });
    Ok(Started {
        service: grpc::master::MasterService::new(seated)
            .server(Authenticate::members(Keyring::Cluster(token))),
        election,
    })
}

/// Most allocations moved off drained nodes per heartbeat.
const MOVES_PER_ROUND: usize = 64;

/// Runs `work` on the leading core every `heartbeat`, for as long as the
/// process lives (nothing while this master stands by).
fn every_heartbeat<F, Fut>(
    seated: watch::Receiver<Seat<GrpcAgentLink>>,
    heartbeat: std::time::Duration,
    work: F,
) where
    F: Fn(Arc<master::Master<GrpcAgentLink>>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut every = tokio::time::interval(heartbeat);
        loop {
            every.tick().await;
            let core = seated.borrow().leading().cloned();
            if let Some(core) = core {
                work(core).await;
            }
        }
    });
}
