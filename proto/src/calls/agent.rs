//! The `Agent` service as clients call it directly: its status, and the
//! queue pair an application's verbs copies run over.

use oncilla_model::node::AgentStatus;
use oncilla_rdma::qp::Endpoint;

use super::{read, CallError, Malformed};
use crate::client::{self, AgentClient, AuthChannel};
use crate::convert::WireError;
use crate::pb;

/// An agent, called in domain values. Cheap to clone (one connection).
#[derive(Clone)]
pub struct Agent(AgentClient);

const PEER: &str = "agent";

/// The agent's end of a connected queue pair, and the stream that lives as
/// long as the pair does.
pub struct VerbsPair {
    /// The agent's queue pair, already in RTS towards the caller.
    pub agent: Endpoint,
    /// The agent's device and port the pair lives on.
    pub device: String,
    pub port: u32,
    /// The agent's start: regions of another start are refused.
    pub incarnation: u64,
    stream: tonic::Streaming<pb::ConnectVerbsReply>,
}

impl VerbsPair {
    /// Returns when the agent ends the pair's stream (or goes away).
    pub async fn ended(mut self) {
        while let Ok(Some(_)) = self.stream.message().await {}
    }
}

impl Agent {
    /// The agent at the other end of `channel`.
    pub fn new(channel: AuthChannel) -> Self {
        Self(client::agent(channel))
    }

    /// The agent's own account of itself.
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn status(&self) -> Result<AgentStatus, CallError> {
        let s = self.0.clone().status(pb::StatusRequest {}).await?;
        read(PEER, "status", s.into_inner())
    }

    /// Connects the caller's queue pair `client` (in INIT) to one the agent
    /// makes on its active port `port_index` (modulo their number).
    ///
    /// # Errors
    /// [`CallError`]: FAILED_PRECONDITION where the agent has no verbs.
    pub async fn connect_verbs(
        &self,
        client: &Endpoint,
        port_index: u32,
    ) -> Result<VerbsPair, CallError> {
        let req = pb::ConnectVerbsRequest {
            client: Some(client.into()),
            port_index,
        };
        let mut stream = self.0.clone().connect_verbs(req).await?.into_inner();
        let reply = stream.message().await?.ok_or_else(|| {
            tonic::Status::unavailable("the agent closed the stream before answering")
        })?;
        let malformed = |error: WireError| Malformed {
            peer: PEER,
            what: "queue-pair endpoint",
            error,
        };
        let agent = reply
            .agent
            .as_ref()
            .ok_or(WireError::Missing("the agent's queue-pair endpoint"))
            .and_then(|e| Endpoint::try_from(e).map_err(WireError::from))
            .map_err(malformed)?;
        Ok(VerbsPair {
            agent,
            device: reply.device,
            port: reply.port,
            incarnation: reply.incarnation,
            stream,
        })
    }
}
