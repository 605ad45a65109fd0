//! How every component dials a gRPC peer: one place for timeouts, for
//! TLS (when the cluster's listeners speak it) and for attaching the
//! cluster token.

use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::calls::CallError;
use crate::pb;
use oncilla_net::auth::Token;
use oncilla_net::credential::{AttachCredential, Credential};
use oncilla_net::tls::ClientTls;

/// Time allowed to establish a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Time allowed for any unary call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// Longest a caller waits through the master's recovery window in all:
/// the window is a few heartbeats; this bounds a master that keeps
/// restarting.
pub const RECOVERY_WAIT: Duration = Duration::from_secs(60);
/// Shortest pause between attempts while the master recovers.
const RECOVERY_POLL: Duration = Duration::from_millis(20);

/// Why a caller waits for the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// The master has just started and waits for agents to re-register.
    Recovery,
    /// The master asked is a standby and none leads yet.
    Election,
}

/// Runs `call` again while the master answers that it is recovering, or
/// that it stands by while no master leads, sleeping as long as it asks
/// between attempts and at most [`RECOVERY_WAIT`] in all; `waiting` hears
/// the first wait and why (to say why the caller pauses). Safe for any
/// call: a master that recovers or stands by does nothing before it
/// refuses.
///
/// # Errors
/// The call's own failure, or the last refusal once the wait is used up.
pub async fn through_recovery<T, F, Fut>(
    mut call: F,
    mut waiting: impl FnMut(Duration, Waiting),
) -> Result<T, CallError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CallError>>,
{
    let until = tokio::time::Instant::now() + RECOVERY_WAIT;
    let mut told = false;
    loop {
        let failed = match call().await {
            Err(e) => e,
            ok => return ok,
        };
        let waits = failed.status().and_then(|s| {
            let why = match crate::status::reason(s) {
                Some((crate::status::Reason::Standby, _)) => Waiting::Election,
                _ => Waiting::Recovery,
            };
            crate::status::retry_after(s).map(|after| (after, why))
        });
        let Some((after, why)) = waits else {
            return Err(failed);
        };
        let now = tokio::time::Instant::now();
        if now >= until {
            return Err(failed);
        }
        let pause = after.max(RECOVERY_POLL).min(until - now);
        if !told {
            waiting(after, why);
            told = true;
        }
        tokio::time::sleep(pause).await;
    }
}

/// The metadata a master's reservations and releases carry its term in
/// (fencing: an agent refuses terms older than one it has met).
pub const TERM_HEADER: &str = "oncilla-term";

/// Marks `req` as sent by the master of `term` (0: masters are not
/// elected; nothing is added).
pub fn set_term<T>(req: &mut tonic::Request<T>, term: u64) {
    if term != 0 {
        req.metadata_mut()
            .insert(TERM_HEADER, tonic::metadata::MetadataValue::from(term));
    }
}

/// The term `req` was sent under (0 when it names none).
///
/// # Errors
/// `INVALID_ARGUMENT` for a term that is not a decimal number.
pub fn term_of<T>(req: &tonic::Request<T>) -> Result<u64, tonic::Status> {
    match req.metadata().get(TERM_HEADER) {
        None => Ok(0),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| tonic::Status::invalid_argument(format!("invalid {TERM_HEADER}"))),
    }
}

/// Largest gRPC message any component sends or accepts: room for a page
/// of allocations (`ListAllocations`, `Register`), which the senders cut to
/// at most [`PAGE_EXTENTS`] extents plus one allocation of the largest size
/// ([`oncilla_model::alloc::MAX_EXTENTS`] extents, each about 100 bytes
/// with two RDMA ports).
pub const MAX_MESSAGE: usize = 64 << 20;
/// Extents a page of allocations carries before it is cut (one allocation
/// always fits, however many it has).
pub const PAGE_EXTENTS: usize = oncilla_model::alloc::MAX_EXTENTS;
/// Allocations a page carries at most (small ones cost a few hundred bytes).
pub const PAGE_ALLOCATIONS: usize = 4096;

/// A channel with a credential (the token, or a session's) presented on
/// every call.
pub type AuthChannel = InterceptedService<Channel, AttachCredential>;
pub type MasterClient = pb::master_client::MasterClient<AuthChannel>;
pub type AgentClient = pb::agent_client::AgentClient<AuthChannel>;
pub type SessionClient = pb::session_client::SessionClient<AuthChannel>;

/// A master client that sends and accepts messages up to [`MAX_MESSAGE`].
pub fn master(channel: AuthChannel) -> MasterClient {
    MasterClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

/// An agent client that sends and accepts messages up to [`MAX_MESSAGE`].
pub fn agent(channel: AuthChannel) -> AgentClient {
    AgentClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

/// A session client that sends and accepts messages up to [`MAX_MESSAGE`].
pub fn session(channel: AuthChannel) -> SessionClient {
    SessionClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

/// An address that cannot be dialled.
#[derive(Debug, thiserror::Error)]
#[error("invalid address {addr:?}: {reason} (expected HOST:PORT)")]
pub struct AddrError {
    addr: String,
    reason: String,
}

impl AddrError {
    pub(crate) fn new(addr: &str, reason: &str) -> Self {
        Self {
            addr: addr.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// The endpoint for `host:port`, with the project's timeouts; over TLS
/// trusting the cluster CA when `tls` is given (the listener's certificate
/// must then name `host`).
///
/// # Errors
/// [`AddrError`] for an address that is not a valid URI authority.
pub fn endpoint(addr: &str, tls: Option<&ClientTls>) -> Result<Endpoint, AddrError> {
    let err = |reason: String| AddrError {
        addr: addr.to_string(),
        reason,
    };
    if addr.contains("://") {
        return Err(err("give HOST:PORT, without a scheme".into()));
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|e| err(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .tcp_nodelay(true);
    match tls {
        Some(tls) => endpoint
            .tls_config(tls.grpc())
            .map_err(|e| err(format!("TLS: {e}"))),
        None => Ok(endpoint),
    }
}

/// A channel to an agent's Unix socket at `path` (its `Session` service),
/// with the project's timeouts.
///
/// # Errors
/// The socket cannot be reached.
pub async fn unix(path: &std::path::Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI is required by the API and ignored: the connector dials the socket.
    Endpoint::from_static("http://oncillad.local")
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
}

/// A channel to `addr` that connects on first use and reconnects after
/// failures, presenting the cluster token (over TLS with `tls`).
///
/// # Errors
/// [`AddrError`].
pub fn lazy(addr: &str, token: &Token, tls: Option<&ClientTls>) -> Result<AuthChannel, AddrError> {
    lazy_as(addr, &Credential::member(token), tls)
}

/// A channel to `addr` like [`lazy`], presenting `credential` (an
/// application session's, on `Agent.ConnectVerbs`).
///
/// # Errors
/// [`AddrError`].
pub fn lazy_as(
    addr: &str,
    credential: &Credential,
    tls: Option<&ClientTls>,
) -> Result<AuthChannel, AddrError> {
    let channel = endpoint(addr, tls)?.connect_lazy();
    Ok(InterceptedService::new(
        channel,
        AttachCredential::new(credential),
    ))
}

/// Wraps a transport failure as "`what` unreachable at `addr`", and a call
/// the peer does not serve (UNIMPLEMENTED, which gRPC sends with no
/// message) as what it means, leaving every other answer the peer gave
/// untouched. Servers never answer UNAVAILABLE themselves, so that code
/// always means the peer could not be reached.
pub fn unreachable(what: &str, addr: &str, status: tonic::Status) -> tonic::Status {
    match status.code() {
        // Cancelled: the connection broke under a call in flight.
        tonic::Code::Unavailable
        | tonic::Code::DeadlineExceeded
        | tonic::Code::Unknown
        | tonic::Code::Cancelled
            if !status.message().starts_with(what) =>
        {
            // Every cause, innermost last, each once (tonic repeats
            // "transport error" down the chain).
            let mut causes: Vec<String> = Vec::new();
            let mut next = std::error::Error::source(&status);
            while let Some(e) = next {
                let s = e.to_string();
                if !causes.contains(&s) && s != status.message() {
                    causes.push(s);
                }
                next = e.source();
            }
            let detail = if causes.is_empty() {
                String::new()
            } else {
                format!(" ({})", causes.join(": "))
            };
            tonic::Status::unavailable(format!(
                "{what} unreachable at {addr}: {}{detail}",
                status.message()
            ))
        }
        // Another service answers there (an agent's port given for the
        // master's), or an older build without this call: gRPC says only
        // "unimplemented", with no message.
        tonic::Code::Unimplemented => tonic::Status::unimplemented(format!(
            "{addr} does not serve this call as a {what} (another daemon's port, or an older version?){}",
            if status.message().is_empty() {
                String::new()
            } else {
                format!(": {}", status.message())
            }
        )),
        _ => status,
    }
}

/// [`unreachable()`] for a call made without TLS: where the connection was
/// made and then broken or garbled (what a plaintext client sees of a TLS
/// listener), the message says to pass the cluster CA.
pub fn unreachable_plain(what: &str, addr: &str, status: tonic::Status) -> tonic::Status {
    let status = unreachable(what, addr, status);
    let text = status.message().to_ascii_lowercase();
    let broken = [
        "h2 protocol error",
        "connection error",
        "broken pipe",
        "connection reset",
    ]
    .iter()
    .any(|m| text.contains(m));
    if !broken
        || !matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::Internal
        )
    {
        return status;
    }
    let message = if status.message().starts_with(what) {
        status.message().to_string()
    } else {
        format!("{what} unreachable at {addr}: {}", status.message())
    };
    tonic::Status::unavailable(format!(
        "{message}; if the cluster uses TLS, pass its CA (--tls-ca or ONCILLA_TLS_CA)"
    ))
}
