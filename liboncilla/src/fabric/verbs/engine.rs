//! The HCA side of the client's verbs fabric (feature `verbs`): opens
//! this host's RDMA ports once per process, connects a queue pair to each
//! remote agent per device on first use (`Agent.ConnectVerbs`), reuses it
//! for every allocation on that agent, and closes it after an idle time.
//!
//! A copy registers the caller's buffer (through the registration cache
//! where the HCA supports on-demand paging, else for the copy's duration),
//! or, up to [`BOUNCE_MAX`], is packed with the copy's other small pieces
//! into the device's pre-registered bounce buffers; then [`super::plan`]
//! posts and polls. Under memory pressure (the HCA refuses a registration
//! even after the cache let go of everything) the buffer is cut into
//! bounce-buffer parts instead: slower, never a failed copy. Every failure becomes a typed
//! error naming the node and the allocation ([`super::failure`]): a refused remote key is
//! [`Error::NotFound`] (the allocation was freed, or the agent restarted),
//! no answer is [`Error::NodeUnreachable`], anything else
//! [`Error::Fabric`]. The queue pair is then stopped before any buffer it
//! may still name is released, and dropped, so the next copy connects
//! afresh. A pair whose agent end is gone (the `ConnectVerbs` stream
//! ended) is replaced before it is used.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use oncilla_net::credential::Renewable;
use oncilla_net::tls::ClientTls;
use oncilla_proto::calls::{self, CallError};
use oncilla_rdma::verbs::{Device, Mr, Qp};
use oncilla_rdma::{Completion, Probe, RdmaError, Wr};

use super::failure::{settle, Failed, Place};
use super::plan::{self, DevicePiece, Piece, Queue, Remote, Tuning};
use super::regcache::{CacheError, RegCache, Register};
use crate::affinity::{pin_current_thread, Affinity, AffinityError};
use crate::error::{Error, Result};
use crate::fabric::tcp::IoBuf;

/// Copies up to this size go through a registered bounce buffer: a memcpy
/// is cheaper than registering a small buffer.
pub const BOUNCE_MAX: usize = 64 << 10;
/// Bounce buffers kept per device, and the most one round trip of a copy
/// uses: a copy of many small pieces (a batch) packs them and runs in
/// rounds of this many buffers.
const BOUNCE_KEEP: usize = 8;
/// Registered bytes the cache may hold.
const CACHE_LIMIT: u64 = 1 << 30;
/// Longest wait for an agent's answer to `ConnectVerbs`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One remote agent's queue pair on one of our devices.
struct Conn {
    qp: Qp,
    /// The agent's end: its device name and port number (regions are per
    /// port).
    port: (String, u32),
    /// The agent start that made its end: regions of another are refused.
    incarnation: u64,
    /// Cleared when the agent's end of the `ConnectVerbs` stream is gone
    /// (the agent stopped or restarted).
    alive: Arc<AtomicBool>,
    /// Dropping it ends the stream, which tears the agent's end down.
    _close: tokio::sync::oneshot::Sender<()>,
    last_use: Instant,
}

/// A queue pair slot: empty until first use, and again after an error or
/// an idle close.
type Slot = Arc<Mutex<Option<Conn>>>;
/// A device's spare bounce buffers, each with its registration.
type Bounce = Mutex<Vec<(Box<[u8]>, Mr)>>;

/// The verbs fabric of this process.
pub struct VerbsFabric {
    probe: Probe,
    /// Why this host cannot use verbs at all; `None` when it can.
    host: Option<Arc<str>>,
    credential: Renewable,
    /// The cluster CA, when agents' gRPC ports speak TLS.
    tls: Option<ClientTls>,
    /// Runs `ConnectVerbs` calls; `None` when it could not start (then
    /// `host` says so).
    rt: Option<crate::runtime::OwnRuntime>,
    /// Queue pair slots by agent address, one per local device.
    conns: Mutex<HashMap<String, Vec<Slot>>>,
    /// Nodes tried so far: `None` when verbs reaches them, else why not.
    nodes: Mutex<HashMap<String, Option<Arc<str>>>>,
    cache: Mutex<RegCache<Mr>>,
    /// Whether registrations follow the page tables (on-demand paging), so
    /// a cached one can never point at pages the buffer no longer has.
    odp: bool,
    bounce: Vec<Bounce>,
    tuning: Tuning,
    idle: Duration,
    /// Per device: the CPUs its progress thread is pinned to (`None`: not
    /// pinned), resolved once from the affinity policy, or why not.
    pins: Vec<std::result::Result<Option<Vec<usize>>, AffinityError>>,
}

impl VerbsFabric {
    /// The engine over the ports `probe` opened. Never fails:
    /// [`VerbsFabric::reachable`] says why it cannot be used.
    pub fn new(
        credential: Renewable,
        tls: Option<ClientTls>,
        mut probe: Probe,
        tuning: Tuning,
        idle: Duration,
        affinity: Affinity,
    ) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("oncilla-verbs")
            .enable_all()
            .build()
            .map_err(|e| {
                probe.note = Some(format!("cannot start the connection runtime: {e}"));
            })
            .ok()
            .map(crate::runtime::OwnRuntime::new);
        let odp = probe.devices.iter().all(|d| d.odp);
        let bounce = probe
            .devices
            .iter()
            .map(|_| Mutex::new(Vec::new()))
            .collect();
        match &probe.note {
            Some(why) => tracing::info!("verbs fabric unavailable: {why}; using tcp"),
            None => tracing::info!(
                ports = %probe.devices.iter().map(|d| d.port.label()).collect::<Vec<_>>().join(","),
                odp,
                chunk = tuning.chunk,
                window = tuning.window,
                affinity = ?affinity,
                "verbs fabric ready"
            ),
        }
        let sysroot = std::path::Path::new("/");
        let pins = probe
            .devices
            .iter()
            .map(|d| affinity.cpus(sysroot, d.port.numa_node))
            .collect();
        Self {
            host: probe
                .note
                .as_ref()
                .map(|why| format!("this host: {why}").into()),
            probe,
            credential,
            tls,
            rt,
            conns: Mutex::new(HashMap::new()),
            nodes: Mutex::new(HashMap::new()),
            cache: Mutex::new(RegCache::new(if odp { CACHE_LIMIT } else { 0 })),
            odp,
            bounce,
            tuning,
            idle,
            pins,
        }
    }

    /// Whether verbs reaches `node` (agent at `agent_addr`). The first ask
    /// for a node connects the first device's queue pair; the answer is
    /// kept, so later asks (one per piece of every copy) cost a lookup.
    ///
    /// # Errors
    /// Why not, once known, every time after.
    pub fn reachable(&self, node: &str, agent_addr: &str) -> std::result::Result<(), Arc<str>> {
        if let Some(why) = &self.host {
            return Err(Arc::clone(why));
        }
        if let Some(known) = lock(&self.nodes).get(node) {
            return known.as_ref().map_or(Ok(()), |why| Err(Arc::clone(why)));
        }
        let slot = self.slot(agent_addr, 0);
        let mut guard = lock(&slot);
        if guard.is_none() {
            match self.connect(node, agent_addr, 0) {
                Ok(c) => *guard = Some(c),
                Err(e) => return Err(self.refuse(node, &e.to_string())),
            }
        }
        lock(&self.nodes).insert(node.to_string(), None);
        Ok(())
    }

    /// Remembers that verbs does not reach `node`, and why.
    fn refuse(&self, node: &str, why: &str) -> Arc<str> {
        let why: Arc<str> = format!("{node}: {why}").into();
        lock(&self.nodes).insert(node.to_string(), Some(Arc::clone(&why)));
        why
    }

    /// Moves `pieces` (pool offset on `node`, caller buffer) of allocation
    /// `alloc_id`, spread over this host's devices.
    ///
    /// # Errors
    /// [`Error::Fabric`] naming the node and allocation for any failed
    /// completion; [`Error::NodeUnreachable`] when the pair cannot be set up.
    pub fn run(
        &self,
        node: &str,
        agent_addr: &str,
        alloc_id: u64,
        pieces: &mut [(Remote<'_>, IoBuf<'_>)],
    ) -> Result<()> {
        let n = self.probe.devices.len().max(1);
        // Pinning applies to a progress thread of our own, never to the
        // caller's thread.
        let pinned = self.pins.iter().any(|p| !matches!(p, Ok(None)));
        if (n == 1 || pieces.len() == 1) && !pinned {
            return self.run_on(0, node, agent_addr, alloc_id, pieces);
        }
        // Several devices at once: a contiguous share of the pieces each.
        let per = pieces.len().div_ceil(n);
        std::thread::scope(|s| {
            let handles: Vec<_> = pieces
                .chunks_mut(per)
                .enumerate()
                .map(|(dev, part)| {
                    s.spawn(move || self.run_on(dev, node, agent_addr, alloc_id, part))
                })
                .collect();
            crate::fabric::join_first_error(handles, Ok(()))
        })
    }

    fn run_on(
        &self,
        dev: usize,
        node: &str,
        agent_addr: &str,
        alloc_id: u64,
        pieces: &mut [(Remote<'_>, IoBuf<'_>)],
    ) -> Result<()> {
        let at = Place {
            node,
            addr: agent_addr,
            alloc_id,
        };
        self.with_conn(dev, &at, |conn| self.copy(dev, &at, conn, pieces))
            .map_err(Failed::into_error)
    }

    /// Moves `pieces` (remote place, byte offset in `mem`, length) of
    /// allocation `alloc_id` on `node` straight between the remote memory
    /// and device memory of this process (GPUDirect RDMA): `mem` is
    /// registered with the first device for the copy's duration, through
    /// nvidia-peermem or a dma-buf.
    ///
    /// # Errors
    /// A registration the HCA refuses is `Ok(Err(why))`, so the caller can
    /// stage through host memory instead; failed completions and
    /// unreachable nodes are `Err`.
    pub fn run_device(
        &self,
        node: &str,
        agent_addr: &str,
        alloc_id: u64,
        mem: &oncilla_cuda::DeviceMem,
        pieces: &[DevicePiece<'_>],
        read: bool,
    ) -> Result<std::result::Result<(), RdmaError>> {
        let dev = 0;
        let device = &self.probe.devices[dev];
        let (base, len) = mem.rdma_range();
        // SAFETY: `mem` is live device memory of `len` bytes from `base`
        // (page-rounded inside its device pages), borrowed for this whole
        // call; the registration is dropped below, after `plan::run` has
        // seen the completion covering the last request.
        let registered = unsafe { device.register_device(base, len, || mem.dmabuf()) };
        let mr = match registered {
            Ok((mr, _)) => mr,
            Err(why) => return Ok(Err(why)),
        };
        let place = Place {
            node,
            addr: agent_addr,
            alloc_id,
        };
        let go = || {
            self.with_conn(dev, &place, |conn| {
                let port = (conn.port.0.as_str(), conn.port.1);
                let mut work = Vec::with_capacity(pieces.len());
                for &(at, offset, n) in pieces {
                    let (remote, rkey) = plan::locate(at, port, conn.incarnation)
                        .map_err(|e| place.unaddressable(e))?;
                    work.push(Piece {
                        local: base + offset,
                        lkey: mr.lkey(),
                        remote,
                        rkey,
                        len: n,
                        read,
                    });
                }
                let wrs = plan::plan(&work, &self.tuning);
                let outcome = plan::run(&mut Hca(&mut conn.qp), &wrs, &self.tuning);
                settle(&mut conn.qp, &place, outcome)
            })
        };
        // Pinning applies to a progress thread of our own, never to the
        // caller's thread.
        let outcome = if matches!(self.pins[dev], Ok(None)) {
            go()
        } else {
            std::thread::scope(|s| {
                s.spawn(go).join().unwrap_or_else(|_| {
                    // The thread may have died with requests posted.
                    Err(Failed::Unfenced(Error::Internal(
                        "verbs thread panicked".into(),
                    )))
                })
            })
        };
        match outcome {
            Err(Failed::Unfenced(e)) => {
                // The pair could not be stopped: the HCA may still act on
                // the device memory, so the registration stays.
                std::mem::forget(mr);
                Err(e)
            }
            other => {
                drop(mr);
                other.map(Ok).map_err(Failed::into_error)
            }
        }
    }

    /// Runs `f` on the queue pair of (agent, device `dev`), connecting it
    /// first if needed and replacing it if the agent's end is gone; a
    /// failure drops the pair and, unless it only says the allocation is
    /// gone, forgets that verbs reaches the node, so the next copy asks
    /// again (and goes over TCP if the agent's RDMA port went away).
    ///
    /// A pair that stalled (no completion before the deadline, the HCA's
    /// retries ran out, or it was found already in error) was stopped before `f` returned, so nothing
    /// it posted can still land: `f` runs once more on a fresh pair, and
    /// only a second stall reports the node unreachable. Repeating a copy
    /// is harmless: it moves the same bytes to the same places.
    fn with_conn(
        &self,
        dev: usize,
        at: &Place<'_>,
        mut f: impl FnMut(&mut Conn) -> std::result::Result<(), Failed>,
    ) -> std::result::Result<(), Failed> {
        let mut outcome = self.on_conn(dev, at, &mut f);
        if let Err(Failed::Stalled(e)) = &outcome {
            tracing::warn!(
                node = at.node,
                error = %e,
                "verbs queue pair stalled; running the copy again on a fresh pair"
            );
            outcome = self.on_conn(dev, at, &mut f);
        }
        if let Err(failed) = &outcome {
            if !matches!(failed.error(), Error::NotFound(_)) {
                let mut nodes = lock(&self.nodes);
                // A refusal just learnt stays; a "reachable" is asked again.
                if matches!(nodes.get(at.node), Some(None)) {
                    nodes.remove(at.node);
                }
            }
        }
        outcome
    }

    fn on_conn(
        &self,
        dev: usize,
        at: &Place<'_>,
        f: &mut impl FnMut(&mut Conn) -> std::result::Result<(), Failed>,
    ) -> std::result::Result<(), Failed> {
        match &self.pins[dev] {
            Ok(None) => {}
            Ok(Some(cpus)) => pin_current_thread(cpus).map_err(|e| at.fabric(e))?,
            Err(e) => return Err(at.fabric(e).into()),
        }
        let slot = self.slot(at.addr, dev);
        let mut guard = lock(&slot);
        if guard
            .as_ref()
            .is_some_and(|c| !c.alive.load(Ordering::Acquire))
        {
            tracing::info!(
                node = at.node,
                "the agent's end of a verbs queue pair is gone; connecting again"
            );
            *guard = None;
        }
        if guard.is_none() {
            *guard = Some(self.connect(at.node, at.addr, dev)?);
        }
        let Some(conn) = guard.as_mut() else {
            return Err(Error::Internal("verbs connection vanished".into()).into());
        };
        conn.last_use = Instant::now();
        let outcome = f(conn);
        if outcome.is_err() {
            // Stopped (or unusable) after a failure: the next copy connects
            // afresh.
            *guard = None;
        }
        outcome
    }

    /// The connection slot for (agent, device), closing idle ones on the way.
    fn slot(&self, agent_addr: &str, dev: usize) -> Slot {
        let mut conns = lock(&self.conns);
        let now = Instant::now();
        for s in conns.values().flatten() {
            if let Ok(mut c) = s.try_lock() {
                if c.as_ref()
                    .is_some_and(|c| now.duration_since(c.last_use) > self.idle)
                {
                    tracing::debug!("closing an idle verbs queue pair");
                    *c = None;
                }
            }
        }
        if !conns.contains_key(agent_addr) {
            let slots = self.probe.devices.iter().map(|_| Slot::default()).collect();
            conns.insert(agent_addr.to_string(), slots);
        }
        conns
            .get(agent_addr)
            .and_then(|slots| slots.get(dev))
            .map_or_else(Slot::default, Arc::clone)
    }

    fn connect(&self, node: &str, agent_addr: &str, dev: usize) -> Result<Conn> {
        let device = &self.probe.devices[dev];
        let unreachable = |reason: String| Error::NodeUnreachable {
            node: node.to_string(),
            addr: agent_addr.to_string(),
            reason,
        };
        let mut qp = Qp::new(
            device,
            u32::try_from(self.tuning.window).unwrap_or(64).max(16),
        )
        .map_err(|e| {
            unreachable(format!(
                "cannot create a queue pair on {}: {e}",
                device.port.label()
            ))
        })?;
        let rt = self
            .rt
            .as_ref()
            .ok_or_else(|| unreachable("no runtime for ConnectVerbs".into()))?;
        // The lazy channel spawns its connection task on the current
        // runtime: callers are plain threads, so enter ours first.
        let _in_rt = rt.enter();
        let channel = oncilla_proto::client::lazy_as(
            agent_addr,
            &self.credential.current(),
            self.tls.as_ref(),
        )
        .map_err(|e| unreachable(e.to_string()))?;
        let client = calls::Agent::new(channel);
        let port_index = u32::try_from(dev).unwrap_or(0);
        let endpoint = qp.endpoint();
        let reply = rt
            .block_on(async {
                tokio::time::timeout(CONNECT_TIMEOUT, client.connect_verbs(&endpoint, port_index))
                    .await
                    .unwrap_or_else(|_| {
                        Err(tonic::Status::deadline_exceeded(format!(
                            "no answer in {CONNECT_TIMEOUT:?}"
                        ))
                        .into())
                    })
            })
            .map_err(|e| match e {
                CallError::Rpc(s) if s.code() == tonic::Code::FailedPrecondition => {
                    // The agent answers but has no verbs (any more): the
                    // next copy goes over TCP.
                    self.refuse(node, s.message());
                    tracing::info!(node, "verbs unavailable: {}; using tcp", s.message());
                    Error::Fabric {
                        node: node.to_string(),
                        addr: agent_addr.to_string(),
                        reason: format!("ConnectVerbs: {}", s.message()),
                    }
                }
                e => unreachable(format!("ConnectVerbs: {e}")),
            })?;
        qp.connect(&reply.agent)
            .map_err(|e| unreachable(e.to_string()))?;
        // The stream stays open while the pair lives: it ends when we drop
        // `close`, or when the agent goes away, which clears `alive`.
        let alive = Arc::new(AtomicBool::new(true));
        let (close, closed) = tokio::sync::oneshot::channel::<()>();
        let watch = Arc::clone(&alive);
        let (device_name, port, incarnation) =
            (reply.device.clone(), reply.port, reply.incarnation);
        rt.spawn(async move {
            tokio::select! {
                _ = closed => {}
                () = reply.ended() => {}
            }
            watch.store(false, Ordering::Release);
        });
        tracing::info!(node, device = %device.port.label(), remote = %format!("{device_name}:{port}"), "verbs queue pair connected");
        Ok(Conn {
            qp,
            port: (device_name, port),
            incarnation,
            alive,
            _close: close,
            last_use: Instant::now(),
        })
    }

    /// Copies every piece over `conn`'s pair: larger pieces from their
    /// registered buffers, small ones packed into bounce buffers, and so
    /// are pieces whose buffers the HCA will not register (the
    /// locked-memory limit, even after the registration cache let go of
    /// everything), cut into bounce-buffer parts. One round trip carries
    /// the registered pieces and as many parts as [`BOUNCE_KEEP`] buffers
    /// hold; further rounds the rest of the parts.
    fn copy(
        &self,
        dev: usize,
        at: &Place<'_>,
        conn: &mut Conn,
        pieces: &mut [(Remote<'_>, IoBuf<'_>)],
    ) -> std::result::Result<(), Failed> {
        let device = &self.probe.devices[dev];
        let port = (conn.port.0.as_str(), conn.port.1);
        // Addresses first: a refusal here has taken no resource yet.
        let remotes = pieces
            .iter()
            .map(|(r, _)| plan::locate(*r, port, conn.incarnation))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| at.unaddressable(e))?;
        let mut work = Vec::with_capacity(pieces.len());
        // Registrations (and bounce buffers) that must outlive the requests.
        let mut held = Held::default();
        // Parts to go through bounce buffers, with their remote address and key.
        let mut parts = Vec::new();
        for (i, ((_, buf), (remote, rkey))) in pieces.iter().zip(remotes).enumerate() {
            let len = buf.len();
            if len > BOUNCE_MAX {
                let addr = buf.as_ptr() as u64;
                match self.register(device, addr, len as u64) {
                    Ok(mr) => {
                        work.push(Piece {
                            local: addr,
                            lkey: mr.lkey(),
                            remote,
                            rkey,
                            len: len as u64,
                            read: matches!(buf, IoBuf::Read(_)),
                        });
                        held.registered.push(mr);
                        continue;
                    }
                    Err(why) => tracing::debug!(
                        node = at.node,
                        len,
                        "registration refused ({why}); staging through bounce buffers"
                    ),
                }
            }
            parts.extend((0..len).step_by(BOUNCE_MAX).map(|offset| {
                let part = Part {
                    piece: i,
                    offset,
                    len: (len - offset).min(BOUNCE_MAX),
                };
                (part, remote + offset as u64, rkey)
            }));
        }
        let mut rest = &parts[..];
        loop {
            let taken = match self.pack(dev, device, pieces, rest, &mut held, &mut work) {
                Ok(n) => n,
                Err(e) => {
                    self.release(dev, held);
                    return Err(at.fabric(e).into());
                }
            };
            rest = &rest[taken..];
            self.finish(dev, at, conn, &work, std::mem::take(&mut held), pieces)?;
            if rest.is_empty() {
                return Ok(());
            }
            work.clear();
        }
    }

    /// Packs the first of `parts` one after another into at most
    /// [`BOUNCE_KEEP`] bounce buffers (filled first where the copy writes)
    /// kept in `held`, and adds their requests to `work`. Returns how many
    /// parts it took: at least one, when there are any.
    fn pack(
        &self,
        dev: usize,
        device: &Arc<Device>,
        pieces: &[(Remote<'_>, IoBuf<'_>)],
        parts: &[(Part, u64, u32)],
        held: &mut Held,
        work: &mut Vec<Piece>,
    ) -> std::result::Result<usize, RdmaError> {
        let mut taken = 0;
        // Bytes used in the last buffer; "full" until there is one.
        let mut fill = BOUNCE_MAX;
        for &(part, remote, rkey) in parts {
            if fill + part.len > BOUNCE_MAX {
                if held.buffers.len() == BOUNCE_KEEP {
                    break;
                }
                held.buffers.push(self.take_bounce(dev, device)?);
                fill = 0;
            }
            let b = held.buffers.len() - 1;
            let (bounce, mr) = &mut held.buffers[b];
            let buf = &pieces[part.piece].1;
            if let IoBuf::Write(src) = buf {
                bounce[fill..fill + part.len]
                    .copy_from_slice(&src[part.offset..part.offset + part.len]);
            }
            work.push(Piece {
                local: mr.addr + fill as u64,
                lkey: mr.lkey(),
                remote,
                rkey,
                len: part.len as u64,
                read: matches!(buf, IoBuf::Read(_)),
            });
            held.staged.push((part, b, fill));
            fill += part.len;
            taken += 1;
        }
        Ok(taken)
    }

    /// Runs `work` on `conn` and settles it: on success the bounce buffers
    /// of reads are copied out to their pieces; what `held` holds is given
    /// back unless the pair could not be stopped.
    fn finish(
        &self,
        dev: usize,
        at: &Place<'_>,
        conn: &mut Conn,
        work: &[Piece],
        held: Held,
        pieces: &mut [(Remote<'_>, IoBuf<'_>)],
    ) -> std::result::Result<(), Failed> {
        let wrs = plan::plan(work, &self.tuning);
        let outcome = plan::run(&mut Hca(&mut conn.qp), &wrs, &self.tuning);
        let outcome = settle(&mut conn.qp, at, outcome);
        if let Err(Failed::Unfenced(_)) = &outcome {
            // The pair could not be stopped: the HCA may still write into
            // the bounce buffers or read the registrations, so they stay.
            std::mem::forget(held);
            return outcome;
        }
        if outcome.is_ok() {
            for &(part, b, at) in &held.staged {
                if let IoBuf::Read(dst) = &mut pieces[part.piece].1 {
                    dst[part.offset..part.offset + part.len]
                        .copy_from_slice(&held.buffers[b].0[at..at + part.len]);
                }
            }
        }
        self.release(dev, held);
        outcome
    }

    /// A registration of a caller buffer: from the cache where the HCA
    /// pages on demand, else for this copy alone. A refused registration
    /// (the locked-memory limit) first empties the cache and tries again.
    fn register(
        &self,
        device: &Arc<Device>,
        addr: u64,
        len: u64,
    ) -> std::result::Result<Arc<Mr>, CacheError<RdmaError>> {
        if !self.odp {
            return Registrar(device)
                .register(addr, len)
                .map(Arc::new)
                .map_err(CacheError::Register);
        }
        let mut cache = lock(&self.cache);
        match cache.get(&Registrar(device), addr, len) {
            Ok(mr) => Ok(mr),
            Err(first) => {
                let freed = cache.clear();
                tracing::debug!(
                    freed,
                    "registration refused ({first}); emptied the registration cache"
                );
                cache.get(&Registrar(device), addr, len)
            }
        }
    }

    /// Gives back what a copy held, once no request can use it.
    fn release(&self, dev: usize, held: Held) {
        for (b, mr) in held.buffers {
            self.give_bounce(dev, b, mr);
        }
    }

    fn take_bounce(
        &self,
        dev: usize,
        device: &Arc<Device>,
    ) -> std::result::Result<(Box<[u8]>, Mr), RdmaError> {
        if let Some(b) = lock(&self.bounce[dev]).pop() {
            return Ok(b);
        }
        let mut b = vec![0u8; BOUNCE_MAX].into_boxed_slice();
        // SAFETY: the box is heap memory that moves with the registration
        // (the pair is kept together in the bounce list and dropped MR
        // first, see `give_bounce`), so it stays mapped while registered.
        let mr = unsafe { device.register(b.as_mut_ptr(), b.len(), false)? };
        Ok((b, mr))
    }

    fn give_bounce(&self, dev: usize, b: Box<[u8]>, mr: Mr) {
        let mut list = lock(&self.bounce[dev]);
        if list.len() < BOUNCE_KEEP {
            list.push((b, mr));
        } else {
            drop(mr);
            drop(b);
        }
    }
}

/// Registrations and bounce buffers a round's requests name.
#[derive(Default)]
struct Held {
    registered: Vec<Arc<Mr>>,
    buffers: Vec<(Box<[u8]>, Mr)>,
    /// The parts packed into `buffers`: each with its buffer and its
    /// offset there.
    staged: Vec<(Part, usize, usize)>,
}

/// Bytes `offset..offset + len` of piece `piece`'s buffer.
#[derive(Debug, Clone, Copy)]
struct Part {
    piece: usize,
    offset: usize,
    len: usize,
}

/// Registers caller buffers on one device for local access.
struct Registrar<'a>(&'a Arc<Device>);

impl Register for Registrar<'_> {
    type Region = Mr;
    type Error = RdmaError;
    fn register(&self, addr: u64, len: u64) -> std::result::Result<Mr, RdmaError> {
        let len = usize::try_from(len).map_err(|_| RdmaError::TooLong {
            what: "buffer",
            len,
        })?;
        // SAFETY: `addr..addr+len` is (a page-widened cover of) a caller
        // buffer borrowed for the whole copy. Without on-demand paging the
        // registration is dropped when the copy ends; with it the cache may
        // keep it, and the HCA then follows the page tables, so a later
        // unmap or remap of that memory cannot leave it pointing at stale
        // pages.
        unsafe { self.0.register(addr as *mut u8, len, false) }
    }
}

/// The HCA as the planner's queue.
struct Hca<'a>(&'a mut Qp);

impl Queue for Hca<'_> {
    fn post(&mut self, wrs: &[Wr]) -> std::result::Result<(), RdmaError> {
        // SAFETY: every request names a registered range of a buffer (or
        // bounce buffer) that `copy` keeps borrowed and registered until
        // `plan::run` has seen a completion covering the last request.
        unsafe { self.0.post(wrs) }
    }

    fn poll(&mut self, out: &mut [Completion]) -> std::result::Result<usize, RdmaError> {
        self.0.poll(out)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every holder leaves the state consistent before it can panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
