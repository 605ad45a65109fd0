//! Conversions between wire messages and domain types (`oncilla-model`):
//! the one place a raw protobuf integer becomes a domain value. An unknown
//! enum value, a missing required message or a value the model refuses is
//! an error here, never a silent default. Domain to wire never fails.

mod alloc;
pub use alloc::alloc_ref;
pub use node::{node_state, node_state_wire};
mod cluster;
mod node;
mod quota;
pub use quota::{quota_request, quota_setting};
pub mod rdma;

use oncilla_model::{Fabric, Kind, Policy};

use crate::pb;

/// A wire value that does not name a domain value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("unknown {what} {value} (a newer peer? upgrade this node)")]
    UnknownEnum { what: &'static str, value: i32 },
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error(transparent)]
    Invalid(#[from] oncilla_model::alloc::Invalid),
    #[error("{got} {what} where {asked} were asked for")]
    Count {
        what: &'static str,
        asked: usize,
        got: usize,
    },
    #[error("{0} of {1} bytes, longer than the {2} allowed")]
    TooLong(&'static str, usize, usize),
    #[error("queue-pair endpoint: {0}")]
    Endpoint(#[from] rdma::EndpointError),
}

/// A wire enum value as its generated type, or [`WireError::UnknownEnum`].
fn known<E: TryFrom<i32>>(what: &'static str, value: i32) -> Result<E, WireError> {
    E::try_from(value).map_err(|_| WireError::UnknownEnum { what, value })
}

impl From<Fabric> for pb::Fabric {
    fn from(f: Fabric) -> Self {
        match f {
            Fabric::Auto => pb::Fabric::Auto,
            Fabric::Tcp => pb::Fabric::Tcp,
            Fabric::Shm => pb::Fabric::Shm,
            Fabric::Verbs => pb::Fabric::Verbs,
        }
    }
}

impl From<pb::Fabric> for Fabric {
    fn from(f: pb::Fabric) -> Self {
        match f {
            pb::Fabric::Auto => Fabric::Auto,
            pb::Fabric::Tcp => Fabric::Tcp,
            pb::Fabric::Shm => Fabric::Shm,
            pb::Fabric::Verbs => Fabric::Verbs,
        }
    }
}

/// The fabric a wire integer names.
///
/// # Errors
/// [`WireError::UnknownEnum`].
pub fn fabric(value: i32) -> Result<Fabric, WireError> {
    known::<pb::Fabric>("fabric", value).map(Fabric::from)
}

/// The wire integer of a fabric.
pub fn fabric_wire(f: Fabric) -> i32 {
    pb::Fabric::from(f) as i32
}

/// The memory kind a wire integer names; `None` for unspecified.
///
/// # Errors
/// [`WireError::UnknownEnum`].
pub fn kind(value: i32) -> Result<Option<Kind>, WireError> {
    Ok(match known::<pb::MemKind>("memory kind", value)? {
        pb::MemKind::Unspecified => None,
        pb::MemKind::LocalHost => Some(Kind::LocalHost),
        pb::MemKind::RemoteHost => Some(Kind::RemoteHost),
        pb::MemKind::LocalGpu => Some(Kind::LocalGpu),
        pb::MemKind::RemoteGpu => Some(Kind::RemoteGpu),
    })
}

/// The wire integer of a memory kind (`None`: unspecified).
pub fn kind_wire(k: Option<Kind>) -> i32 {
    (match k {
        None => pb::MemKind::Unspecified,
        Some(Kind::LocalHost) => pb::MemKind::LocalHost,
        Some(Kind::RemoteHost) => pb::MemKind::RemoteHost,
        Some(Kind::LocalGpu) => pb::MemKind::LocalGpu,
        Some(Kind::RemoteGpu) => pb::MemKind::RemoteGpu,
    }) as i32
}

/// The placement policy a wire integer names (unspecified: the default).
///
/// # Errors
/// [`WireError::UnknownEnum`].
pub fn policy(value: i32) -> Result<Policy, WireError> {
    Ok(match known::<pb::Policy>("placement policy", value)? {
        pb::Policy::Unspecified | pb::Policy::LocalFirst => Policy::LocalFirst,
        pb::Policy::Spread => Policy::Spread,
        pb::Policy::Pack => Policy::Pack,
    })
}

/// The wire integer of a placement policy.
pub fn policy_wire(p: Policy) -> i32 {
    (match p {
        Policy::LocalFirst => pb::Policy::LocalFirst,
        Policy::Spread => pb::Policy::Spread,
        Policy::Pack => pb::Policy::Pack,
    }) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_round_trips_and_unknown_ones_are_refused() {
        for f in [Fabric::Auto, Fabric::Tcp, Fabric::Shm, Fabric::Verbs] {
            assert_eq!(fabric(fabric_wire(f)), Ok(f));
        }
        for k in [
            None,
            Some(Kind::LocalHost),
            Some(Kind::RemoteHost),
            Some(Kind::LocalGpu),
            Some(Kind::RemoteGpu),
        ] {
            assert_eq!(kind(kind_wire(k)), Ok(k));
        }
        for p in [Policy::LocalFirst, Policy::Spread, Policy::Pack] {
            assert_eq!(policy(policy_wire(p)), Ok(p));
        }
        assert!(matches!(
            fabric(99),
            Err(WireError::UnknownEnum { value: 99, .. })
        ));
        assert!(kind(-1).is_err());
        assert!(policy(7).is_err());
    }
}
