//! The gRPC schema shared by every Oncilla component, in the model's
//! vocabulary at its edges.
//!
//! This crate owns the schema (generated from `oncilla.proto` at build
//! time with a pure-Rust compiler), `convert` (the one place a protobuf
//! message becomes a domain value of `oncilla_model`), the services called
//! in domain values (`calls`), typed status details (`status`), dialing
//! a gRPC peer (`client`) and finding the leading master (`masters`). The data protocol, sockets, TLS and credentials
//! are `oncilla-net`'s. It must never contain placement, pool or
//! fabric-choice logic (the model and the daemon hold those), and no I/O
//! beyond encoding, decoding and making a call.

pub mod calls;
pub mod client;
pub mod convert;
pub mod masters;
pub mod status;

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
