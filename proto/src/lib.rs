//! Wire formats shared by every Oncilla component, and how a peer on them
//! is authenticated.
//!
//! This crate owns the gRPC schema (generated from `oncilla.proto` at build
//! time with a pure-Rust compiler), `convert` (the one place a protobuf
//! message becomes a domain value of `oncilla_model`), the services called
//! in domain values (`calls`), typed status details (`status`), dialing a
//! gRPC peer (`client`), the binary TCP data protocol
//! with the blocking socket calls and dialing both of its ends share
//! (`wire`), TLS on the cluster's listeners and the data tunnel (`tls`),
//! the cluster token and private key files (`auth`), node and session
//! credentials and who presented one (`credential`), and the place a gRPC
//! connection holds until its first admitted call (`proven`). It must never
//! contain placement, pool or fabric-choice logic (the model and the
//! daemon hold those), and no I/O beyond encoding, decoding, authenticating
//! and moving bytes through a socket.

pub mod auth;
pub mod calls;
pub mod client;
pub mod convert;
pub mod credential;
pub mod proven;
pub mod status;
pub mod tls;
pub mod wire;

/// Generated protobuf messages and gRPC clients and servers.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("oncilla.v1");
}

/// Names each daemon answers for on the gRPC health service
/// (`grpc.health.v1`), besides `""` for the whole daemon.
pub mod health {
    /// The master role: SERVING once its recovery window is over.
    pub const MASTER: &str = "oncilla.v1.Master";
    /// The agent role: SERVING while the master knows the node.
    pub const AGENT: &str = "oncilla.v1.Agent";
}

/// Default TCP port of the master's gRPC endpoint.
pub const DEFAULT_MASTER_PORT: u16 = 7070;
/// Default Unix socket of the local agent.
pub const DEFAULT_SOCKET: &str = "/run/oncilla/agent.sock";
/// Page size used to align extents.
pub const PAGE: u64 = oncilla_model::PAGE;

/// The agent's same-node mapping socket, next to its session socket
/// (`agent.sock` → `agent.sock.map`).
pub fn map_socket(session_socket: &std::path::Path) -> std::path::PathBuf {
    let mut s = session_socket.as_os_str().to_owned();
    s.push(".map");
    s.into()
}
