//! How this process reaches each extent of an allocation, decided once when
//! the allocation is opened or attached ([`Route::decide`], with
//! [`oncilla_model::fabric::choose`]) and kept beside its descriptor.
//!
//! The one thing that stays live is whether verbs still reaches a node: the
//! verbs fabric forgets a node after a failed copy, so a [`Route::Verbs`]
//! extent is checked against it per copy (a cached lookup) and, under
//! `auto`, goes over TCP while verbs does not reach it. This module never
//! moves bytes and never talks to the cluster.

use oncilla_model::fabric::{self as choice, Rdma};
use oncilla_model::Fabric;

use crate::descriptor::Extent;
use crate::error::{Error, Result};

/// How one extent is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// This node's pool memory, mapped into this process: memcpy.
    Mapped,
    /// The node's TCP data port.
    Tcp,
    /// RDMA verbs (for device memory an agent registered: GPUDirect RDMA on
    /// its side). `fallback`: under `auto`, TCP while verbs does not reach
    /// the node; otherwise such a copy fails.
    Verbs { fallback: bool },
}

/// Where one piece of a copy goes, once the live verbs state is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hop {
    Mapped,
    Tcp,
    Verbs,
}

impl Route {
    /// The route to `extent` for a process on `my_node` (empty: none, so
    /// nothing is mapped) preferring `prefer`, with verbs as `rdma` says.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the preference cannot reach the extent.
    pub(crate) fn decide(
        extent: &Extent,
        my_node: &str,
        prefer: Fabric,
        rdma: &Rdma,
    ) -> Result<Self> {
        let chosen = choice::choose(&extent.node, extent.memory(), my_node, prefer, rdma)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        Ok(match chosen {
            Fabric::Shm => Route::Mapped,
            Fabric::Verbs => Route::Verbs {
                fallback: prefer == Fabric::Auto,
            },
            Fabric::Tcp | Fabric::Auto => Route::Tcp,
        })
    }

    /// Where a piece of `extent` goes now, given whether verbs reaches its
    /// node (`rdma`, asked only for verbs routes).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when verbs was demanded and no longer
    /// reaches the node.
    pub(crate) fn hop(self, extent: &Extent, rdma: impl FnOnce() -> Rdma) -> Result<Hop> {
        match self {
            Route::Mapped => Ok(Hop::Mapped),
            Route::Tcp => Ok(Hop::Tcp),
            Route::Verbs { fallback } => match rdma() {
                Rdma::Both => Ok(Hop::Verbs),
                Rdma::Unavailable(_) if fallback => Ok(Hop::Tcp),
                // The model's words for it: "fabric verbs cannot reach ...".
                rdma => choice::choose(&extent.node, extent.memory(), "", Fabric::Verbs, &rdma)
                    .map(|_| Hop::Verbs)
                    .map_err(|e| Error::InvalidArgument(e.to_string())),
            },
        }
    }

    /// The fabric this route stands for, for [`crate::Allocation::fabrics`].
    pub(crate) fn fabric(hop: Hop) -> Fabric {
        match hop {
            Hop::Mapped => Fabric::Shm,
            Hop::Tcp => Fabric::Tcp,
            Hop::Verbs => Fabric::Verbs,
        }
    }
}

/// The routes of every extent, in extent order.
///
/// # Errors
/// As [`Route::decide`], for the first extent the preference cannot reach.
pub(crate) fn decide_all(
    extents: &[Extent],
    my_node: &str,
    prefer: Fabric,
    rdma: impl Fn(&Extent) -> Rdma,
) -> Result<Vec<Route>> {
    extents
        .iter()
        .map(|e| Route::decide(e, my_node, prefer, &rdma(e)))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn extent(node: &str, gpu: bool, registered: bool) -> Extent {
        Extent {
            node: node.into(),
            alloc_offset: 0,
            len: 10,
            data_addr: String::new(),
            agent_addr: String::new(),
            pool_offset: 0,
            gpu: gpu.then_some(0),
            rdma: if registered {
                vec![crate::descriptor::RdmaRegion::default()]
            } else {
                Vec::new()
            },
            mappable: true,
        }
    }

    fn no() -> Rdma {
        Rdma::Unavailable(Arc::from("no device"))
    }

    #[test]
    fn routes_follow_preference_node_and_memory() {
        let host = extent("a", false, true);
        let gpu = extent("b", true, true);
        let bare_gpu = extent("b", true, false);
        let d = |e: &Extent, me: &str, f: Fabric, r: &Rdma| Route::decide(e, me, f, r);
        // This node's host memory is mapped unless told TCP.
        assert_eq!(
            d(&host, "a", Fabric::Auto, &Rdma::Both).ok(),
            Some(Route::Mapped)
        );
        assert_eq!(
            d(&host, "a", Fabric::Tcp, &Rdma::Both).ok(),
            Some(Route::Tcp)
        );
        // Nothing is mapped for a process on no node.
        assert_eq!(
            d(&host, "", Fabric::Auto, &Rdma::Both).ok(),
            Some(Route::Verbs { fallback: true })
        );
        assert_eq!(d(&host, "", Fabric::Auto, &no()).ok(), Some(Route::Tcp));
        assert_eq!(
            d(&host, "x", Fabric::Verbs, &Rdma::Both).ok(),
            Some(Route::Verbs { fallback: false })
        );
        assert!(matches!(
            d(&host, "x", Fabric::Verbs, &no()),
            Err(Error::InvalidArgument(m)) if m.contains("verbs cannot reach a")
        ));
        assert!(matches!(
            d(&host, "x", Fabric::Shm, &Rdma::Both),
            Err(Error::InvalidArgument(_))
        ));
        // Device memory: verbs only where its agent registered it.
        assert_eq!(
            d(&gpu, "a", Fabric::Auto, &Rdma::Both).ok(),
            Some(Route::Verbs { fallback: true })
        );
        assert_eq!(
            d(&bare_gpu, "a", Fabric::Auto, &Rdma::Both).ok(),
            Some(Route::Tcp)
        );
        assert!(d(&bare_gpu, "a", Fabric::Verbs, &Rdma::Both).is_err());
        assert!(d(&gpu, "b", Fabric::Shm, &Rdma::Both).is_err());
    }

    #[test]
    fn verbs_routes_follow_the_live_verbs_state() {
        let e = extent("b", false, true);
        let auto = Route::Verbs { fallback: true };
        let demanded = Route::Verbs { fallback: false };
        assert_eq!(auto.hop(&e, || Rdma::Both).ok(), Some(Hop::Verbs));
        assert_eq!(auto.hop(&e, no).ok(), Some(Hop::Tcp));
        assert_eq!(demanded.hop(&e, || Rdma::Both).ok(), Some(Hop::Verbs));
        assert!(matches!(
            demanded.hop(&e, no),
            Err(Error::InvalidArgument(m)) if m.contains("no device")
        ));
        // Fixed routes never ask.
        let never = || -> Rdma { panic!("asked") };
        assert_eq!(Route::Tcp.hop(&e, never).ok(), Some(Hop::Tcp));
        assert_eq!(Route::Mapped.hop(&e, never).ok(), Some(Hop::Mapped));
        assert_eq!(Route::fabric(Hop::Mapped), Fabric::Shm);
    }

    #[test]
    fn memory_nobody_may_map_is_copied_even_on_its_node() {
        let e = Extent {
            mappable: false,
            ..extent("a", false, true)
        };
        let d = |f: Fabric, r: &Rdma| Route::decide(&e, "a", f, r);
        assert_eq!(
            d(Fabric::Auto, &Rdma::Both).ok(),
            Some(Route::Verbs { fallback: true })
        );
        assert_eq!(d(Fabric::Auto, &no()).ok(), Some(Route::Tcp));
        assert!(matches!(
            d(Fabric::Shm, &Rdma::Both),
            Err(Error::InvalidArgument(m)) if m.contains("session is on another node")
        ));
    }

    #[test]
    fn decide_all_stops_at_the_first_unreachable_extent() {
        let es = [extent("a", false, true), extent("b", false, true)];
        let r = decide_all(&es, "a", Fabric::Auto, |_| no()).unwrap();
        assert_eq!(r, [Route::Mapped, Route::Tcp]);
        assert!(decide_all(&es, "a", Fabric::Shm, |_| no()).is_err());
    }
}
