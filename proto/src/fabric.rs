//! Which fabric reaches an extent: the one rule that the master (recording
//! what an allocation's creator will use) and liboncilla (choosing for
//! itself) both apply, so they can never disagree.
//!
//! It knows only what each fabric can reach; it never moves bytes.

use std::sync::Arc;

use crate::pb::Fabric;

/// A fabric that cannot reach an extent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreachable {
    #[error("fabric shm reaches only memory on the caller's own node ({mine}); an extent is on {extent}")]
    NotLocal { mine: String, extent: String },
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

/// The fabric a process on `my_node` (empty: not on any agent's node) uses
/// for an extent on `extent_node`, given its preference: shared memory for
/// its own node, else RDMA verbs when both ends have it, else TCP. Told
/// TCP, always TCP; told shm or verbs, that or an error. Device memory
/// held by an agent (`gpu`) is reached over TCP only: it cannot be mapped,
/// and RDMA to it would need GPUDirect registration, which is not built.
///
/// # Errors
/// [`Unreachable`] when shared memory is demanded for another node, or
/// verbs where an end has none, or either for device memory.
pub fn choose(
    extent_node: &str,
    gpu: bool,
    my_node: &str,
    preference: Fabric,
    rdma: &Rdma,
) -> Result<Fabric, Unreachable> {
    if gpu {
        let why = match preference {
            Fabric::Auto | Fabric::Tcp => return Ok(Fabric::Tcp),
            Fabric::Shm => "shared memory cannot map device memory",
            Fabric::Verbs => {
                "RDMA to device memory needs GPUDirect registration, which Oncilla does not do yet"
            }
        };
        return Err(Unreachable::DeviceMemory {
            fabric: name(preference),
            extent: extent_node.into(),
            why,
        });
    }
    let same = !my_node.is_empty() && extent_node == my_node;
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

/// Parses `ONCILLA_FABRIC`-style names: `auto`, `tcp`, `shm`, `verbs`.
///
/// # Errors
/// The accepted names, for anything else.
pub fn parse(name: &str) -> Result<Fabric, String> {
    match name.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => Ok(Fabric::Auto),
        "tcp" => Ok(Fabric::Tcp),
        "shm" => Ok(Fabric::Shm),
        "verbs" | "rdma" => Ok(Fabric::Verbs),
        other => Err(format!(
            "unknown fabric {other:?}; use auto, tcp, shm or verbs"
        )),
    }
}

/// The name `parse` accepts for `f`.
pub fn name(f: Fabric) -> &'static str {
    match f {
        Fabric::Auto => "auto",
        Fabric::Tcp => "tcp",
        Fabric::Shm => "shm",
        Fabric::Verbs => "verbs",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_node_is_shm_unless_told_tcp() {
        let no = Rdma::Unavailable("no device".into());
        assert_eq!(choose("a", false, "a", Fabric::Auto, &no), Ok(Fabric::Shm));
        assert_eq!(choose("b", false, "a", Fabric::Auto, &no), Ok(Fabric::Tcp));
        assert_eq!(choose("a", false, "a", Fabric::Tcp, &no), Ok(Fabric::Tcp));
        assert_eq!(choose("a", false, "", Fabric::Auto, &no), Ok(Fabric::Tcp));
        assert_eq!(choose("a", false, "a", Fabric::Shm, &no), Ok(Fabric::Shm));
        let err = choose("b", false, "a", Fabric::Shm, &no).unwrap_err();
        assert!(err.to_string().contains("an extent is on b"), "{err}");
        assert_eq!(parse("TCP"), Ok(Fabric::Tcp));
        assert_eq!(parse("verbs"), Ok(Fabric::Verbs));
        assert!(parse("ib").is_err());
        assert_eq!(name(Fabric::Shm), "shm");
    }

    #[test]
    fn verbs_when_both_ends_have_it_else_tcp_or_a_reason() {
        let no = Rdma::Unavailable("node b: no RDMA devices".into());
        assert_eq!(
            choose("b", false, "a", Fabric::Auto, &Rdma::Both),
            Ok(Fabric::Verbs)
        );
        // Same node still prefers shared memory.
        assert_eq!(
            choose("a", false, "a", Fabric::Auto, &Rdma::Both),
            Ok(Fabric::Shm)
        );
        assert_eq!(
            choose("b", false, "a", Fabric::Tcp, &Rdma::Both),
            Ok(Fabric::Tcp)
        );
        assert_eq!(
            choose("b", false, "a", Fabric::Verbs, &Rdma::Both),
            Ok(Fabric::Verbs)
        );
        let err = choose("b", false, "a", Fabric::Verbs, &no).unwrap_err();
        assert!(err.to_string().contains("no RDMA devices"), "{err}");
    }

    #[test]
    fn device_memory_is_tcp_only_even_on_the_same_node() {
        assert_eq!(
            choose("a", true, "a", Fabric::Auto, &Rdma::Both),
            Ok(Fabric::Tcp)
        );
        assert_eq!(
            choose("b", true, "a", Fabric::Tcp, &Rdma::Both),
            Ok(Fabric::Tcp)
        );
        let err = choose("a", true, "a", Fabric::Shm, &Rdma::Both).unwrap_err();
        assert!(
            err.to_string().contains("cannot map device memory"),
            "{err}"
        );
        let err = choose("b", true, "a", Fabric::Verbs, &Rdma::Both).unwrap_err();
        assert!(err.to_string().contains("GPUDirect"), "{err}");
    }
}
