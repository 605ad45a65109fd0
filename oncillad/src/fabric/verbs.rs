//! The agent's RDMA side: finds the node's RDMA ports at start, registers
//! every pool slab once per opened port (one memory region per slab), and
//! answers `Agent.ConnectVerbs` with a queue pair connected to the
//! client's and the table of slab regions. After that the agent's CPU does
//! nothing per byte: clients READ and WRITE pool memory directly.
//!
//! The pair lives as long as the client keeps the `ConnectVerbs` stream
//! open; the agent destroys it when the stream ends (idle teardown, or the
//! client died). It never interprets allocation ids or keys: on RDMA the
//! protection boundary is the cluster token that `ConnectVerbs` requires
//! (ARCHITECTURE.md, "verbs").

use std::path::Path;

use oncilla_proto::pb;
use oncilla_proto::rdma::{self, Probe};

use crate::pool::Pool;

/// The node's RDMA state.
pub struct Rdma {
    probe: Probe,
    #[cfg(feature = "verbs")]
    ports: Vec<Registered>,
}

/// One opened port and the pool's slabs registered on it.
#[cfg(feature = "verbs")]
struct Registered {
    dev: std::sync::Arc<rdma::verbs::Device>,
    slabs: Vec<(pb::SlabRegion, rdma::verbs::Mr)>,
}

/// What a connected client holds on this agent: dropping it destroys the
/// agent's end of the pair.
pub struct Held {
    #[cfg(feature = "verbs")]
    _qp: rdma::verbs::Qp,
}

impl Rdma {
    /// Looks for RDMA ports (`wanted`: `--rdma-device`) and registers the
    /// pool on each one opened. Says once, in the log, why the fabric is
    /// unavailable when it is.
    pub fn start(wanted: &[String], pool: &Pool) -> Rdma {
        Self::start_at(Path::new(rdma::discover::SYSFS), wanted, pool)
    }

    fn start_at(root: &Path, wanted: &[String], pool: &Pool) -> Rdma {
        let probe = rdma::probe(root, wanted);
        #[cfg(feature = "verbs")]
        let mut me = Rdma {
            ports: Vec::new(),
            probe,
        };
        #[cfg(not(feature = "verbs"))]
        let me = Rdma { probe };
        #[cfg(feature = "verbs")]
        {
            let mut errors = Vec::new();
            for dev in &me.probe.devices {
                match register_pool(dev, pool) {
                    Ok(slabs) => me.ports.push(Registered {
                        dev: std::sync::Arc::clone(dev),
                        slabs,
                    }),
                    Err(e) => errors.push(format!("{}: {e}", dev.port.label())),
                }
            }
            if me.ports.is_empty() && me.probe.note.is_none() {
                me.probe.note = Some(format!("cannot register the pool: {}", errors.join("; ")));
            }
        }
        #[cfg(not(feature = "verbs"))]
        let _ = pool;
        match &me.probe.note {
            Some(why) => tracing::info!("verbs fabric unavailable: {why}; clients use tcp"),
            None => tracing::info!(
                ports = %me.labels(),
                slabs = pool.slabs().len(),
                "verbs fabric ready: pool registered once per port"
            ),
        }
        me
    }

    pub fn available(&self) -> bool {
        self.probe.available()
    }

    /// The node's RDMA ports for `NodeInfo`, and why verbs is unavailable
    /// (empty when it is available).
    pub fn report(&self) -> (Vec<pb::RdmaPort>, String) {
        (
            self.probe.to_wire(),
            self.probe.note.clone().unwrap_or_default(),
        )
    }

    fn labels(&self) -> String {
        #[cfg(feature = "verbs")]
        return self
            .ports
            .iter()
            .map(|p| p.dev.port.label())
            .collect::<Vec<_>>()
            .join(",");
        #[cfg(not(feature = "verbs"))]
        String::new()
    }

    /// Makes the agent's end of a queue pair towards the client's, on port
    /// `req.port_index` modulo the opened ports.
    ///
    /// # Errors
    /// `FAILED_PRECONDITION` with the reason when this node has no verbs;
    /// `INVALID_ARGUMENT` for an endpoint that cannot pair; `INTERNAL` when
    /// the HCA refuses.
    pub fn connect(
        &self,
        req: &pb::ConnectVerbsRequest,
    ) -> Result<(pb::ConnectVerbsReply, Held), tonic::Status> {
        if let Some(why) = &self.probe.note {
            return Err(tonic::Status::failed_precondition(format!(
                "verbs fabric unavailable on this node: {why}"
            )));
        }
        self.connect_on(req)
    }

    #[cfg(feature = "verbs")]
    fn connect_on(
        &self,
        req: &pb::ConnectVerbsRequest,
    ) -> Result<(pb::ConnectVerbsReply, Held), tonic::Status> {
        use tonic::Status;
        let client = req
            .client
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("no client endpoint"))?;
        let client = rdma::qp::Endpoint::from_wire(client).map_err(Status::invalid_argument)?;
        let port = &self.ports[req.port_index as usize % self.ports.len()];
        let mut qp = rdma::verbs::Qp::new(&port.dev, QP_DEPTH).map_err(Status::internal)?;
        qp.connect(&client).map_err(Status::invalid_argument)?;
        let reply = pb::ConnectVerbsReply {
            agent: Some(qp.endpoint().to_wire()),
            slabs: port.slabs.iter().map(|(r, _)| *r).collect(),
            device: port.dev.port.device.clone(),
            port: port.dev.port.port,
        };
        Ok((reply, Held { _qp: qp }))
    }

    #[cfg(not(feature = "verbs"))]
    fn connect_on(
        &self,
        _req: &pb::ConnectVerbsRequest,
    ) -> Result<(pb::ConnectVerbsReply, Held), tonic::Status> {
        Err(tonic::Status::failed_precondition(
            "verbs fabric unavailable on this node: this build has no verbs support",
        ))
    }
}

/// The agent's queue pairs only answer one-sided requests; their own send
/// queue stays empty, so a small depth is enough.
#[cfg(feature = "verbs")]
const QP_DEPTH: u32 = 16;

/// One memory region per slab, for remote READ and WRITE.
#[cfg(feature = "verbs")]
fn register_pool(
    dev: &std::sync::Arc<rdma::verbs::Device>,
    pool: &Pool,
) -> Result<Vec<(pb::SlabRegion, rdma::verbs::Mr)>, String> {
    let mut out = Vec::new();
    for slab in pool.slabs() {
        let len = usize::try_from(slab.len()).map_err(|_| "slab larger than memory".to_string())?;
        // SAFETY: the slab is mapped for the life of the pool, and the
        // agent holds the pool (`Arc`) and this `Rdma` (in the Agent
        // service) until the process exits. Should the slab ever be
        // unmapped first, the registration still pins its pages, so the
        // HCA can only touch those pages, never memory given to anyone else;
        // no request of ours is in flight on it (the agent posts none).
        let mr = unsafe { dev.register(slab.base(), len, true)? };
        out.push((
            pb::SlabRegion {
                pool_offset: slab.start(),
                len: slab.len(),
                addr: mr.addr,
                rkey: mr.rkey(),
            },
            mr,
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{HugePages, PoolSpec};

    #[test]
    fn no_devices_means_a_reason_and_a_refusal() {
        let pool = Pool::new(PoolSpec::new(4 * 4096, HugePages::Off)).unwrap();
        let r = Rdma::start_at(Path::new("/nonexistent/infiniband"), &[], &pool);
        assert!(!r.available());
        let (ports, note) = r.report();
        assert!(ports.is_empty());
        assert!(note.contains("no RDMA"), "{note}");
        let err = r
            .connect(&pb::ConnectVerbsRequest::default())
            .err()
            .unwrap();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.message().contains("unavailable"), "{}", err.message());
    }
}
