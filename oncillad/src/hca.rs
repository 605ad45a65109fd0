//! The node's RDMA ports and every registration made on them: finds the
//! ports at start, registers each allocation's memory with every opened
//! port when it is reserved (one memory region per pool extent, so a
//! remote key opens that allocation's bytes and nothing else) and lets the
//! keys be revoked when it is released ([`crate::memory::keys`] keeps
//! them beside the memory), registers device memory of `REMOTE_GPU`
//! extents (GPUDirect RDMA, through nvidia-peermem or a dma-buf), and lets
//! go of a port whose device goes away ([`Rdma::sweep`]).
//!
//! A key revoked here is never handed out again by this agent start: a new
//! registration whose key matches one of the last
//! [`crate::memory::keys::RETIRED_KEPT`] revoked on that port is made
//! again, so a stale key held by a client can never open a later tenant's
//! memory. Keys of an earlier agent start are refused by the client itself
//! (regions carry the agent's incarnation).
//!
//! It sits below `agent` (which registers what it reserves) and `fabric`
//! (whose `verbs` module pairs queue pairs on these ports) and imports
//! neither. It never interprets allocation ids or access keys and never
//! reaches the network. It compiles one code path in every build: without
//! the `verbs` feature the RDMA layer opens no port, so there is nothing
//! to register.

use std::path::Path;

use oncilla_model::alloc::RdmaRegion;
use oncilla_model::node::RdmaPort;
use oncilla_rdma::discover::Port;
use oncilla_rdma::{self as rdma, Probe, RdmaError};

use oncilla_cuda::DeviceMem;

use crate::memory::keys::Retired;
use crate::memory::keys::{GpuRegistration, Keys};
use crate::pool::Pool;

/// How the node's RDMA work went so far (read by the metrics).
#[derive(Debug, Default)]
pub struct RdmaCounts {
    /// Queue pairs made towards clients.
    pub pairs: std::sync::atomic::AtomicU64,
    /// Queue pairs the HCA or the client's endpoint refused.
    pub pair_failures: std::sync::atomic::AtomicU64,
    /// Host memory registrations refused.
    pub host_failures: std::sync::atomic::AtomicU64,
    /// Device memory registered (GPUDirect RDMA).
    pub gpu: std::sync::atomic::AtomicU64,
    /// Device memory registrations refused.
    pub gpu_failures: std::sync::atomic::AtomicU64,
}

pub(crate) fn count(c: &std::sync::atomic::AtomicU64) {
    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The node's RDMA state.
pub struct Rdma {
    /// What was found and opened at start (the opened devices move to
    /// `ports`), and why verbs is unavailable.
    probe: Probe,
    /// Outcomes so far, for metrics.
    pub counts: RdmaCounts,
    /// The opened ports by index (stable for the agent's life: keys and
    /// retired keys name ports by it); `None` once its device went away.
    ports: std::sync::RwLock<Vec<Option<std::sync::Arc<rdma::verbs::Device>>>>,
    /// The ports that went away: index and label.
    removed: std::sync::Mutex<Vec<(usize, String)>>,
    /// Bumped each time a port goes away: ends its queue pairs' streams.
    gone: tokio::sync::watch::Sender<u64>,
    retired: std::sync::Arc<Retired>,
}

/// Why the agent could not make a queue pair or a registration. The gRPC
/// edge turns it into a status (see each variant).
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// This node has no verbs fabric now (`FAILED_PRECONDITION`).
    #[error("verbs fabric unavailable on this node: {0}")]
    Unavailable(String),
    /// The two endpoints cannot pair, or the HCA refused the transitions
    /// towards the client (`INVALID_ARGUMENT`).
    #[error(transparent)]
    Pair(RdmaError),
    /// The HCA cannot make the queue pair (`INTERNAL`).
    #[error(transparent)]
    Hca(RdmaError),
    /// A host registration failed.
    #[error(transparent)]
    Register(RdmaError),
    /// Device memory: no verbs fabric to register it with.
    #[error("verbs fabric unavailable: {0}")]
    GpuUnavailable(String),
    /// Device memory: a port refused it (neither nvidia-peermem nor
    /// dma-buf works).
    #[error("{port}: {source}")]
    RegisterGpu { port: String, source: RdmaError },
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every holder leaves the state consistent before it can panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Attempts at a registration whose key was not revoked recently.
const FRESH_KEY_TRIES: usize = 16;

/// A port as `NodeInfo` reports it.
fn port_info(p: &Port) -> RdmaPort {
    RdmaPort {
        device: p.device.clone(),
        port: p.port,
        link_layer: p.link_layer.clone(),
        state: p.state.clone(),
        active_mtu: p.active_mtu,
        gids: u32::try_from(p.gids.len()).unwrap_or(u32::MAX),
        numa_node: p.numa_node,
        lid: p.lid,
        rate: p.rate.clone(),
    }
}

impl Rdma {
    /// Looks for RDMA ports (`wanted`: `--rdma-device`) and checks that
    /// each opened one registers pool memory for remote access. Says once,
    /// in the log, why the fabric is unavailable when it is.
    pub fn start(wanted: &[String], pool: &Pool) -> Rdma {
        Self::start_at(Path::new(rdma::discover::SYSFS), wanted, pool)
    }

    pub(crate) fn start_at(root: &Path, wanted: &[String], pool: &Pool) -> Rdma {
        let mut probe = rdma::probe(root, wanted);
        {
            // One page of the pool, registered and released on every port:
            // a memlock limit or an HCA that refuses shows here, not at the
            // first allocation.
            let page = pool.slabs().first().map(|s| (s.base(), pool.page_size()));
            let mut errors = Vec::new();
            probe.devices.retain(|dev| {
                let Some((base, len)) = page else { return true };
                let Ok(len) = usize::try_from(len) else {
                    return true;
                };
                // SAFETY: the page is mapped for the life of the pool, which
                // outlives this call; the registration is dropped at once and
                // nothing is posted on it.
                match unsafe { dev.register(base, len, true) } {
                    Ok(_) => true,
                    Err(e) => {
                        errors.push(format!("{}: {e}", dev.port.label()));
                        false
                    }
                }
            });
            if probe.devices.is_empty() && probe.note.is_none() {
                probe.note = Some(format!(
                    "cannot register pool memory: {}",
                    errors.join("; ")
                ));
            }
        }
        let me = Rdma {
            counts: RdmaCounts::default(),
            ports: std::sync::RwLock::new(
                std::mem::take(&mut probe.devices)
                    .into_iter()
                    .map(Some)
                    .collect(),
            ),
            removed: std::sync::Mutex::default(),
            gone: tokio::sync::watch::Sender::new(0),
            retired: std::sync::Arc::default(),
            probe,
        };
        match &me.probe.note {
            Some(why) => tracing::info!("verbs fabric unavailable: {why}; clients use tcp"),
            None => tracing::info!(
                ports = %me.labels(),
                "verbs fabric ready: allocations are registered when reserved"
            ),
        }
        me
    }

    /// Whether clients can use verbs to this node now.
    pub fn available(&self) -> bool {
        self.unavailable().is_none()
    }

    /// Why clients cannot use verbs to this node now; `None` when they can.
    pub(crate) fn unavailable(&self) -> Option<String> {
        if let Some(why) = &self.probe.note {
            return Some(why.clone());
        }
        if self.live().is_empty() {
            return Some(format!(
                "every opened RDMA port went away while the agent ran ({})",
                lock(&self.removed)
                    .iter()
                    .map(|(_, l)| l.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        None
    }

    /// The node's RDMA ports for `NodeInfo` (those that went away say
    /// `REMOVED`), and why verbs is unavailable (empty when it is
    /// available).
    pub fn report(&self) -> (Vec<RdmaPort>, String) {
        let mut ports: Vec<RdmaPort> = self.probe.ports().iter().map(port_info).collect();
        {
            let live = self.live();
            let removed = lock(&self.removed);
            for p in &mut ports {
                let label = format!("{}:{}", p.device, p.port);
                if let Some((_, d)) = live.iter().find(|(_, d)| d.port.label() == label) {
                    *p = port_info(&d.port);
                } else if removed.iter().any(|(_, l)| *l == label) {
                    p.state = "REMOVED".into();
                }
            }
        }
        (ports, self.unavailable().unwrap_or_default())
    }

    fn labels(&self) -> String {
        self.live()
            .iter()
            .map(|(_, d)| d.port.label())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The ports still there, with their indices.
    pub(crate) fn live(&self) -> Vec<(usize, std::sync::Arc<rdma::verbs::Device>)> {
        self.ports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.as_ref().map(|d| (i, std::sync::Arc::clone(d))))
            .collect()
    }

    /// Takes out every port whose device went away, and returns their
    /// indices and labels: the caller drops every registration on them
    /// (the allocations' [`Keys`], GPU registrations), after which nothing
    /// of this process holds the device. Cheap (one sysfs read per port):
    /// the agent calls it every second.
    pub fn sweep(&self) -> Vec<(usize, String)> {
        {
            let gone: Vec<(usize, String)> = self
                .live()
                .iter()
                .filter(|(_, d)| !d.present())
                .map(|(i, d)| (*i, d.port.label()))
                .collect();
            if gone.is_empty() {
                return gone;
            }
            {
                let mut ports = self.ports.write().unwrap_or_else(|e| e.into_inner());
                for (i, _) in &gone {
                    ports[*i] = None;
                }
            }
            lock(&self.removed).extend(gone.iter().cloned());
            self.gone.send_modify(|n| *n += 1);
            gone
        }
    }

    /// Indices of the ports that went away (registrations made on one
    /// while [`Rdma::sweep`] took it out are dropped against this list).
    pub fn removed_ports(&self) -> Vec<usize> {
        lock(&self.removed).iter().map(|(i, _)| *i).collect()
    }

    /// Returns once port `port` has gone away (never, while it is there):
    /// a queue pair's stream waits on it to end with its port.
    pub async fn removed(&self, port: usize) {
        {
            let mut changes = self.gone.subscribe();
            loop {
                if !self.live().iter().any(|(i, _)| *i == port) {
                    return;
                }
                if changes.changed().await.is_err() {
                    break;
                }
            }
        }
        std::future::pending::<()>().await;
    }

    /// Registers host memory `ranges` (address, length) of one allocation
    /// with every opened port. Returns the keys and, per range, its regions
    /// (one per port, `incarnation` left 0 for the caller to stamp). On a
    /// node without verbs: no keys and no regions.
    ///
    /// # Safety
    /// Every range must be pool memory that stays mapped while the keys
    /// live (the caller keeps them beside the memory and drops them first).
    ///
    /// # Errors
    /// A port refused a registration (memlock limit, HCA resources).
    pub unsafe fn register_host(
        &self,
        ranges: &[(*mut u8, u64)],
    ) -> Result<(Keys, Vec<Vec<RdmaRegion>>), VerbsError> {
        if !self.available() {
            return Ok((Keys::none(), vec![Vec::new(); ranges.len()]));
        }
        {
            let keys = Keys::remembered_in(std::sync::Arc::clone(&self.retired));
            let mut regions = vec![Vec::new(); ranges.len()];
            for (port, dev) in &self.live() {
                let port = *port;
                for (i, &(addr, len)) in ranges.iter().enumerate() {
                    let len = usize::try_from(len).map_err(|_| {
                        VerbsError::Register(RdmaError::TooLong {
                            what: "extent",
                            len,
                        })
                    })?;
                    // SAFETY: the caller keeps the range mapped while the
                    // keys live; the agent posts nothing on it.
                    let mr = unsafe { self.fresh(port, dev, addr, len) }.map_err(|e| {
                        count(&self.counts.host_failures);
                        VerbsError::Register(e)
                    })?;
                    regions[i].push(RdmaRegion {
                        device: dev.port.device.clone(),
                        port: dev.port.port,
                        addr: mr.addr,
                        rkey: mr.rkey(),
                        incarnation: 0,
                    });
                    keys.push(port, mr);
                }
            }
            Ok((keys, regions))
        }
    }

    /// A registration of `addr..+len` on `dev` whose key was not revoked
    /// recently on that port.
    ///
    /// # Safety
    /// As [`rdma::verbs::Device::register`].
    unsafe fn fresh(
        &self,
        port: usize,
        dev: &std::sync::Arc<rdma::verbs::Device>,
        addr: *mut u8,
        len: usize,
    ) -> Result<rdma::verbs::Mr, RdmaError> {
        // Refused registrations are kept until a fresh key comes, so the
        // HCA cannot hand the same key straight back.
        let mut stale = Vec::new();
        for _ in 0..FRESH_KEY_TRIES {
            // SAFETY: forwarded from the caller.
            let mr = unsafe { dev.register(addr, len, true)? };
            if !self.retired.contains((port, mr.rkey())) {
                return Ok(mr);
            }
            stale.push(mr);
        }
        Err(RdmaError::StaleKeys {
            port: dev.port.label(),
            tries: FRESH_KEY_TRIES,
        })
    }
}

impl Rdma {
    /// Registers `mem` with every opened port (GPUDirect RDMA).
    ///
    /// # Errors
    /// Why not: no verbs on this node, or a port refused (neither
    /// nvidia-peermem nor dma-buf works).
    pub fn register_gpu(&self, mem: &DeviceMem) -> Result<GpuRegistration, VerbsError> {
        if let Some(why) = self.unavailable() {
            return Err(VerbsError::GpuUnavailable(why));
        }
        let registered = self.register_gpu_on(mem);
        count(match &registered {
            Ok(_) => &self.counts.gpu,
            Err(_) => &self.counts.gpu_failures,
        });
        registered
    }

    fn register_gpu_on(&self, mem: &DeviceMem) -> Result<GpuRegistration, VerbsError> {
        let (addr, len) = mem.rdma_range();
        let mut regions = Vec::new();
        let mut mrs = Vec::new();
        let mut how = "";
        for (port, dev) in &self.live() {
            // SAFETY: `mem` is live device memory of `len` bytes from
            // `addr` (page-rounded inside its device pages); the caller
            // keeps the registration beside `mem` and drops it first
            // (`held::GpuMemory` field order), and the agent posts no
            // requests of its own on it.
            let (mr, way) =
                unsafe { dev.register_device(addr, len, || mem.dmabuf()) }.map_err(|source| {
                    VerbsError::RegisterGpu {
                        port: dev.port.label(),
                        source,
                    }
                })?;
            how = way;
            regions.push(RdmaRegion {
                device: dev.port.device.clone(),
                port: dev.port.port,
                addr,
                rkey: mr.rkey(),
                incarnation: 0,
            });
            mrs.push((*port, mr));
        }
        Ok(GpuRegistration::new(regions, how, mrs))
    }

    /// Whether this node's GPU memory can be registered with its ports,
    /// found by registering a small allocation on the first GPU: `(how,
    /// "")` when it can, `("", why)` when not. The agent reports both in
    /// `NodeInfo` (`gpu_rdma`, `gpu_rdma_note`).
    pub fn probe_gpu(&self, first_gpu: Option<u32>) -> (String, String) {
        let Some(index) = first_gpu else {
            return (String::new(), "no GPU on this node".into());
        };
        if let Some(why) = self.unavailable() {
            return (String::new(), format!("no verbs fabric: {why}"));
        }
        let tried = oncilla_cuda::Gpu::open(index)
            .and_then(|g| g.alloc(PROBE_BYTES))
            .map_err(|e| e.to_string())
            .and_then(|mem| {
                self.register_gpu(&mem)
                    .map(|r| r.how)
                    .map_err(|e| e.to_string())
            });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{Access, HugePages, PoolSpec};

    #[test]
    fn a_port_reports_its_gid_count() {
        let p = Port {
            device: "mlx5_0".into(),
            port: 1,
            link_layer: "InfiniBand".into(),
            state: "ACTIVE".into(),
            lid: 0x1a,
            gids: vec![(0, String::new())],
            numa_node: 1,
            rate: "100 Gb/sec (4X EDR)".into(),
            active_mtu: 4096,
        };
        let w = port_info(&p);
        assert_eq!(w.gids, 1);
        assert_eq!((w.device.as_str(), w.port, w.lid), ("mlx5_0", 1, 0x1a));
        assert_eq!(w.active_mtu, 4096);
    }

    #[test]
    fn no_devices_means_a_reason_and_a_refusal() {
        let pool = Pool::new(PoolSpec::new(4 * 4096, HugePages::Off)).unwrap();
        let r = Rdma::start_at(Path::new("/nonexistent/infiniband"), &[], &pool);
        assert!(!r.available());
        let (ports, note) = r.report();
        assert!(ports.is_empty());
        assert!(note.contains("no RDMA"), "{note}");
    }

    #[test]
    fn no_keys_without_verbs_and_revoking_is_idempotent() {
        let pool = Pool::new(PoolSpec::new(4 * 4096, HugePages::Off)).unwrap();
        let r = Rdma::start_at(Path::new("/nonexistent/infiniband"), &[], &pool);
        let e = pool.reserve(4096, None, Access::Mapped).unwrap().remove(0);
        // SAFETY: the extent is pool memory alive for the whole test.
        let (keys, regions) = unsafe { r.register_host(&[(e.ptr(0), e.len())]) }.unwrap();
        assert_eq!(keys.count(), 0);
        assert_eq!(regions, vec![Vec::new()]);
        keys.revoke();
        keys.revoke();
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
