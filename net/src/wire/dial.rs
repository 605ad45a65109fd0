//! Opening a data connection as a client: TCP within a connect timeout,
//! TLS trusting the cluster CA where the cluster uses it, the socket's
//! stall timeouts, and the hello with its welcome. liboncilla's TCP fabric
//! and an agent pulling from another agent open connections this one way.
//!
//! It never retries and never pools: callers decide what a failure means.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::tls::tunnel::{self, DataStream};
use crate::tls::{host_of, ClientTls};
use crate::wire::{self, Welcome};

/// Why a data connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// Resolving, connecting, TLS or the handshake's I/O failed.
    #[error("{0}")]
    Unreachable(String),
    /// The agent refused the secret.
    #[error("{0}")]
    Denied(String),
    /// The agent is at its bound for this caller (no seat now).
    #[error("{0}")]
    Busy(String),
    /// The agent speaks another protocol version.
    #[error("{0}")]
    BadVersion(String),
}

/// Connects to the data port at `addr`, within `connect` (TLS included),
/// sets `stall` as the socket's read and write timeouts, and greets with
/// `secret`.
///
/// # Errors
/// As [`DialError`].
pub fn dial(
    addr: &str,
    tls: Option<&ClientTls>,
    secret: &[u8],
    connect: Duration,
    stall: Duration,
) -> Result<DataStream, DialError> {
    let unreachable = |why: String| DialError::Unreachable(why);
    let sockaddr = addr
        .to_socket_addrs()
        .map_err(|e| unreachable(format!("cannot resolve: {e}")))?
        .next()
        .ok_or_else(|| unreachable("address resolves to nothing".into()))?;
    let tcp = TcpStream::connect_timeout(&sockaddr, connect)
        .map_err(|e| unreachable(format!("cannot connect: {e}")))?;
    tcp.set_nodelay(true)
        .map_err(|e| unreachable(e.to_string()))?;
    let mut stream = match tls {
        Some(tls) => tunnel::connect(
            tcp,
            tls.data(),
            host_of(addr),
            Instant::now() + connect,
            stall,
        )
        .map_err(|e| unreachable(format!("TLS: {e}")))?,
        None => DataStream::Tcp(tcp),
    };
    stream
        .set_read_timeout(Some(stall))
        .map_err(|e| unreachable(e.to_string()))?;
    stream
        .set_write_timeout(Some(stall))
        .map_err(|e| unreachable(e.to_string()))?;
    greet(&mut stream, secret)?;
    Ok(stream)
}

/// The client half of the handshake every agent socket starts with.
///
/// # Errors
/// As [`DialError`].
pub fn greet(stream: &mut (impl Read + Write), secret: &[u8]) -> Result<(), DialError> {
    wire::write_hello(stream, secret).map_err(|e| DialError::Unreachable(e.to_string()))?;
    let (code, msg) =
        wire::read_welcome(stream).map_err(|e| DialError::Unreachable(e.to_string()))?;
    match code {
        Welcome::Ok => Ok(()),
        Welcome::Denied => Err(DialError::Denied(msg)),
        Welcome::Busy => Err(DialError::Busy(msg)),
        Welcome::BadVersion => Err(DialError::BadVersion(msg)),
    }
}
