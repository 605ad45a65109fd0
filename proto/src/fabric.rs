//! Which fabric reaches an extent: the one rule that the master (recording
//! what an allocation's creator will use) and liboncilla (choosing for
//! itself) both apply, so they can never disagree.
//!
//! It knows only what each fabric can reach; it never moves bytes.

use crate::pb::Fabric;

/// A fabric that cannot reach an extent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "fabric shm reaches only memory on the caller's own node ({mine}); an extent is on {extent}"
)]
pub struct Unreachable {
    pub mine: String,
    pub extent: String,
}

/// The fabric a process on `my_node` (empty: not on any agent's node) uses
/// for an extent on `extent_node`, given its preference: shared memory for
/// its own node, TCP otherwise, unless told TCP (always possible) or shared
/// memory (same node only).
///
/// # Errors
/// [`Unreachable`] when shared memory is demanded for another node.
pub fn choose(extent_node: &str, my_node: &str, preference: Fabric) -> Result<Fabric, Unreachable> {
    let same = !my_node.is_empty() && extent_node == my_node;
    match preference {
        Fabric::Auto if same => Ok(Fabric::Shm),
        Fabric::Auto | Fabric::Tcp => Ok(Fabric::Tcp),
        Fabric::Shm if same => Ok(Fabric::Shm),
        Fabric::Shm => Err(Unreachable {
            mine: if my_node.is_empty() {
                "none".into()
            } else {
                my_node.into()
            },
            extent: extent_node.into(),
        }),
    }
}

/// Parses `ONCILLA_FABRIC`-style names: `auto`, `tcp`, `shm`.
///
/// # Errors
/// The accepted names, for anything else.
pub fn parse(name: &str) -> Result<Fabric, String> {
    match name.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => Ok(Fabric::Auto),
        "tcp" => Ok(Fabric::Tcp),
        "shm" => Ok(Fabric::Shm),
        other => Err(format!("unknown fabric {other:?}; use auto, tcp or shm")),
    }
}

/// The name `parse` accepts for `f`.
pub fn name(f: Fabric) -> &'static str {
    match f {
        Fabric::Auto => "auto",
        Fabric::Tcp => "tcp",
        Fabric::Shm => "shm",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_node_is_shm_unless_told_tcp() {
        assert_eq!(choose("a", "a", Fabric::Auto), Ok(Fabric::Shm));
        assert_eq!(choose("b", "a", Fabric::Auto), Ok(Fabric::Tcp));
        assert_eq!(choose("a", "a", Fabric::Tcp), Ok(Fabric::Tcp));
        assert_eq!(choose("a", "", Fabric::Auto), Ok(Fabric::Tcp));
        assert_eq!(choose("a", "a", Fabric::Shm), Ok(Fabric::Shm));
        let err = choose("b", "a", Fabric::Shm).unwrap_err();
        assert!(err.to_string().contains("an extent is on b"), "{err}");
        assert_eq!(parse("TCP"), Ok(Fabric::Tcp));
        assert!(parse("verbs").is_err());
        assert_eq!(name(Fabric::Shm), "shm");
    }
}
