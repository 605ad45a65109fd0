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
#[cfg(feature = "verbs")]
mod failure;
// Only the engine uses these outside their tests.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
pub(crate) mod plan;
// Its size accessors serve its tests.
#[allow(dead_code)]
pub(crate) mod regcache;

#[cfg(feature = "verbs")]
use engine::VerbsFabric;

use std::sync::Arc;

use oncilla_model::fabric::Rdma;
use oncilla_proto::auth::Token;

use crate::error::{Error, Result};
use crate::fabric::tcp::IoBuf;
use crate::fabric::{Peer, Transport};
use crate::options::RdmaOptions;
use plan::{DevicePiece, Remote};

/// The verbs fabric as the data path sees it: the engine (feature `verbs`)
/// or, where it cannot run, why not. The only place the feature switches.
pub(crate) enum Verbs {
    /// Verbs reaches nothing from this process, for this reason.
    Off(Arc<str>),
    #[cfg(feature = "verbs")]
    On(Box<VerbsFabric>),
}

/// What a copy straight to or from device memory came to.
#[derive(Debug)]
pub(crate) enum DeviceOutcome {
    Moved,
    /// The HCA would not register the device memory (nothing moved): why.
    Refused(String),
}

impl Verbs {
    /// Opens the ports `opts` selects; bad settings leave verbs off with
    /// them as the reason. Never fails.
    pub(crate) fn new(token: Token, opts: &RdmaOptions) -> Self {
        #[cfg(feature = "verbs")]
        {
            if !opts.invalid.is_empty() {
                let bad: Vec<String> = opts.invalid.iter().map(ToString::to_string).collect();
                tracing::warn!("verbs fabric disabled: {}", bad.join("; "));
                return Verbs::Off(format!("this host: {}", bad.join("; ")).into());
            }
            let mut tuning = plan::Tuning::default();
            if let Some(c) = opts.chunk {
                tuning.chunk = c;
            }
            if let Some(w) = opts.window {
                tuning.window = w;
            }
            Verbs::On(Box::new(VerbsFabric::new(
                token,
                &opts.devices,
                tuning,
                opts.idle,
                opts.affinity,
            )))
        }
        #[cfg(not(feature = "verbs"))]
        {
            let _ = (token, opts);
            Verbs::Off(
                "this build has no verbs support (rebuild with `cargo build --features verbs`)"
                    .into(),
            )
        }
    }

    /// Whether verbs reaches `node` (agent at `agent_addr`), and if not,
    /// why (shared: asking allocates nothing).
    pub(crate) fn reachable(&self, node: &str, agent_addr: &str) -> Rdma {
        match self {
            Verbs::Off(why) => {
                let _ = (node, agent_addr);
                Rdma::Unavailable(Arc::clone(why))
            }
            #[cfg(feature = "verbs")]
            Verbs::On(engine) => match engine.reachable(node, agent_addr) {
                Ok(()) => Rdma::Both,
                Err(why) => Rdma::Unavailable(why),
            },
        }
    }

    /// Moves `pieces` (remote place, byte offset in `mem`, length) of
    /// allocation `to.alloc` straight between `to`'s memory and device
    /// memory of this process (GPUDirect RDMA).
    ///
    /// # Errors
    /// Failed completions and unreachable nodes; a registration the HCA
    /// refuses is [`DeviceOutcome::Refused`] instead.
    pub(crate) fn run_device(
        &self,
        to: Peer<'_>,
        mem: &oncilla_cuda::DeviceMem,
        pieces: &[DevicePiece<'_>],
        read: bool,
    ) -> Result<DeviceOutcome> {
        match self {
            Verbs::Off(why) => {
                let _ = (to, mem, pieces, read);
                Ok(DeviceOutcome::Refused(why.to_string()))
            }
            #[cfg(feature = "verbs")]
            Verbs::On(engine) => Ok(
                match engine.run_device(to.node, to.addr, to.alloc, mem, pieces, read)? {
                    Ok(()) => DeviceOutcome::Moved,
                    Err(why) => DeviceOutcome::Refused(why.to_string()),
                },
            ),
        }
    }
}

impl Transport for Verbs {
    type Piece<'a> = (Remote<'a>, IoBuf<'a>);

    /// Moves pieces (pool place on `to`, caller buffer) of allocation
    /// `to.alloc`, spread over this host's devices.
    fn execute(&self, to: Peer<'_>, pieces: &mut [Self::Piece<'_>]) -> Result<()> {
        match self {
            Verbs::Off(why) => Err(Error::Fabric {
                node: to.node.to_string(),
                addr: to.addr.to_string(),
                reason: format!(
                    "allocation {}: {} pieces planned over verbs where it is off: {why}",
                    to.alloc,
                    pieces.len()
                ),
            }),
            #[cfg(feature = "verbs")]
            Verbs::On(engine) => engine.run(to.node, to.addr, to.alloc, pieces),
        }
    }
}

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
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
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
