//! Where the thread that posts and polls for one RDMA device runs
//! (`ONCILLA_RDMA_AFFINITY`): the policy, the CPUs it names on this host,
//! and pinning the calling thread to them. A value of the options and a
//! tool of the verbs engine; it starts no thread of its own.

/// Where the thread that posts and polls for one device runs (after Lu et
/// al.'s communication-thread affinity on OpenPOWER): off by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
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
    /// [`AffinityError::Unknown`], which names the accepted forms.
    pub fn parse(s: &str) -> Result<Self, AffinityError> {
        match s.trim() {
            "" | "none" => Ok(Affinity::None),
            "hca-socket" => Ok(Affinity::HcaSocket),
            other => other
                .strip_prefix("core:")
                .and_then(|n| n.parse().ok())
                .map(Affinity::Core)
                .ok_or_else(|| AffinityError::Unknown(other.to_string())),
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
    ) -> Result<Option<Vec<usize>>, AffinityError> {
        match self {
            Affinity::None => Ok(None),
            Affinity::Core(n) => Ok(Some(vec![n])),
            Affinity::HcaSocket if numa_node < 0 => Err(AffinityError::NoNumaNode),
            Affinity::HcaSocket => oncilla_rdma::discover::numa_cpus(sysroot, numa_node)
                .map(Some)
                .map_err(AffinityError::CpuList),
        }
    }
}

/// Why the progress thread cannot be placed as asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AffinityError {
    /// Not `none`, `hca-socket` or `core:N`.
    #[error("unknown RDMA affinity {0:?}; use none, hca-socket or core:N")]
    Unknown(String),
    /// `hca-socket` where the platform gives no NUMA node for the HCA.
    #[error("hca-socket: the platform does not say which NUMA node the HCA is on")]
    NoNumaNode,
    /// The HCA's NUMA node's CPU list cannot be read or parsed.
    #[error(transparent)]
    CpuList(oncilla_rdma::RdmaError),
    /// A CPU number the CPU set cannot hold.
    #[error("CPU {cpu}: {source}")]
    Cpu { cpu: usize, source: nix::Error },
    /// The kernel refused the pinning.
    #[error("sched_setaffinity({cpus:?}): {source}")]
    Pin {
        cpus: Vec<usize>,
        source: nix::Error,
    },
}

/// Pins the calling thread to `cpus` (the engine's progress threads).
///
/// # Errors
/// The kernel refuses (a CPU that does not exist or is not allowed).
pub fn pin_current_thread(cpus: &[usize]) -> Result<(), AffinityError> {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c)
            .map_err(|source| AffinityError::Cpu { cpu: c, source })?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(|source| {
        AffinityError::Pin {
            cpus: cpus.to_vec(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_policies_parse_and_resolve() {
        assert_eq!(Affinity::parse("none").ok(), Some(Affinity::None));
        assert_eq!(Affinity::parse("").ok(), Some(Affinity::None));
        assert_eq!(
            Affinity::parse("hca-socket").ok(),
            Some(Affinity::HcaSocket)
        );
        assert_eq!(Affinity::parse("core:3").ok(), Some(Affinity::Core(3)));
        assert!(Affinity::parse("core:x")
            .unwrap_err()
            .to_string()
            .contains("core:N"));
        let root = std::path::Path::new("/");
        assert_eq!(Affinity::None.cpus(root, 0).ok(), Some(None));
        assert_eq!(Affinity::Core(1).cpus(root, 0).ok(), Some(Some(vec![1])));
        assert!(Affinity::HcaSocket
            .cpus(root, -1)
            .unwrap_err()
            .to_string()
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
