//! The RDMA verbs fabric of the client: one-sided READ and WRITE straight
//! between caller memory and remote pools.
//!
//! [`plan`] cuts copies into work requests and keeps a window of them in
//! flight; [`regcache`] finds registrations of caller buffers again;
//! where the progress thread runs is [`crate::affinity`]. These build and are
//! tested everywhere. The engine that drives the HCA (`engine`) connects
//! queue pairs through `Agent.ConnectVerbs`, registers, posts and polls;
//! it compiles in every build (without the `verbs` feature the RDMA
//! layer's stand-in opens no port, so the engine is never started). Nothing here chooses between fabrics: the data path
//! does, with [`oncilla_model::fabric::choose`].

mod engine;
mod failure;
pub(crate) mod plan;
// Its size accessors serve its tests.
#[allow(dead_code)]
pub(crate) mod regcache;

use engine::VerbsFabric;

use std::sync::Arc;

use oncilla_model::fabric::Rdma;
use oncilla_net::credential::Renewable;
use oncilla_net::tls::ClientTls;

use crate::descriptor::Extent;
use crate::error::{Error, Result};
use crate::fabric::tcp::IoBuf;
use crate::fabric::{Peer, Transport};
use crate::options::RdmaOptions;
use plan::{DevicePiece, Remote};

/// The verbs fabric as the data path sees it: the engine over this host's
/// opened ports or, where there are none, why not.
pub(crate) enum Verbs {
    /// Verbs reaches nothing from this process, for this reason.
    Off(Arc<str>),
    On(Box<VerbsFabric>),
}

/// What a copy straight to or from device memory came to.
#[derive(Debug)]
pub(crate) enum DeviceOutcome {
    Moved,
    /// The HCA would not register the device memory (nothing moved): why.
    Refused(String),
}

/// Where allocation offset `at` (inside `extent`) lies on its node, for verbs.
pub(crate) fn remote_at(extent: &Extent, at: u64) -> Remote<'_> {
    Remote {
        regions: &extent.rdma,
        at: at - extent.alloc_offset,
    }
}

/// A node's pieces as verbs work: each piece's place in the agent's
/// registered regions, with the caller's bytes.
pub(crate) fn work(pieces: Vec<super::Piece<'_>>) -> Vec<(Remote<'_>, IoBuf<'_>)> {
    pieces
        .into_iter()
        .map(|p| (remote_at(p.extent, p.at), p.buf))
        .collect()
}

impl Verbs {
    /// Opens the ports `opts` selects; bad settings leave verbs off with
    /// them as the reason. Never fails.
    pub(crate) fn new(credential: Renewable, tls: Option<ClientTls>, opts: &RdmaOptions) -> Self {
        if !opts.invalid.is_empty() {
            let bad: Vec<String> = opts.invalid.iter().map(ToString::to_string).collect();
            tracing::warn!("verbs fabric disabled: {}", bad.join("; "));
            return Verbs::Off(format!("this host: {}", bad.join("; ")).into());
        }
        let probe = oncilla_rdma::probe(
            std::path::Path::new(oncilla_rdma::discover::SYSFS),
            &opts.devices,
        );
        if let Some(why) = &probe.note {
            tracing::info!("verbs fabric unavailable: {why}; using tcp");
            return Verbs::Off(format!("this host: {why}").into());
        }
        let mut tuning = plan::Tuning::default();
        if let Some(c) = opts.chunk {
            tuning.chunk = c;
        }
        if let Some(w) = opts.window {
            tuning.window = w;
        }
        Verbs::On(Box::new(VerbsFabric::new(
            credential,
            tls,
            probe,
            tuning,
            opts.idle,
            opts.affinity,
        )))
    }

    /// Whether verbs reaches `node` (agent at `agent_addr`), and if not,
    /// why (shared: asking allocates nothing).
    pub(crate) fn reachable(&self, node: &str, agent_addr: &str) -> Rdma {
        match self {
            Verbs::Off(why) => Rdma::Unavailable(Arc::clone(why)),
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
            Verbs::Off(why) => Ok(DeviceOutcome::Refused(why.to_string())),
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
            Verbs::On(engine) => engine.run(to.node, to.addr, to.alloc, pieces),
        }
    }
}
