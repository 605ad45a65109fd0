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
pub mod sock;
pub mod status;
pub mod wire;

/// Generated protobuf messages and gRPC clients and servers.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("oncilla.v1");
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

/// CPU time this process has used, user and system, in nanoseconds (0 if
/// the kernel will not say). Agents report it; benchmarks divide its growth
/// by the bytes moved.
pub fn process_cpu_ns() -> u64 {
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a live, writable rusage for the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    let ns = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_usec).unwrap_or(0) * 1_000
    };
    ns(u.ru_utime) + ns(u.ru_stime)
}
