//! Oncilla's network edge below gRPC: how bytes reach a peer and how a
//! peer is authenticated.
//!
//! This crate owns the binary TCP data protocol with the blocking socket
//! calls and dialing both of its ends share (`wire`), TLS on the cluster's
//! listeners and the data tunnel (`tls`), the cluster token and private key
//! files (`auth`), node and session credentials and who presented one
//! (`credential`), the place a gRPC connection holds until its first
//! admitted call (`proven`), and where an agent's local sockets live. It
//! must never contain the gRPC schema (`oncilla-proto` holds it), nor
//! placement, pool or fabric-choice logic (the model and the daemon hold
//! those), and no I/O beyond authenticating and moving bytes through a
//! socket.

pub mod auth;
pub mod credential;
pub mod proven;
pub mod tls;
pub mod wire;

/// Default Unix socket of the local agent.
pub const DEFAULT_SOCKET: &str = "/run/oncilla/agent.sock";

/// The agent's same-node mapping socket, next to its session socket
/// (`agent.sock` → `agent.sock.map`).
pub fn map_socket(session_socket: &std::path::Path) -> std::path::PathBuf {
    let mut s = session_socket.as_os_str().to_owned();
    s.push(".map");
    s.into()
}
