//! Standing for master through etcd: a lease kept alive, a campaign on
//! [`ELECTION`] with this master's address, and while elected a core of its
//! own for the term etcd gave (see [`Seat`]). A leader whose lease cannot
//! be renewed stops acting at its tenure's end (measured here, never later
//! than etcd's own expiry) and campaigns again; a standby names the
//! leader etcd reports. It never serves a request and never touches the
//! table: it only decides which core, if any, this daemon runs.

use std::sync::Arc;
use std::time::Duration;

use oncilla_etcd::{Etcd, EtcdError, Leadership};
use tokio::sync::watch;
use tokio::time::Instant;

use super::master::Cores;
use crate::grpc::links::GrpcAgentLink;
use crate::master::seat::Seat;
use crate::master::tenure::Tenure;

/// The election every master of a cluster stands in (one cluster per etcd
/// prefix).
pub(crate) const ELECTION: &str = "oncilla/master";
/// How long a call to etcd may take (a campaign waits longer: until won).
pub(crate) const ETCD_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest pause between two attempts after etcd failed.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// What a master stands with.
pub(crate) struct Candidate {
    pub etcd: Etcd,
    /// The lease its leadership hangs on.
    pub lease: Duration,
    /// Its advertised gRPC address: what standbys name.
    pub me: String,
    pub cores: Cores,
}

/// Campaigns, leads and campaigns again until `stop` turns; `seat` says
/// what this daemon is meanwhile.
pub(crate) async fn run(
    c: Candidate,
    seat: watch::Sender<Seat<GrpcAgentLink>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = Duration::from_millis(100);
    // The lease of the current attempt, given up at a stop.
    let held = std::sync::Mutex::new(None);
    loop {
        let outcome = tokio::select! {
            r = term(&c, &seat, &held) => r,
            _ = stop.changed() => Ok(()),
        };
        // Whatever happened, this daemon does not lead now.
        let was = seat.send_replace(Seat::Standby { leader: None });
        if *stop.borrow() {
            if let Seat::Leading {
                tenure: Some(t), ..
            } = was
            {
                t.end();
            }
            let lease = held.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(lease) = lease {
                resign(&c.etcd, lease).await;
            }
            return;
        }
        match outcome {
            Ok(()) => retry = Duration::from_millis(100),
            Err(e) => {
                tracing::warn!(error = %e, retry_ms = retry.as_millis(), "master election: etcd failed; standing again");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Gives up the leadership at a stop, so a standby takes over at once
/// instead of a lease later (best effort: the lease ends anyway).
async fn resign(etcd: &Etcd, lease: i64) {
    match within(etcd.revoke(lease)).await {
        Ok(()) => tracing::info!("master stopping: gave up its etcd lease"),
        Err(e) => tracing::warn!(error = %e, "master stopping: could not give up its etcd lease"),
    }
}

/// One lease: campaigns on it (following the leader meanwhile), leads
/// until it cannot be renewed in time, then returns.
async fn term(
    c: &Candidate,
    seat: &watch::Sender<Seat<GrpcAgentLink>>,
    held: &std::sync::Mutex<Option<i64>>,
) -> Result<(), EtcdError> {
    let asked = Instant::now();
    let lease = within(c.etcd.grant(c.lease)).await?;
    *held.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease.id);
    let mut alive = within(c.etcd.keep_alive(lease.id)).await?;
    // Counted from before the grant was asked for: never later than etcd's.
    let mut until = asked + lease.ttl;
    let renew_every = lease.ttl / 3;
    let won: Leadership = {
        let campaign = c.etcd.campaign(ELECTION, c.me.as_bytes(), lease.id);
        tokio::pin!(campaign);
        let mut renew = tokio::time::interval_at(Instant::now() + renew_every, renew_every);
        let mut follow = tokio::time::interval(renew_every.min(Duration::from_secs(1)));
        loop {
            tokio::select! {
                r = &mut campaign => break r?,
                _ = renew.tick() => {
                    let asked = Instant::now();
                    let left = within(alive.renew()).await?;
                    until = asked + left;
                }
                _ = follow.tick() => {
                    if let Ok(Ok(l)) = tokio::time::timeout(ETCD_TIMEOUT, c.etcd.leader(ELECTION)).await {
                        // Its own key of an earlier lease is not a leader to name.
                        let leader = l
                            .map(|l| String::from_utf8_lossy(&l.value).into_owned())
                            .filter(|l| *l != c.me);
                        seat.send_if_modified(|s| match s {
                            Seat::Standby { leader: known } if *known != leader => {
                                *known = leader;
                                true
                            }
                            _ => false,
                        });
                    }
                }
            }
        }
    };
    let term = u64::try_from(won.term).unwrap_or(0);
    let tenure = Arc::new(Tenure::new(term, until.into_std()));
    seat.send_replace(Seat::Leading {
        core: c.cores.make(Some(&tenure)),
        tenure: Some(Arc::clone(&tenure)),
    });
    tracing::info!(
        term,
        lease_s = lease.ttl.as_secs(),
        "elected: this master leads"
    );
    loop {
        let next = Instant::now() + renew_every;
        let deadline = Instant::from_std(tenure.until());
        if tokio::time::timeout_at(deadline, tokio::time::sleep_until(next))
            .await
            .is_err()
        {
            break;
        }
        let asked = Instant::now();
        match tokio::time::timeout_at(deadline, alive.renew()).await {
            Ok(Ok(left)) => tenure.extend((asked + left).into_std()),
            Ok(Err(EtcdError::LeaseGone(_))) => break,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "master lease: renewal failed; trying a new keep-alive stream");
                match tokio::time::timeout_at(deadline, c.etcd.keep_alive(lease.id)).await {
                    Ok(Ok(fresh)) => alive = fresh,
                    Ok(Err(EtcdError::LeaseGone(_))) | Err(_) => break,
                    Ok(Err(e)) => tracing::warn!(error = %e, "master lease: etcd unreachable"),
                }
            }
            Err(_) => break,
        }
    }
    tenure.end();
    tracing::error!(
        term,
        "this master's lease ended (etcd unreachable or the lease expired): it stopped acting and stands again"
    );
    Ok(())
}

/// An etcd call bounded by [`ETCD_TIMEOUT`].
async fn within<T>(
    call: impl std::future::Future<Output = Result<T, EtcdError>>,
) -> Result<T, EtcdError> {
    tokio::time::timeout(ETCD_TIMEOUT, call)
        .await
        .unwrap_or(Err(EtcdError::Timeout(ETCD_TIMEOUT)))
}
