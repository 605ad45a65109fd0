//! The RDMA verbs fabric of the client: one-sided READ and WRITE straight
//! between caller memory and remote pools.
//!
//! [`plan`] cuts copies into work requests and keeps a window of them in
//! flight; [`regcache`] finds registrations of caller buffers again;
//! [`Affinity`] says where the progress thread runs. These build and are
//! tested everywhere. The engine that drives the HCA (`engine`, feature
//! `verbs`) connects queue pairs through `Agent.ConnectVerbs`, registers,
//! posts and polls. Nothing here chooses between fabrics: the data path
//! does, with [`oncilla_model::fabric::choose`].

#[cfg(feature = "verbs")]
mod engine;
pub mod plan;
pub mod regcache;

#[cfg(feature = "verbs")]
pub use engine::VerbsFabric;

/// Where the thread that posts and polls for one device runs (after Lu et
/// al.'s communication-thread affinity on OpenPOWER): off by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Affinity {
    /// Wherever the scheduler puts it.
    #[default]
    None,
    /// On the cores of the HCA's NUMA node.
    HcaSocket,
    /// On one core.
    Core(usize),
}

impl Affinity {
    /// Parses `none`, `hca-socket` or `core:N` (`ONCILLA_RDMA_AFFINITY`).
    ///
    /// # Errors
    /// The accepted forms.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "" | "none" => Ok(Affinity::None),
            "hca-socket" => Ok(Affinity::HcaSocket),
            other => other
                .strip_prefix("core:")
                .and_then(|n| n.parse().ok())
                .map(Affinity::Core)
                .ok_or_else(|| {
                    format!("unknown RDMA affinity {other:?}; use none, hca-socket or core:N")
                }),
        }
    }

    /// The CPUs the progress thread for an HCA on `numa_node` may run on;
    /// `None` for no pinning.
    ///
    /// # Errors
    /// The HCA's NUMA node is unknown or its CPU list cannot be read.
    pub fn cpus(
        self,
        sysroot: &std::path::Path,
        numa_node: i32,
    ) -> Result<Option<Vec<usize>>, String> {
        match self {
            Affinity::None => Ok(None),
            Affinity::Core(n) => Ok(Some(vec![n])),
            Affinity::HcaSocket if numa_node < 0 => {
                Err("hca-socket: the platform does not say which NUMA node the HCA is on".into())
            }
            Affinity::HcaSocket => {
                oncilla_proto::rdma::discover::numa_cpus(sysroot, numa_node).map(Some)
            }
        }
    }
}

/// Pins the calling thread to `cpus`.
///
/// # Errors
/// The kernel refuses (a CPU that does not exist or is not allowed).
pub fn pin_current_thread(cpus: &[usize]) -> Result<(), String> {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|e| format!("CPU {c}: {e}"))?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| format!("sched_setaffinity({cpus:?}): {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_policies_parse_and_resolve() {
        assert_eq!(Affinity::parse("none"), Ok(Affinity::None));
        assert_eq!(Affinity::parse(""), Ok(Affinity::None));
        assert_eq!(Affinity::parse("hca-socket"), Ok(Affinity::HcaSocket));
        assert_eq!(Affinity::parse("core:3"), Ok(Affinity::Core(3)));
        assert!(Affinity::parse("core:x").unwrap_err().contains("core:N"));
        let root = std::path::Path::new("/");
        assert_eq!(Affinity::None.cpus(root, 0), Ok(None));
        assert_eq!(Affinity::Core(1).cpus(root, 0), Ok(Some(vec![1])));
        assert!(Affinity::HcaSocket
            .cpus(root, -1)
            .unwrap_err()
            .contains("NUMA"));
        // Node 0 exists on every Linux machine.
        let cpus = Affinity::HcaSocket.cpus(root, 0).unwrap().unwrap();
        assert!(!cpus.is_empty());
        // Pinning to the CPUs we may already run on is always allowed.
        let mine = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        let allowed: Vec<usize> = (0..CpuCount::max())
            .filter(|&c| mine.is_set(c).unwrap_or(false))
            .collect();
        std::thread::spawn(move || pin_current_thread(&allowed).unwrap())
            .join()
            .unwrap();
    }

    struct CpuCount;
    impl CpuCount {
        fn max() -> usize {
            nix::sched::CpuSet::count()
        }
    }
}
