//! Standing for master through etcd: a lease kept alive, a campaign on
//! `PREFIX/master` (`--etcd-prefix`) with this master's address, and while elected a core of its
//! own for the term etcd gave (see [`Seat`]). A leader whose lease cannot
//! be renewed stops acting at its tenure's end (measured here, never later
//! than etcd's own expiry) and campaigns again; a standby names the
//! leader etcd reports. It never serves a request and never touches the
//! table: it only decides which core, if any, this daemon runs.

use std::sync::Arc;
use std::time::Duration;

use oncilla_etcd::{Etcd, EtcdError, KeepAlive, Leadership};
use tokio::sync::watch;
use tokio::time::Instant;

use super::master::Cores;
use crate::grpc::links::GrpcAgentLink;
use crate::master::seat::Seat;
use crate::master::tenure::Tenure;

/// How long a call to etcd may take (a campaign waits longer: until won).
pub(crate) const ETCD_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest pause between two attempts after etcd failed.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// What a master stands with.
pub(crate) struct Candidate {
    pub etcd: Etcd,
    /// The election's name: `PREFIX/master`, one per cluster.
    pub election: String,
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
        // Whatever happened, this daemon does not lead now, and its lease
        // goes (best effort): its key must not keep others waiting.
        let was = seat.send_replace(Seat::Standby { leader: None });
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
        if *stop.borrow() {
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

/// Gives a lease up, so a standby takes over (or the next campaigner
/// moves up) at once instead of a lease later; best effort: the lease ends
/// anyway.
async fn resign(etcd: &Etcd, lease: i64) {
    match within(etcd.revoke(lease)).await {
        Ok(()) => tracing::info!("gave up its etcd lease"),
        Err(e) => {
            tracing::warn!(error = %e, "could not give up its etcd lease; it expires by itself")
        }
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
    if lease.ttl < Duration::from_secs(1) {
        return Err(EtcdError::Malformed("lease grant (a TTL under a second)"));
    }
    let mut alive = within(c.etcd.keep_alive(lease.id)).await?;
    // Counted from before the grant was asked for: never later than etcd's.
    let mut until = asked + lease.ttl;
    let renew_every = lease.ttl / 3;
    // One attempt at anything during a term: short enough to try again
    // (on a fresh stream) before the lease runs out.
    let attempt = ETCD_TIMEOUT.min(renew_every);
    let won: Leadership = {
        let campaign = c.etcd.campaign(&c.election, c.me.as_bytes(), lease.id);
        tokio::pin!(campaign);
        let mut renew = tokio::time::interval_at(Instant::now() + renew_every, renew_every);
        let mut follow = tokio::time::interval(renew_every.min(Duration::from_secs(1)));
        loop {
            tokio::select! {
                r = &mut campaign => break r?,
                _ = renew.tick() => {
                    let asked = Instant::now();
                    let left = tokio::time::timeout(attempt, alive.renew())
                        .await
                        .unwrap_or(Err(EtcdError::Timeout(attempt)))?;
                    until = asked + left;
                }
                _ = follow.tick() => {
                    // Bounded well inside a renewal's period.
                    let asked = tokio::time::timeout(attempt / 2, c.etcd.leader(&c.election)).await;
                    if let Ok(Ok(l)) = asked {
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
        let deadline = Instant::from_std(tenure.until());
        let next = Instant::now() + renew_every;
        if next >= deadline {
            break;
        }
        tokio::time::sleep_until(next).await;
        match renew(c, lease.id, &mut alive, attempt, deadline).await {
            Some(until) => tenure.extend(until.into_std()),
            None => break,
        }
    }
    tenure.end();
    tracing::error!(
        term,
        "this master's lease ended (etcd unreachable or the lease expired): it stopped acting and stands again"
    );
    Ok(())
}

/// Renews `lease` before `deadline`: each attempt bounded by `attempt`, a
/// failed one followed by a fresh keep-alive stream. Up to when the lease
/// then holds, or `None` once it is gone or the deadline came.
async fn renew(
    c: &Candidate,
    lease: i64,
    alive: &mut KeepAlive,
    attempt: Duration,
    deadline: Instant,
) -> Option<Instant> {
    // Between attempts that fail at once (etcd refusing, or without a
    // leader): doubling, never past the deadline.
    let mut pause = Duration::from_millis(100);
    loop {
        let asked = Instant::now();
        let by = (asked + attempt).min(deadline);
        match tokio::time::timeout_at(by, alive.renew()).await {
            Ok(Ok(left)) => return Some(asked + left),
            Ok(Err(EtcdError::LeaseGone(_))) => return None,
            Ok(Err(e)) => tracing::warn!(error = %e, "master lease: renewal failed; trying a new keep-alive stream"),
            Err(_) => tracing::warn!(attempt_ms = attempt.as_millis(), "master lease: etcd did not answer a renewal in time; trying a new keep-alive stream"),
        }
        if Instant::now() >= deadline {
            return None;
        }
        let by = (Instant::now() + attempt).min(deadline);
        match tokio::time::timeout_at(by, c.etcd.keep_alive(lease)).await {
            Ok(Ok(fresh)) => *alive = fresh,
            Ok(Err(EtcdError::LeaseGone(_))) => return None,
            Ok(Err(e)) => tracing::warn!(error = %e, "master lease: etcd unreachable"),
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep_until((Instant::now() + pause).min(deadline)).await;
        pause = (pause * 2).min(attempt);
    }
}

/// An etcd call bounded by [`ETCD_TIMEOUT`].
async fn within<T>(
    call: impl std::future::Future<Output = Result<T, EtcdError>>,
) -> Result<T, EtcdError> {
    tokio::time::timeout(ETCD_TIMEOUT, call)
        .await
        .unwrap_or(Err(EtcdError::Timeout(ETCD_TIMEOUT)))
}
