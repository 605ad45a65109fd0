//! The daemon's Prometheus metrics: one registry, the families in it, and
//! the samplers that read state at scrape time (pool, sessions, listeners,
//! the master's table). Counters and histograms on the data path are
//! recorded by the servers themselves through [`data::Transfers`], before
//! the reply that completes a request and outside any lock. The endpoint that serves them is
//! [`serve`].
//!
//! It only observes: nothing here changes a pool, a table or a connection.

pub mod data;
pub mod serve;

use std::sync::{Arc, Mutex};

use oncilla_model::alloc::Health;
use oncilla_model::node::NodeState;
use oncilla_model::Kind;
use prometheus::{Encoder, Gauge, GaugeVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::agent::Agent;
use crate::master::seat::Seat;
use crate::master::AgentLink;

/// Reads state into gauges just before a scrape.
type Sampler = Box<dyn Fn() + Send + Sync>;

/// A counter that follows a running total kept elsewhere (an atomic of
/// the code it observes): each scrape adds what is new.
pub(crate) struct Mirror {
    counter: prometheus::IntCounter,
    seen: std::sync::atomic::AtomicU64,
}

impl Mirror {
    pub(crate) fn new(counter: prometheus::IntCounter) -> Self {
        Self {
            counter,
            seen: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(crate) fn follow(&self, total: u64) {
        let before = self.seen.swap(total, std::sync::atomic::Ordering::Relaxed);
        self.counter.inc_by(total.saturating_sub(before));
    }
}

/// Every metric family of this daemon.
pub struct Metrics {
    registry: Registry,
    samplers: Mutex<Vec<Sampler>>,
    /// The TCP data server's counters (registered with the agent role).
    pub data: Arc<data::Transfers>,
}

/// `made` (a family built from constant options), registered with `r`.
/// Options and names are constants: a bad one is a bug in this module,
/// caught by its test; a clash at registration is logged, never a panic.
fn registered<C: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    name: &str,
    made: prometheus::Result<C>,
) -> C {
    let c = made.unwrap_or_else(|e| unreachable_metric(name, &e));
    if let Err(e) = r.register(Box::new(c.clone())) {
        tracing::error!(error = %e, metric = name, "a metric could not be registered");
    }
    c
}

fn counter(r: &Registry, name: &str, help: &str) -> prometheus::IntCounter {
    registered(r, name, prometheus::IntCounter::new(name, help))
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::IntCounterVec {
    registered(
        r,
        name,
        prometheus::IntCounterVec::new(Opts::new(name, help), labels),
    )
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    registered(r, name, IntGauge::new(name, help))
}

fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    registered(r, name, IntGaugeVec::new(Opts::new(name, help), labels))
}

fn float_gauge(r: &Registry, name: &str, help: &str) -> Gauge {
    registered(r, name, Gauge::new(name, help))
}

fn float_gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    registered(r, name, GaugeVec::new(Opts::new(name, help), labels))
}

/// A metric whose constant options prometheus refused: a bug in this
/// file, found by `every_family_renders_and_names_follow_the_conventions`.
#[allow(clippy::panic)]
fn unreachable_metric(name: &str, e: &prometheus::Error) -> ! {
    panic!("metric {name}: {e}")
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let registry = Registry::new();
        let data = Arc::new(data::Transfers::new(&registry));
        Arc::new(Self {
            registry,
            samplers: Mutex::new(Vec::new()),
            data,
        })
    }

    fn sample(&self, f: Sampler) {
        self.samplers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(f);
    }

    /// The agent role's gauges: its pool, sessions and mappings.
    pub fn watch_agent(&self, agent: &Arc<Agent>) {
        let r = &self.registry;
        let pool = gauge_vec(
            r,
            "oncilla_pool_bytes",
            "Bytes of this agent's pool, by state: capacity, used (held by allocations), free, refilling (freed, being zeroed or backed anew), largest_free (the largest hole).",
            &["state"],
        );
        let page = gauge(
            r,
            "oncilla_pool_page_size_bytes",
            "Page size backing the pool.",
        );
        let allocations = gauge(
            r,
            "oncilla_pool_allocations",
            "Allocations with memory on this node.",
        );
        let sessions = gauge(
            r,
            "oncilla_agent_sessions",
            "Application sessions open on this agent.",
        );
        let leases = gauge(
            r,
            "oncilla_agent_map_leases",
            "Same-node mappings handed to local processes and not yet given back.",
        );
        let rdma = gauge(
            r,
            "oncilla_rdma_registrations",
            "RDMA memory registrations held for allocations on this node (one per pool extent per port).",
        );
        let pairs = counter_vec(
            r,
            "oncilla_rdma_queue_pairs_total",
            "Queue pairs this agent made towards clients (ConnectVerbs), by outcome.",
            &["outcome"],
        );
        let reg_failures = counter_vec(
            r,
            "oncilla_rdma_registration_failures_total",
            "RDMA memory registrations a port refused, by memory (host, gpu).",
            &["memory"],
        );
        let gpu_regs = Mirror::new(counter(
            r,
            "oncilla_gpu_rdma_registrations_total",
            "Device memory registered with the RDMA ports (GPUDirect RDMA).",
        ));
        let rdma_mirrors = [
            Mirror::new(pairs.with_label_values(&["connected"])),
            Mirror::new(pairs.with_label_values(&["failed"])),
            Mirror::new(reg_failures.with_label_values(&["host"])),
            Mirror::new(reg_failures.with_label_values(&["gpu"])),
        ];
        let gpu = gauge_vec(
            r,
            "oncilla_gpu_held",
            "Device memory held on this node for REMOTE_GPU allocations: extents and bytes.",
            &["what"],
        );
        let agent = Arc::clone(agent);
        self.sample(Box::new(move || {
            let u = agent.usage();
            let capacity = agent.pool().capacity();
            for (state, v) in [
                ("capacity", capacity),
                ("used", u.used),
                ("free", u.free),
                ("refilling", u.scrubbing),
                ("largest_free", u.largest_free),
            ] {
                pool.with_label_values(&[state]).set(i64_of(v));
            }
            page.set(i64_of(agent.pool().page_size()));
            allocations.set(i64_of(agent.allocations() as u64));
            sessions.set(i64_of(agent.sessions() as u64));
            leases.set(i64_of(agent.leases().len() as u64));
            rdma.set(i64_of(agent.rdma_registrations() as u64));
            let c = &agent.rdma().counts;
            let load =
                |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
            for (m, total) in rdma_mirrors.iter().zip([
                load(&c.pairs),
                load(&c.pair_failures),
                load(&c.host_failures),
                load(&c.gpu_failures),
            ]) {
                m.follow(total);
            }
            gpu_regs.follow(load(&c.gpu));
            let (extents, bytes) = agent.gpu_held();
            gpu.with_label_values(&["extents"]).set(i64_of(extents));
            gpu.with_label_values(&["bytes"]).set(i64_of(bytes));
        }));
    }

    /// The master role's gauges: whether it leads and in which term, and
    /// while it leads the nodes as it sees them, its table and its
    /// recovery window (a standby shows none).
    pub fn watch_master<L: AgentLink + Send + Sync + 'static>(
        &self,
        seat: tokio::sync::watch::Receiver<Seat<L>>,
    ) {
        let r = &self.registry;
        let leading = gauge(
            r,
            "oncilla_master_leading",
            "1 while this master leads (always, without an election), 0 while it stands by.",
        );
        let term = gauge(
            r,
            "oncilla_master_term",
            "The term this master leads in (the etcd revision of its election), 0 without an election or while it stands by.",
        );
        let nodes = gauge_vec(
            r,
            "oncilla_master_nodes",
            "Nodes the master knows, by state (up, suspect, down).",
            &["state"],
        );
        let age = float_gauge_vec(
            r,
            "oncilla_master_node_heartbeat_age_seconds",
            "Time since the master last heard from each node.",
            &["node"],
        );
        let node_bytes = gauge_vec(
            r,
            "oncilla_master_node_bytes",
            "Each node's memory as the master accounts it: capacity, and reserved by allocations.",
            &["node", "state"],
        );
        let allocs = gauge_vec(
            r,
            "oncilla_master_allocations",
            "Allocations in the master's table, by kind and health.",
            &["kind", "health"],
        );
        let alloc_bytes = gauge_vec(
            r,
            "oncilla_master_allocation_bytes",
            "Bytes of the allocations in the master's table, by kind and health.",
            &["kind", "health"],
        );
        let recovering = gauge(
            r,
            "oncilla_master_recovering",
            "1 while the master waits for agents to re-register after a start (it refuses to change its table), else 0.",
        );
        let left = float_gauge(
            r,
            "oncilla_master_recovery_remaining_seconds",
            "Time left in the master's recovery window.",
        );
        self.sample(Box::new(move || {
            let core = seat.borrow().core().ok().map(|(c, _)| c);
            leading.set(i64::from(core.is_some()));
            term.set(core.as_ref().map_or(0, |c| i64_of(c.term())));
            // Nodes come and go: labels are rebuilt each scrape.
            age.reset();
            node_bytes.reset();
            allocs.reset();
            alloc_bytes.reset();
            let Some(master) = core else {
                for state in ["up", "suspect", "down"] {
                    nodes.with_label_values(&[state]).set(0);
                }
                recovering.set(0);
                left.set(0.0);
                return;
            };
            let list = master.nodes();
            let mut by_state = [0i64; 3];
            for n in &list {
                by_state[match n.state {
                    NodeState::Up => 0,
                    NodeState::Suspect => 1,
                    NodeState::Down => 2,
                }] += 1;
                let name = n.info.name.as_str();
                age.with_label_values(&[name])
                    .set(n.last_heartbeat_ms_ago as f64 / 1000.0);
                node_bytes
                    .with_label_values(&[name, "capacity"])
                    .set(i64_of(n.info.capacity));
                node_bytes
                    .with_label_values(&[name, "reserved"])
                    .set(i64_of(n.used));
            }
            for (state, n) in ["up", "suspect", "down"].iter().zip(by_state) {
                nodes.with_label_values(&[state]).set(n);
            }
            for ((kind, health), (count, bytes)) in master.census() {
                let labels = [kind_label(kind), health_label(health)];
                allocs.with_label_values(&labels).set(i64_of(count));
                alloc_bytes.with_label_values(&labels).set(i64_of(bytes));
            }
            let d = master.recovering();
            recovering.set(i64::from(!d.is_zero()));
            left.set(d.as_secs_f64());
        }));
    }

    /// Every family in the Prometheus text format (0.0.4), sampled now.
    pub fn render(&self) -> Vec<u8> {
        for s in self
            .samplers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            s();
        }
        self.data.sample();
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "metrics could not be encoded");
        }
        out
    }
}

fn kind_label(k: Kind) -> &'static str {
    match k {
        Kind::LocalHost => "local_host",
        Kind::RemoteHost => "remote_host",
        Kind::LocalGpu => "local_gpu",
        Kind::RemoteGpu => "remote_gpu",
    }
}

fn health_label(h: Health) -> &'static str {
    match h {
        Health::Healthy => "healthy",
        Health::Degraded => "degraded",
        Health::Lost => "lost",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_renders_and_names_follow_the_conventions() {
        let m = Metrics::new();
        m.data.read.served(4096);
        m.data.read.took(std::time::Duration::from_micros(30));
        m.data.refused(oncilla_net::wire::Status::OutOfBounds);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(
            text.contains("oncilla_data_requests_total{fabric=\"tcp\",op=\"read\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("oncilla_data_bytes_total{fabric=\"tcp\",op=\"read\"} 4096"),
            "{text}"
        );
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            let mut f = line.split_whitespace().skip(2);
            let (name, kind) = (f.next().unwrap(), f.next().unwrap());
            assert!(name.starts_with("oncilla_"), "{name}");
            match kind {
                "counter" => assert!(name.ends_with("_total"), "{name}"),
                "histogram" => assert!(name.ends_with("_seconds"), "{name}"),
                _ => {}
            }
        }
    }
}
