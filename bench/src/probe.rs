//! Asks every agent of a cluster directly what it holds and how much it is
//! still scrubbing (the `Agent.Status` call), so benchmarks can wait for a
//! clean pool between samples and read agents' CPU time. It reads; it never
//! changes an agent.

use oncilla_model::node::{AgentStatus, NodeStatus};
use std::time::{Duration, Instant};

use oncilla_net::auth::Token;
use oncilla_net::tls::ClientTls;
use oncilla_proto::calls::{self, CallError};
use oncilla_proto::client;

use crate::BenchError;

/// Longest wait for the scrubber after one free.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Asks every agent directly what it holds and how much it is still
/// scrubbing.
pub(crate) struct Probe {
    agents: Vec<(String, calls::Agent)>,
    rt: tokio::runtime::Runtime,
}

impl Probe {
    pub(crate) fn new(
        nodes: &[NodeStatus],
        token: &Token,
        tls: Option<&ClientTls>,
    ) -> Result<Self, BenchError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| BenchError::Failed(format!("cannot start runtime: {e}")))?;
        let mut agents = Vec::new();
        for n in nodes.iter().map(|n| &n.info) {
            let _guard = rt.enter();
            agents.push((
                n.agent_addr.clone(),
                calls::Agent::new(client::lazy(&n.agent_addr, token, tls)?),
            ));
        }
        Ok(Self { agents, rt })
    }

    /// Where `name` is among the agents [`Probe::statuses`] answers for.
    pub(crate) fn index_of(&self, nodes: &[NodeStatus], name: &str) -> Option<usize> {
        nodes.iter().position(|n| n.info.name == name)
    }

    /// Every agent's own account of itself.
    pub(crate) fn statuses(&self) -> Result<Vec<AgentStatus>, BenchError> {
        self.agents
            .iter()
            .map(|(addr, c)| {
                self.rt.block_on(c.status()).map_err(|e| match e {
                    CallError::Rpc(s) => BenchError::Rpc(client::unreachable("agent", addr, s)),
                    CallError::Malformed(m) => BenchError::Failed(m.to_string()),
                })
            })
            .collect()
    }

    /// Waits until no agent is scrubbing; returns how long that took.
    pub(crate) fn settle(&self) -> Result<Duration, BenchError> {
        let started = Instant::now();
        loop {
            let busy = self.statuses()?.iter().any(|s| s.pool.scrubbing > 0);
            if !busy {
                return Ok(started.elapsed());
            }
            if started.elapsed() > SETTLE_TIMEOUT {
                return Err(BenchError::Failed(format!(
                    "agents still scrubbing after {}s",
                    SETTLE_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
