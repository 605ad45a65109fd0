//! Copies to and from an allocation by its descriptor, with the cluster
//! token and no session: the operator's `ocmctl put` / `ocmctl get`, and
//! tests that force a fabric or present a wrong token. Nothing is mapped
//! (the process is on no node), so every extent goes over TCP or verbs, as
//! the fabric preference and [`crate::route`] say.
//!
//! It never talks to the master: the caller fetched the descriptor (with
//! its access key) already. It never frees anything.

use oncilla_model::Fabric;
use oncilla_net::auth::Token;
use oncilla_net::credential::{Credential, Renewable};
use oncilla_net::tls::ClientTls;

use crate::descriptor::Descriptor;
use crate::error::Result;
use crate::fabric::tcp::IoBuf;
use crate::fabric::{DataPath, Target, Transfer};
use crate::options::{RdmaOptions, DEFAULT_STREAMS};
use crate::route::Route;

/// A data path outside any session, authenticated by the cluster token.
pub struct Operator {
    data: DataPath,
    fabric: Fabric,
}

impl Operator {
    /// Copies with `token` (over TLS trusting `tls` where the cluster's
    /// data ports speak it), the `auto` fabric, [`DEFAULT_STREAMS`]
    /// connections per node, and the environment's verbs settings.
    pub fn new(token: Token, tls: Option<ClientTls>) -> Self {
        Self {
            data: DataPath::new(
                Renewable::new(Credential::member(&token)),
                tls,
                DEFAULT_STREAMS,
                &RdmaOptions::from_vars(|k| std::env::var(k).ok()),
            ),
            fabric: Fabric::Auto,
        }
    }

    /// Uses `fabric` for every extent (`tcp` or `verbs` force one; `shm`
    /// reaches nothing from here).
    #[must_use]
    pub fn fabric(mut self, fabric: Fabric) -> Self {
        self.fabric = fabric;
        self
    }

    /// Copies `src` into the allocation `desc` describes, at `offset`.
    ///
    /// # Errors
    /// [`crate::Error::OutOfBounds`], [`crate::Error::InvalidArgument`]
    /// when the fabric cannot reach an extent, and the data path's
    /// failures (a wrong token is [`crate::Error::PermissionDenied`], a
    /// freed allocation [`crate::Error::NotFound`]).
    pub fn write(&self, desc: &Descriptor, offset: u64, src: &[u8]) -> Result<()> {
        self.run(desc, offset, IoBuf::Write(src))
    }

    /// Fills `dst` from the allocation `desc` describes, at `offset`.
    ///
    /// # Errors
    /// As [`Operator::write`].
    pub fn read(&self, desc: &Descriptor, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.run(desc, offset, IoBuf::Read(dst))
    }

    fn run(&self, desc: &Descriptor, offset: u64, buf: IoBuf<'_>) -> Result<()> {
        desc.check_range(offset, buf.len() as u64)?;
        let len = buf.len() as u64;
        // Only the extents this copy touches need a route (and ask verbs).
        let mut routes = vec![Route::Tcp; desc.extents.len()];
        for (i, extent, ..) in desc.pieces(offset, len) {
            routes[i] = match self.fabric {
                // Told TCP, the route is TCP whatever verbs can do: do not ask.
                Fabric::Tcp => Route::Tcp,
                prefer => Route::decide(extent, "", prefer, &self.data.rdma_for(extent))?,
            };
        }
        self.data.run([Transfer {
            target: Target {
                desc,
                routes: &routes,
                local: None,
            },
            offset,
            buf,
        }])
    }
}
