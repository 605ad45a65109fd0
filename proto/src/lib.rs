//! Wire formats shared by every Oncilla component.
//!
//! This crate owns the gRPC schema (generated from `oncilla.proto` at build
//! time with a pure-Rust compiler), the binary TCP data protocol, the cluster
//! token, byte-size parsing, what each fabric can reach, and the blocking
//! socket primitives both ends of the data protocol share. It must never
//! contain policy: no placement, no pool logic, no I/O beyond encoding,
//! decoding and moving bytes through a socket.

pub mod auth;
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
