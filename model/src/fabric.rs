//! Which fabric reaches an extent: the one rule that the master (recording
//! what an allocation's creator will use) and liboncilla (choosing for
//! itself) both apply, so they can never disagree.
//!
//! It knows only what each fabric can reach; it never moves bytes.

use std::sync::Arc;

/// How a process moves bytes to and from an extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Fabric {
    /// Shared memory for extents on the caller's node, RDMA verbs for the
    /// others where both ends have it, TCP otherwise.
    #[default]
    Auto,
    /// TCP everywhere, the caller's node included.
    Tcp,
    /// Shared memory only (every extent must be on the caller's node).
    Shm,
    /// RDMA verbs only (a build with the `verbs` feature, and an active
    /// RDMA port on both ends).
    Verbs,
}

/// A fabric name that is not one of `auto`, `tcp`, `shm`, `verbs`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fabric {0:?}; use auto, tcp, shm or verbs")]
pub struct UnknownFabric(pub String);

impl Fabric {
    /// Parses names as `ONCILLA_FABRIC` takes them: `auto` (or empty),
    /// `tcp`, `shm`, `verbs` (or `rdma`), in any case.
    ///
    /// # Errors
    /// [`UnknownFabric`] naming the accepted values.
    pub fn parse(name: &str) -> Result<Self, UnknownFabric> {
        match name.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Fabric::Auto),
            "tcp" => Ok(Fabric::Tcp),
            "shm" => Ok(Fabric::Shm),
            "verbs" | "rdma" => Ok(Fabric::Verbs),
            other => Err(UnknownFabric(other.to_string())),
        }
    }

    /// The name [`Fabric::parse`] accepts for it.
    pub fn name(self) -> &'static str {
        match self {
            Fabric::Auto => "auto",
            Fabric::Tcp => "tcp",
            Fabric::Shm => "shm",
            Fabric::Verbs => "verbs",
        }
    }
}

impl std::fmt::Display for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A fabric that cannot reach an extent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreachable {
    #[error("fabric shm reaches only memory on the caller's own node ({mine}); an extent is on {extent}")]
    NotLocal { mine: String, extent: String },
    #[error("fabric shm maps only persistent allocations and a session's own node's memory; this allocation's session is on another node than {extent}: use auto or tcp")]
    NotMappable { extent: String },
    #[error("fabric verbs cannot reach {extent}: {why} (use auto to fall back to tcp)")]
    NoRdma { extent: String, why: String },
    #[error("fabric {fabric} cannot reach GPU memory on {extent}: {why} (use auto or tcp)")]
    DeviceMemory {
        fabric: &'static str,
        extent: String,
        why: &'static str,
    },
}

/// Whether both ends of a copy have the verbs fabric, and if not, why.
/// The reason is shared, so a client asking for every copy allocates
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rdma {
    Both,
    Unavailable(Arc<str>),
}

/// What an extent's bytes are, as far as reaching them goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Host memory of a node's pool; `rdma` when its agent registered it
    /// with its RDMA ports (every allocation on a node with verbs, unless
    /// the HCA refused).
    Host { rdma: bool },
    /// Host memory no process may map, not even on its node (a session's
    /// memory on another node than the session's, see
    /// [`crate::alloc::mappable_on`]): reached as from another node.
    Unmappable { rdma: bool },
    /// Device memory held by an agent; `rdma` when the agent registered it
    /// with its RDMA ports (GPUDirect RDMA).
    Gpu { rdma: bool },
}

/// Why verbs cannot reach host memory its agent did not register.
const HOST_NOT_REGISTERED: &str =
    "its agent registered no RDMA key for this memory (the HCA refused; the agent's log says why)";

/// Why verbs cannot reach device memory its agent did not register.
const GPU_NOT_REGISTERED: &str = "its agent could not register device memory with the HCA \
     (GPUDirect RDMA needs nvidia-peermem or dma-buf support; `ocmctl nodes` says why)";

/// The fabric a process on `my_node` (empty: not on any agent's node) uses
/// for an extent on `extent_node` holding `memory`, given its preference:
/// shared memory for its own node's host memory (unless no process may map
/// it, [`Memory::Unmappable`]), else RDMA verbs when both
/// ends have it (for device memory: when its agent registered it), else
/// TCP. Told TCP, always TCP; told shm or verbs, that or an error.
///
/// # Errors
/// [`Unreachable`] when shared memory is demanded for another node or for
/// device memory, or verbs where an end has none or the device memory is
/// not registered.
pub fn choose(
    extent_node: &str,
    memory: Memory,
    my_node: &str,
    preference: Fabric,
    rdma: &Rdma,
) -> Result<Fabric, Unreachable> {
    if let Memory::Gpu { rdma: registered } = memory {
        let why = match (preference, rdma) {
            (Fabric::Tcp, _) => return Ok(Fabric::Tcp),
            (Fabric::Auto | Fabric::Verbs, Rdma::Both) if registered => return Ok(Fabric::Verbs),
            (Fabric::Auto, _) => return Ok(Fabric::Tcp),
            (Fabric::Shm, _) => "shared memory cannot map device memory",
            (Fabric::Verbs, Rdma::Unavailable(why)) => {
                return Err(Unreachable::NoRdma {
                    extent: extent_node.into(),
                    why: why.to_string(),
                })
            }
            (Fabric::Verbs, Rdma::Both) => GPU_NOT_REGISTERED,
        };
        return Err(Unreachable::DeviceMemory {
            fabric: preference.name(),
            extent: extent_node.into(),
            why,
        });
    }
    let here = !my_node.is_empty() && extent_node == my_node;
    let same = here && matches!(memory, Memory::Host { .. });
    if here && preference == Fabric::Shm && !same {
        return Err(Unreachable::NotMappable {
            extent: extent_node.into(),
        });
    }
    let unregistered;
    let rdma = match (memory, rdma) {
        (Memory::Host { rdma: false } | Memory::Unmappable { rdma: false }, Rdma::Both) => {
            unregistered = Rdma::Unavailable(HOST_NOT_REGISTERED.into());
            &unregistered
        }
        _ => rdma,
    };
    match (preference, rdma) {
        (Fabric::Auto, _) if same => Ok(Fabric::Shm),
        (Fabric::Auto, Rdma::Both) => Ok(Fabric::Verbs),
        (Fabric::Auto | Fabric::Tcp, _) => Ok(Fabric::Tcp),
        (Fabric::Shm, _) if same => Ok(Fabric::Shm),
        (Fabric::Shm, _) => Err(Unreachable::NotLocal {
            mine: if my_node.is_empty() {
                "none".into()
            } else {
                my_node.into()
            },
            extent: extent_node.into(),
        }),
        (Fabric::Verbs, Rdma::Both) => Ok(Fabric::Verbs),
        (Fabric::Verbs, Rdma::Unavailable(why)) => Err(Unreachable::NoRdma {
            extent: extent_node.into(),
            why: why.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_nobody_may_map_is_reached_as_from_another_node() {
        let no = Rdma::Unavailable("no device".into());
        let copied = Memory::Unmappable { rdma: true };
        assert_eq!(
            choose("a", copied, "a", Fabric::Auto, &Rdma::Both),
            Ok(Fabric::Verbs)
        );
        assert_eq!(choose("a", copied, "a", Fabric::Auto, &no), Ok(Fabric::Tcp));
        assert_eq!(
            choose("a", copied, "a", Fabric::Shm, &Rdma::Both),
            Err(Unreachable::NotMappable { extent: "a".into() })
        );
        assert!(matches!(
            choose("b", copied, "a", Fabric::Shm, &no),
            Err(Unreachable::NotLocal { .. })
        ));
        // Unregistered, it is TCP's even where both ends have verbs.
        assert_eq!(
            choose(
                "a",
                Memory::Unmappable { rdma: false },
                "a",
                Fabric::Auto,
                &Rdma::Both
            ),
            Ok(Fabric::Tcp)
        );
    }

    #[test]
    fn same_node_is_shm_unless_told_tcp() {
        let no = Rdma::Unavailable("no device".into());
        assert_eq!(
            choose("a", Memory::Host { rdma: true }, "a", Fabric::Auto, &no),
            Ok(Fabric::Shm)
        );
        assert_eq!(
            choose("b", Memory::Host { rdma: true }, "a", Fabric::Auto, &no),
            Ok(Fabric::Tcp)
        );
        assert_eq!(
            choose("a", Memory::Host { rdma: true }, "a", Fabric::Tcp, &no),
            Ok(Fabric::Tcp)
        );
        assert_eq!(
            choose("a", Memory::Host { rdma: true }, "", Fabric::Auto, &no),
            Ok(Fabric::Tcp)
        );
        assert_eq!(
            choose("a", Memory::Host { rdma: true }, "a", Fabric::Shm, &no),
            Ok(Fabric::Shm)
        );
        let err = choose("b", Memory::Host { rdma: true }, "a", Fabric::Shm, &no).unwrap_err();
        assert!(err.to_string().contains("an extent is on b"), "{err}");
        assert_eq!(Fabric::parse("TCP"), Ok(Fabric::Tcp));
        assert_eq!(Fabric::parse("verbs"), Ok(Fabric::Verbs));
        assert!(Fabric::parse("ib").is_err());
        assert_eq!(Fabric::Shm.name(), "shm");
    }

    #[test]
    fn host_memory_without_a_key_is_never_verbs() {
        let plain = Memory::Host { rdma: false };
        assert_eq!(
            choose("b", plain, "a", Fabric::Auto, &Rdma::Both),
            Ok(Fabric::Tcp)
        );
        assert_eq!(
            choose("a", plain, "a", Fabric::Auto, &Rdma::Both),
            Ok(Fabric::Shm)
        );
        let err = choose("b", plain, "a", Fabric::Verbs, &Rdma::Both).unwrap_err();
        assert!(
            matches!(&err, Unreachable::NoRdma { why, .. } if why.contains("no RDMA key")),
            "{err}"
        );
    }

    #[test]
    fn verbs_when_both_ends_have_it_else_tcp_or_a_reason() {
        let no = Rdma::Unavailable("node b: no RDMA devices".into());
        assert_eq!(
            choose(
                "b",
                Memory::Host { rdma: true },
                "a",
                Fabric::Auto,
                &Rdma::Both
            ),
            Ok(Fabric::Verbs)
        );
        // Same node still prefers shared memory.
        assert_eq!(
            choose(
                "a",
                Memory::Host { rdma: true },
                "a",
                Fabric::Auto,
                &Rdma::Both
            ),
            Ok(Fabric::Shm)
        );
        assert_eq!(
            choose(
                "b",
                Memory::Host { rdma: true },
                "a",
                Fabric::Tcp,
                &Rdma::Both
            ),
            Ok(Fabric::Tcp)
        );
        assert_eq!(
            choose(
                "b",
                Memory::Host { rdma: true },
                "a",
                Fabric::Verbs,
                &Rdma::Both
            ),
            Ok(Fabric::Verbs)
        );
        let err = choose("b", Memory::Host { rdma: true }, "a", Fabric::Verbs, &no).unwrap_err();
        assert!(err.to_string().contains("no RDMA devices"), "{err}");
    }

    #[test]
    fn device_memory_takes_verbs_only_when_registered_and_never_shm() {
        let plain = Memory::Gpu { rdma: false };
        let direct = Memory::Gpu { rdma: true };
        let no = Rdma::Unavailable("node b: no RDMA devices".into());
        // Unregistered: TCP, even on the same node and with RDMA at both ends.
        assert_eq!(
            choose("a", plain, "a", Fabric::Auto, &Rdma::Both),
            Ok(Fabric::Tcp)
        );
        assert_eq!(
            choose("b", plain, "a", Fabric::Tcp, &Rdma::Both),
            Ok(Fabric::Tcp)
        );
        let err = choose("a", plain, "a", Fabric::Shm, &Rdma::Both).unwrap_err();
        assert!(
            err.to_string().contains("cannot map device memory"),
            "{err}"
        );
        let err = choose("b", plain, "a", Fabric::Verbs, &Rdma::Both).unwrap_err();
        assert!(err.to_string().contains("nvidia-peermem"), "{err}");
        // Registered: verbs where both ends have it, on the same node too.
        assert_eq!(
            choose("b", direct, "a", Fabric::Auto, &Rdma::Both),
            Ok(Fabric::Verbs)
        );
        assert_eq!(
            choose("a", direct, "a", Fabric::Auto, &Rdma::Both),
            Ok(Fabric::Verbs)
        );
        assert_eq!(
            choose("b", direct, "a", Fabric::Verbs, &Rdma::Both),
            Ok(Fabric::Verbs)
        );
        assert_eq!(
            choose("b", direct, "a", Fabric::Tcp, &Rdma::Both),
            Ok(Fabric::Tcp)
        );
        assert_eq!(choose("b", direct, "a", Fabric::Auto, &no), Ok(Fabric::Tcp));
        let err = choose("b", direct, "a", Fabric::Verbs, &no).unwrap_err();
        assert!(err.to_string().contains("no RDMA devices"), "{err}");
        let err = choose("a", direct, "a", Fabric::Shm, &Rdma::Both).unwrap_err();
        assert!(err.to_string().contains("cannot map"), "{err}");
    }
}
