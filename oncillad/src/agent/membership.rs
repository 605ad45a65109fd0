//! Keeps this agent a member of the cluster: registers with the master
//! (reporting everything it holds and every open session, so a restarted
//! master can rebuild its table), heartbeats with its pool usage, the ids
//! it holds (all of them while they are few, else those reserved since the
//! last heartbeat and all of them every [`FULL_EVERY`] heartbeats: see
//! [`HeldReport`]) and the sessions that ended, and registers again
//! whenever the master has forgotten it. Runs for the life of the daemon;
//! never gives up on the master and never decides anything itself: it only
//! applies the releases the master asks for.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use oncilla_model::cluster::{Heartbeat, HeartbeatReply, Registered, Registration};

use crate::agent::Agent;
use crate::error::LinkError;

/// How the agent reaches the master (the gRPC edge implements it; tests
/// can fake it).
pub trait MasterPort: Send + Sync + 'static {
    /// Joins (or re-joins) the cluster, reporting everything held.
    fn register(
        &self,
        req: Registration,
    ) -> impl Future<Output = Result<Registered, LinkError>> + Send;
    /// Reports liveness, pool usage, what is held and sessions that ended.
    fn heartbeat(
        &self,
        req: Heartbeat,
    ) -> impl Future<Output = Result<HeartbeatReply, LinkError>> + Send;
}

const RETRY_MIN: Duration = Duration::from_millis(100);

/// An agent holding many allocations lists all of them every this many
/// heartbeats (and when the master asks, or a heartbeat failed): a stray
/// the master must release is found within this many intervals.
pub const FULL_EVERY: u64 = 16;

/// Which held ids the next heartbeat carries. Every id is checked against
/// the master's table under its lock, so a million held would cost the
/// master a million lookups per interval: while an agent holds at most
/// [`fresh::MAX_FRESH`](super::fresh::MAX_FRESH) it lists them all, else
/// only those reserved since the last heartbeat that went through, and all
/// of them now and then.
#[derive(Debug, Default)]
pub struct HeldReport {
    beats: u64,
    full_next: bool,
}

impl HeldReport {
    /// The ids for the next heartbeat.
    fn ids(&mut self, agent: &Agent) -> Vec<u64> {
        let fresh = agent.take_fresh();
        let full = std::mem::take(&mut self.full_next)
            || self.beats.is_multiple_of(FULL_EVERY)
            || agent.allocations() <= super::fresh::MAX_FRESH;
        self.beats += 1;
        match fresh {
            Some(ids) if !full => ids,
            _ => agent.held_ids(),
        }
    }

    /// After a heartbeat: one that failed (its fresh ids may not have
    /// been seen) or a master that asks makes the next one full.
    fn answered(&mut self, went_through: bool, want_full: bool) {
        self.full_next |= !went_through || want_full;
    }
}

/// Next retry delay: doubles from [`RETRY_MIN`] up to `max` (the heartbeat
/// interval, so a master that comes back hears from every agent within
/// one interval).
fn backoff(current: Duration, max: Duration) -> Duration {
    (current * 2).clamp(RETRY_MIN, max.max(RETRY_MIN))
}

/// Why this agent gave up on the cluster: the master refused its
/// registration for who it is (another live agent holds its name, or its
/// credential is not the cluster's). Retrying cannot help; the daemon
/// stops with this.
#[derive(Debug, thiserror::Error)]
#[error("the master refused this node: {0}")]
pub struct Refused(pub String);

/// Registers and heartbeats until the daemon stops; `ready` says whether
/// the master knows this node now (registered, and the last exchange went
/// through).
///
/// # Errors
/// [`Refused`]: the master will not take this node, whatever it retries.
pub async fn run(
    agent: Arc<Agent>,
    master: impl MasterPort,
    ready: tokio::sync::watch::Sender<bool>,
) -> Result<(), Refused> {
    let mut interval = Duration::from_secs(1);
    let mut registered = false;
    let mut retry = RETRY_MIN;
    let mut reachable = true;
    let mut report = HeldReport::default();
    // Once this process was in the cluster, a refusal is retried like any
    // other (a master restarted with another configuration, say): only a
    // first registration refused for who it is ends the daemon.
    let mut ever_registered = false;
    loop {
        if registered && agent.take_info_changed() {
            tracing::info!("node information changed (an RDMA port went away); registering again");
            registered = false;
        }
        let outcome = if registered {
            heartbeat(&agent, &master, &mut report).await.map(|known| {
                if !known {
                    tracing::info!("master does not know this node; registering again");
                    registered = false;
                }
            })
        } else {
            register(&agent, &master).await.map(|every| {
                interval = every;
                registered = true;
                ever_registered = true;
            })
        };
        ready.send_replace(outcome.is_ok() && registered);
        let wait = match outcome {
            Ok(()) => {
                if !reachable {
                    tracing::info!("master reachable again");
                }
                reachable = true;
                retry = RETRY_MIN;
                if registered {
                    interval
                } else {
                    Duration::ZERO
                }
            }
            Err(LinkError::Denied(why)) if !registered && !ever_registered => {
                ready.send_replace(false);
                return Err(Refused(why));
            }
            Err(e) => {
                if reachable {
                    let what = match e {
                        LinkError::Unreachable(_) => "master unreachable",
                        _ => "the master refused",
                    };
                    tracing::warn!(error = %e, "{what}; retrying");
                }
                reachable = false;
                retry = backoff(retry, interval);
                retry
            }
        };
        // An ended session is reported at once, not a heartbeat later.
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = agent.woken(), if reachable && registered => {}
        }
    }
}

async fn register(agent: &Agent, master: &impl MasterPort) -> Result<Duration, LinkError> {
    let (req, ended) = agent.registration();
    let (held, sessions) = (req.held.len(), req.sessions.len());
    let reply = master.register(req).await?;
    // A deposed master that still answers is not followed.
    agent
        .follow_term(reply.term)
        .map_err(|e| LinkError::Refused(e.to_string()))?;
    agent.set_master_incarnation(reply.master_incarnation);
    agent.ack_ended(&ended);
    agent.release_all(&reply.release);
    let interval = Duration::from_millis(reply.heartbeat_interval_ms.max(50));
    let peers = agent.peers();
    peers.heartbeat(interval);
    peers.set(reply.peers_version, reply.peers);
    tracing::info!(
        node = %agent.node().name,
        held,
        sessions,
        released = reply.release.len(),
        "registered with master"
    );
    Ok(interval)
}

async fn heartbeat(
    agent: &Agent,
    master: &impl MasterPort,
    report: &mut HeldReport,
) -> Result<bool, LinkError> {
    let ended = agent.ended_sessions();
    let filling = agent.filling_report();
    let reply = master
        .heartbeat(Heartbeat {
            name: agent.node().name.clone(),
            pool: Some(agent.usage()),
            incarnation: agent.incarnation(),
            held: report.ids(agent),
            ended_sessions: ended.clone(),
            peers_version: agent.peers().version(),
            filling: filling.ids.clone(),
        })
        .await;
    report.answered(reply.is_ok(), reply.as_ref().is_ok_and(|r| r.want_full));
    let reply = reply?;
    if reply.known {
        agent.ack_ended(&ended);
        agent.release_all(&reply.release);
        agent.set_draining(reply.draining);
        agent.confirm_whole(&reply.whole, &filling);
        let peers = agent.peers();
        if reply.peers_version != peers.version() {
            peers.set(reply.peers_version, reply.peers);
        }
    }
    Ok(reply.known)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::fresh::MAX_FRESH;
    use crate::agent::tests::{agent_of, rec, res};
    use oncilla_model::alloc::KEY_LEN;
    use oncilla_model::Fabric;

    /// Few held: every heartbeat lists them all. Many: those reserved
    /// since the last heartbeat, and all of them every FULL_EVERY beats,
    /// after a failed heartbeat and when the master asks.
    #[test]
    fn heartbeats_list_what_changed_and_everything_now_and_then() {
        let many = MAX_FRESH as u64 + 4;
        let a = agent_of(many + 8);
        let take = |a: &Agent, id: u64| {
            a.reserve(res(id, &[1; KEY_LEN], &[(0, 4096)], rec(), Fabric::Auto))
                .unwrap();
        };
        let mut report = HeldReport::default();
        take(&a, 1);
        assert_eq!(report.ids(&a), [1], "the first lists everything");
        take(&a, 2);
        assert_eq!(report.ids(&a).len(), 2, "few: always everything");
        for id in 3..=many {
            take(&a, id);
        }
        report.answered(true, false);
        assert_eq!(
            report.ids(&a).len() as u64,
            many,
            "more than fit the fresh list"
        );
        take(&a, many + 1);
        take(&a, many + 2);
        report.answered(true, false);
        assert_eq!(report.ids(&a), [many + 1, many + 2], "only what is new");
        report.answered(true, false);
        assert!(report.ids(&a).is_empty(), "nothing new");
        report.answered(false, false);
        assert_eq!(report.ids(&a).len() as u64, many + 2, "after a failure");
        report.answered(true, true);
        assert_eq!(report.ids(&a).len() as u64, many + 2, "the master asked");
        for _ in report.beats..FULL_EVERY {
            report.answered(true, false);
            assert!(report.ids(&a).is_empty());
        }
        assert_eq!(
            report.ids(&a).len() as u64,
            many + 2,
            "every FULL_EVERY beats"
        );
    }

    #[test]
    fn backoff_doubles_and_caps_at_the_interval() {
        let max = Duration::from_secs(1);
        assert_eq!(backoff(Duration::ZERO, max), RETRY_MIN);
        assert_eq!(backoff(RETRY_MIN, max), RETRY_MIN * 2);
        assert_eq!(backoff(Duration::from_millis(800), max), max);
        assert_eq!(backoff(max, max), max);
        assert_eq!(backoff(max, Duration::ZERO), RETRY_MIN);
    }
}
