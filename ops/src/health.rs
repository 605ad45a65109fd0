//! Asks a daemon's gRPC health service (`grpc.health.v1`) whether it
//! serves: `ocmctl health`, probes that run it, and tests. The service
//! needs no credential; it says only SERVING or NOT_SERVING per name
//! (`""` for the whole daemon, `oncilla.v1.Master`, `oncilla.v1.Agent`).

use oncilla_net::tls::ClientTls;
use oncilla_proto::client;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

pub use oncilla_proto::health::{AGENT, MASTER};

/// Why the health question got no answer.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error(transparent)]
    Addr(#[from] client::AddrError),
    #[error("{addr}: no answer: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("cannot start runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// The status the daemon at `addr` reports for `service` (`SERVING`,
/// `NOT_SERVING`, `SERVICE_UNKNOWN`, ...), over TLS trusting `tls` when
/// given.
///
/// # Errors
/// [`HealthError`] when nothing answers.
pub fn check(addr: &str, service: &str, tls: Option<&ClientTls>) -> Result<String, HealthError> {
    let unreachable = |reason: String| HealthError::Unreachable {
        addr: addr.to_string(),
        reason,
    };
    let endpoint = client::endpoint(addr, tls)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(HealthError::Runtime)?;
    rt.block_on(async {
        let channel = endpoint.connect().await.map_err(|e| {
            unreachable(format!(
                "{e} ({})",
                std::error::Error::source(&e)
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ))
        })?;
        let reply = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await;
        match reply {
            Ok(r) => Ok(ServingStatus::try_from(r.into_inner().status)
                .map_or_else(|_| "UNKNOWN".to_string(), |s| s.as_str_name().to_string())),
            // The protocol's answer for a name the daemon does not serve.
            Err(s) if s.code() == tonic::Code::NotFound => Ok("SERVICE_UNKNOWN".to_string()),
            Err(s) => Err(unreachable(s.message().to_string())),
        }
    })
}
