//! What an application asks for: size, kind, placement, name, lifetime and
//! fabric. Pure data with builders; checked into the model's request in one
//! place ([`AllocSpec::to_model`]). It never talks to the cluster.

use oncilla_model::alloc::{self as model, NodeShare, Placement};
pub use oncilla_model::{Fabric, Kind, Policy};

use crate::error::{Error, Result};

/// What to allocate.
#[derive(Debug, Clone)]
pub struct AllocSpec {
    pub size: u64,
    pub kind: Kind,
    pub policy: Policy,
    /// Named nodes with weights (a transparent request); empty lets the
    /// policy choose.
    pub nodes: Vec<(String, u32)>,
    /// Round-robin unit in bytes (multiple of 4 KiB); 0 for one contiguous
    /// range per node.
    pub stripe: u64,
    /// A name makes the allocation persistent and attachable by name.
    pub name: Option<String>,
    /// Outlive this session until freed explicitly.
    pub persistent: bool,
    /// Any user may attach it (a persistent allocation); otherwise only
    /// processes of this process's user.
    pub shared: bool,
    /// Overrides the session's fabric preference for this allocation.
    pub fabric: Option<Fabric>,
    /// GPU kinds: the device index on the node (unset: any with room).
    pub gpu: Option<u32>,
    /// Copies of every byte, each on another node (1: no replica).
    pub replicas: u32,
}

impl AllocSpec {
    /// `size` bytes of `kind`, placed by the default policy, owned by the session.
    pub fn new(size: u64, kind: Kind) -> Self {
        Self {
            size,
            kind,
            policy: Policy::default(),
            nodes: Vec::new(),
            stripe: 0,
            name: None,
            persistent: false,
            shared: false,
            fabric: None,
            gpu: None,
            replicas: 1,
        }
    }

    /// Split equally over these nodes.
    #[must_use]
    pub fn on_nodes<S: Into<String>>(self, nodes: impl IntoIterator<Item = S>) -> Self {
        self.on_weighted_nodes(nodes.into_iter().map(|n| (n, 1)))
    }

    /// Split over these nodes in proportion to their weights.
    #[must_use]
    pub fn on_weighted_nodes<S: Into<String>>(
        mut self,
        nodes: impl IntoIterator<Item = (S, u32)>,
    ) -> Self {
        self.nodes = nodes.into_iter().map(|(n, w)| (n.into(), w)).collect();
        self
    }

    /// Place by this policy (ignored when nodes are named).
    #[must_use]
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Deal the allocation out in chunks of `unit` bytes, node after node.
    #[must_use]
    pub fn stripe(mut self, unit: u64) -> Self {
        self.stripe = unit;
        self
    }

    /// Name it: it outlives this process and others can attach it.
    #[must_use]
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Keep the allocation after the session ends.
    #[must_use]
    pub fn persistent(mut self) -> Self {
        self.persistent = true;
        self
    }

    /// Let processes of any user attach it (by default only those of this
    /// process's user, and operators, may).
    #[must_use]
    pub fn shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// GPU kinds: put it on device `index` (of this node for
    /// [`Kind::LocalGpu`], of the one named node for [`Kind::RemoteGpu`]).
    #[must_use]
    pub fn gpu(mut self, index: u32) -> Self {
        self.gpu = Some(index);
        self
    }

    /// Keep `copies` copies of every byte (1 to 3), each on another node
    /// and, where nodes declare zones, in another zone: reads survive the
    /// loss of a copy's node. Remote host memory over TCP only; every
    /// write goes to the primary copy, which copies it to the others before
    /// it returns.
    #[must_use]
    pub fn replicas(mut self, copies: u32) -> Self {
        self.replicas = copies;
        self
    }

    /// Use this fabric for this allocation.
    #[must_use]
    pub fn fabric(mut self, fabric: Fabric) -> Self {
        self.fabric = Some(fabric);
        self
    }

    /// The request as the model checks it (`AllocSpec::new`: the size
    /// limit, names, node lists), with `default_fabric` where none was set.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`], in the master's words for the same
    /// refusal.
    pub(crate) fn to_model(&self, default_fabric: Fabric) -> Result<model::AllocSpec> {
        let placement = Placement {
            policy: self.policy,
            nodes: self
                .nodes
                .iter()
                .map(|(node, weight)| NodeShare {
                    node: node.clone(),
                    weight: *weight,
                })
                .collect(),
            stripe: self.stripe,
            gpu: self.gpu,
            replicas: self.replicas,
        };
        // A replicated allocation is reached over TCP whatever the
        // session prefers; only an explicit other fabric is refused.
        let fabric = match self.fabric {
            Some(f) => f,
            None if placement.copies() > 1 => Fabric::Tcp,
            None => default_fabric,
        };
        model::AllocSpec::new(
            self.size,
            self.kind,
            placement,
            self.name.clone().unwrap_or_default(),
            self.persistent,
            fabric,
        )
        .map(|spec| spec.shared(self.shared))
        .map_err(|e| Error::InvalidArgument(format!("invalid request: {e}")))
    }
}
