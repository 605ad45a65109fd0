//! Keeps this agent a member of the cluster: registers with the master
//! (reporting everything it holds and every open session, so a restarted
//! master can rebuild its table), heartbeats with its pool usage, the ids
//! it holds and the sessions that ended, and registers again whenever the
//! master has forgotten it. Runs for the life of the daemon; never gives up
//! on the master and never decides anything itself: it only applies the
//! releases the master asks for.

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

/// Next retry delay: doubles from [`RETRY_MIN`] up to `max` (the heartbeat
/// interval, so a master that comes back hears from every agent within
/// one interval).
fn backoff(current: Duration, max: Duration) -> Duration {
    (current * 2).clamp(RETRY_MIN, max.max(RETRY_MIN))
}

/// Registers and heartbeats forever; `ready` says whether the master
/// knows this node now (registered, and the last exchange went through).
pub async fn run(
    agent: Arc<Agent>,
    master: impl MasterPort,
    ready: tokio::sync::watch::Sender<bool>,
) {
    let mut interval = Duration::from_secs(1);
    let mut registered = false;
    let mut retry = RETRY_MIN;
    let mut reachable = true;
    loop {
        if registered && agent.take_info_changed() {
            tracing::info!("node information changed (an RDMA port went away); registering again");
            registered = false;
        }
        let outcome = if registered {
            heartbeat(&agent, &master).await.map(|known| {
                if !known {
                    tracing::info!("master does not know this node; registering again");
                    registered = false;
                }
            })
        } else {
            register(&agent, &master).await.map(|every| {
                interval = every;
                registered = true;
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
            Err(e) => {
                if reachable {
                    tracing::warn!(error = %e, "master unreachable; retrying");
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

async fn heartbeat(agent: &Agent, master: &impl MasterPort) -> Result<bool, LinkError> {
    let ended = agent.ended_sessions();
    let reply = master
        .heartbeat(Heartbeat {
            name: agent.node().name.clone(),
            pool: Some(agent.usage()),
            incarnation: agent.incarnation(),
            held: agent.held_ids(),
            ended_sessions: ended.clone(),
            peers_version: agent.peers().version(),
        })
        .await?;
    if reply.known {
        agent.ack_ended(&ended);
        agent.release_all(&reply.release);
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
