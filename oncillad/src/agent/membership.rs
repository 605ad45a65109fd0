//! Keeps this agent a member of the cluster: registers with the master,
//! heartbeats, and registers again whenever the master has forgotten it
//! (for example after a master restart). Runs for the life of the daemon.

use std::sync::Arc;
use std::time::Duration;

use crate::agent::Agent;
use crate::grpc::links::MasterLink;

const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Next retry delay: doubles from [`RETRY_MIN`] up to [`RETRY_MAX`].
fn backoff(current: Duration) -> Duration {
    (current * 2).clamp(RETRY_MIN, RETRY_MAX)
}

/// Registers and heartbeats forever.
pub async fn run(agent: Arc<Agent>, master: MasterLink) {
    let mut registered: Option<Duration> = None;
    let mut retry = RETRY_MIN;
    let mut reachable = true;
    loop {
        let outcome = match registered {
            None => master.register(agent.node().clone()).await.map(|interval| {
                tracing::info!(node = %agent.node().name, "registered with master");
                registered = Some(interval);
            }),
            Some(_) => master
                .heartbeat(&agent.node().name, agent.usage())
                .await
                .map(|known| {
                    if !known {
                        tracing::info!("master does not know this node; registering again");
                        registered = None;
                    }
                }),
        };
        match outcome {
            Ok(()) => {
                if !reachable {
                    tracing::info!("master reachable again");
                }
                reachable = true;
                retry = RETRY_MIN;
            }
            Err(e) => {
                if reachable {
                    tracing::warn!(error = %e.message(), "master unreachable; retrying");
                }
                reachable = false;
                retry = backoff(retry);
            }
        }
        let wait = match (reachable, registered) {
            (true, Some(interval)) => interval,
            _ => retry,
        };
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(Duration::ZERO), RETRY_MIN);
        assert_eq!(backoff(RETRY_MIN), RETRY_MIN * 2);
        assert_eq!(backoff(Duration::from_secs(4)), RETRY_MAX);
        assert_eq!(backoff(RETRY_MAX), RETRY_MAX);
    }
}
