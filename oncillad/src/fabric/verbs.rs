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
//!
//! It also registers device memory of `REMOTE_GPU` extents with every
//! opened port (GPUDirect RDMA, through nvidia-peermem or a dma-buf), so
//! clients READ and WRITE it with no staging through host memory; the
//! registration lives in the extent and is dropped before the memory.

use std::path::Path;

use oncilla_proto::pb;
use oncilla_proto::rdma::{self, Probe};

use oncilla_cuda::DeviceMem;

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

    pub(crate) fn start_at(root: &Path, wanted: &[String], pool: &Pool) -> Rdma {
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

/// Device memory registered with every opened port; dropping it
/// deregisters (before the memory is freed: see `held::GpuMemory`).
pub struct GpuRegistration {
    /// One region per port, for the extent's record.
    pub regions: Vec<pb::RdmaRegion>,
    /// How the HCA took it: "nvidia-peermem" or "dma-buf".
    pub how: &'static str,
    #[cfg(feature = "verbs")]
    _mrs: Vec<rdma::verbs::Mr>,
}

impl Rdma {
    /// Registers `mem` with every opened port (GPUDirect RDMA).
    ///
    /// # Errors
    /// Why not: no verbs on this node, or a port refused (neither
    /// nvidia-peermem nor dma-buf works).
    pub fn register_gpu(&self, mem: &DeviceMem) -> Result<GpuRegistration, String> {
        if let Some(why) = &self.probe.note {
            return Err(format!("verbs fabric unavailable: {why}"));
        }
        self.register_gpu_on(mem)
    }

    #[cfg(feature = "verbs")]
    fn register_gpu_on(&self, mem: &DeviceMem) -> Result<GpuRegistration, String> {
        let (addr, len) = mem.rdma_range();
        let mut regions = Vec::new();
        let mut mrs = Vec::new();
        let mut how = "";
        for port in &self.ports {
            // SAFETY: `mem` is live device memory of `len` bytes from
            // `addr` (page-rounded inside its device pages); the caller
            // keeps the registration beside `mem` and drops it first
            // (`held::GpuMemory` field order), and the agent posts no
            // requests of its own on it.
            let (mr, way) = unsafe {
                port.dev
                    .register_device(addr, len, || mem.dmabuf().map_err(|e| e.to_string()))
            }
            .map_err(|e| format!("{}: {e}", port.dev.port.label()))?;
            how = way;
            regions.push(pb::RdmaRegion {
                device: port.dev.port.device.clone(),
                port: port.dev.port.port,
                addr,
                rkey: mr.rkey(),
            });
            mrs.push(mr);
        }
        Ok(GpuRegistration {
            regions,
            how,
            _mrs: mrs,
        })
    }

    #[cfg(not(feature = "verbs"))]
    fn register_gpu_on(&self, _mem: &DeviceMem) -> Result<GpuRegistration, String> {
        Err("this build has no verbs support".into())
    }

    /// Whether this node's GPU memory can be registered with its ports,
    /// found by registering a small allocation on the first GPU: `(how,
    /// "")` when it can, `("", why)` when not. The agent reports both in
    /// `NodeInfo` (`gpu_rdma`, `gpu_rdma_note`).
    pub fn probe_gpu(&self, first_gpu: Option<u32>) -> (String, String) {
        let Some(index) = first_gpu else {
            return (String::new(), "no GPU on this node".into());
        };
        if let Some(why) = &self.probe.note {
            return (String::new(), format!("no verbs fabric: {why}"));
        }
        let tried = oncilla_cuda::Gpu::open(index)
            .and_then(|g| g.alloc(PROBE_BYTES))
            .map_err(|e| e.to_string())
            .and_then(|mem| self.register_gpu(&mem).map(|r| r.how));
        match tried {
            Ok(how) => {
                tracing::info!(
                    how,
                    "GPUDirect RDMA: device memory is registered with the RDMA ports"
                );
                (how.to_string(), String::new())
            }
            Err(why) => {
                tracing::info!("GPUDirect RDMA unavailable: {why}; GPU memory goes over tcp");
                (String::new(), why)
            }
        }
    }
}

/// Device memory registered at start to learn whether GPUDirect works.
const PROBE_BYTES: u64 = 2 << 20;

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

    #[test]
    fn gpudirect_is_reported_with_the_reason_it_is_missing() {
        let pool = Pool::new(PoolSpec::new(4 * 4096, HugePages::Off)).unwrap();
        let r = Rdma::start_at(Path::new("/nonexistent/infiniband"), &[], &pool);
        assert_eq!(
            r.probe_gpu(None),
            (String::new(), "no GPU on this node".to_string())
        );
        // A GPU without verbs: the verbs reason, before any driver call.
        let (how, why) = r.probe_gpu(Some(0));
        assert!(how.is_empty());
        assert!(
            why.starts_with("no verbs fabric: ") && why.contains("no RDMA"),
            "{why}"
        );
    }
}
