//! Oncilla's domain types: what the daemon's core and the client library
//! reason about (memory kinds, placement policies, fabrics, sizes, and the
//! one rule for which fabric reaches an extent).
//!
//! Values here are valid by construction: the wire edge (`oncilla-proto`)
//! converts protobuf messages into them once, with specific errors, so no
//! core code reads a raw wire integer. This crate never depends on the wire
//! format, a transport or the operating system.

pub mod alloc;
pub mod cluster;
pub mod echo;
pub mod fabric;
pub mod node;
pub mod quota;
pub mod secret;
pub mod size;

pub use fabric::Fabric;

/// Page size used to align extents.
pub const PAGE: u64 = 4096;

/// What memory an allocation is made of and how far placement may take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Host memory on the asking process's node only (the local agent's pool).
    LocalHost,
    /// Host memory anywhere in the cluster, placed by the policy (the
    /// default policy prefers the asking node).
    RemoteHost,
    /// Device memory of one of the asking node's GPUs, in the asking
    /// process (the master tracks it; it ends with the process).
    LocalGpu,
    /// Device memory of a GPU held by an agent anywhere in the cluster.
    RemoteGpu,
}

impl Kind {
    /// Every kind, in this order.
    pub const ALL: [Kind; 4] = [
        Kind::LocalHost,
        Kind::RemoteHost,
        Kind::LocalGpu,
        Kind::RemoteGpu,
    ];

    /// Whether the bytes are device memory.
    pub fn is_gpu(self) -> bool {
        matches!(self, Kind::LocalGpu | Kind::RemoteGpu)
    }

    /// The name `ocmctl` and the Python bindings use: `local-host`,
    /// `remote-host`, `local-gpu`, `remote-gpu`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::LocalHost => "local-host",
            Kind::RemoteHost => "remote-host",
            Kind::LocalGpu => "local-gpu",
            Kind::RemoteGpu => "remote-gpu",
        }
    }
}

impl std::str::FromStr for Kind {
    type Err = UnknownName;

    /// A kind by its [`Kind::name`].
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        by_name("kind", Kind::ALL, Kind::name, s)
    }
}

/// A kind or policy name that is none of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given}: expected one of {expected}")]
pub struct UnknownName {
    pub what: &'static str,
    pub given: String,
    pub expected: String,
}

/// The one of `all` whose `name` is `given`, or which names there are.
fn by_name<T: Copy, const N: usize>(
    what: &'static str,
    all: [T; N],
    name: fn(T) -> &'static str,
    given: &str,
) -> Result<T, UnknownName> {
    all.into_iter()
        .find(|t| name(*t) == given)
        .ok_or_else(|| UnknownName {
            what,
            given: echo::echo(given),
            expected: all.map(name).join(", "),
        })
}

/// How the master chooses nodes for an opaque request (no named nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Policy {
    /// The asking node if it can hold it all, else the emptiest node that
    /// can, else the asking node and then the emptiest others.
    #[default]
    LocalFirst,
    /// An equal share on every live node with room (stripe it to use them
    /// all on sequential access).
    Spread,
    /// As few nodes as possible.
    Pack,
}

impl Policy {
    /// Every policy, in this order.
    pub const ALL: [Policy; 3] = [Policy::LocalFirst, Policy::Spread, Policy::Pack];

    /// The name `ocmctl` and the Python bindings use: `local-first`,
    /// `spread`, `pack`.
    pub fn name(self) -> &'static str {
        match self {
            Policy::LocalFirst => "local-first",
            Policy::Spread => "spread",
            Policy::Pack => "pack",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = UnknownName;

    /// A policy by its [`Policy::name`].
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        by_name("policy", Policy::ALL, Policy::name, s)
    }
}
