//! The daemon's Prometheus metrics: the families, and the samplers that
//! read state at scrape time (pool, sessions, listeners, the master's
//! table, the process). Counters and histograms on the data path are
//! recorded by the servers themselves through [`data::Transfers`], before
//! the reply that completes a request and outside any lock. The endpoint that serves them is
//! [`serve`].
//!
//! Conventions (Prometheus'): one unit per family, named in it; a label
//! splits a family only into parts that sum to a whole; counters end in
//! `_total`. Every family about this daemon (its pool, data path, process
//! and build) carries `node`, the daemon's node name; the master's
//! families are about the cluster, and `node` there is the node a series
//! describes.
//!
//! It only observes: nothing here changes a pool, a table or a connection.

pub mod data;
mod process;
pub mod serve;

use std::sync::{Arc, Mutex};

use oncilla_model::alloc::Health;
use oncilla_model::node::NodeState;
use oncilla_model::Kind;
use prometheus::{Encoder, Gauge, GaugeVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::agent::Agent;
use crate::master::refusals::Refusal;
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
    /// This daemon's own families: each series carries its `node`.
    registry: Registry,
    /// The master's families, about the cluster's nodes.
    cluster: Registry,
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
    /// The families of the daemon of node `node`.
    pub fn new(node: &str) -> Arc<Self> {
        let labels = std::collections::HashMap::from([("node".to_string(), node.to_string())]);
        let registry = Registry::new_custom(None, Some(labels)).unwrap_or_else(|e| {
            tracing::error!(error = %e, "metrics without a node label");
            Registry::new()
        });
        let data = Arc::new(data::Transfers::new(&registry));
        let process = process::watch(&registry);
        Arc::new(Self {
            registry,
            cluster: Registry::new(),
            samplers: Mutex::new(vec![process]),
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
            "Bytes of this agent's pool, by state (they sum to its capacity): used (held by allocations), free, refilling (freed, being zeroed or backed anew).",
            &["state"],
        );
        let capacity = gauge(
            r,
            "oncilla_pool_capacity_bytes",
            "Bytes this agent's pool exports.",
        );
        let largest_free = gauge(
            r,
            "oncilla_pool_largest_free_bytes",
            "The largest free run of this agent's pool: the largest allocation it can take in one piece now.",
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
        let gpu_bytes = gauge(
            r,
            "oncilla_gpu_held_bytes",
            "Device memory held on this node for REMOTE_GPU allocations.",
        );
        let gpu_extents = gauge(
            r,
            "oncilla_gpu_held_extents",
            "Extents of device memory held on this node for REMOTE_GPU allocations.",
        );
        let agent = Arc::clone(agent);
        self.sample(Box::new(move || {
            let u = agent.usage();
            capacity.set(i64_of(agent.pool().capacity()));
            largest_free.set(i64_of(u.largest_free));
            for (state, v) in [
                ("used", u.used),
                ("free", u.free),
                ("refilling", u.scrubbing),
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
            gpu_extents.set(i64_of(extents));
            gpu_bytes.set(i64_of(bytes));
        }));
    }

    /// The master role's gauges: whether it leads and in which term, and
    /// while it leads the nodes as it sees them, its table and its
    /// recovery window (a standby shows none).
    pub fn watch_master<L: AgentLink + Send + Sync + 'static>(
        &self,
        seat: tokio::sync::watch::Receiver<Seat<L>>,
    ) {
        let r = &self.cluster;
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
        let node_capacity = gauge_vec(
            r,
            "oncilla_master_node_capacity_bytes",
            "Each node's memory as the master accounts it.",
            &["node"],
        );
        let node_reserved = gauge_vec(
            r,
            "oncilla_master_node_reserved_bytes",
            "Each node's memory reserved by allocations, as the master accounts it.",
            &["node"],
        );
        let made = Mirror::new(counter(
            r,
            "oncilla_master_allocations_made_total",
            "Allocations this master made (a batch counts each of its allocations).",
        ));
        let failures = counter_vec(
            r,
            "oncilla_master_allocation_failures_total",
            "Allocation requests this master refused, by reason: capacity, quota, invalid, unavailable (a node needed was down, draining or failed), not_serving (recovering, standing by), denied, other.",
            &["reason"],
        );
        let refused: Vec<(Refusal, Mirror)> = Refusal::ALL
            .iter()
            .map(|r| (*r, Mirror::new(failures.with_label_values(&[r.label()]))))
            .collect();
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
            node_capacity.reset();
            node_reserved.reset();
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
                node_capacity
                    .with_label_values(&[name])
                    .set(i64_of(n.info.capacity));
                node_reserved.with_label_values(&[name]).set(i64_of(n.used));
            }
            for (state, n) in ["up", "suspect", "down"].iter().zip(by_state) {
                nodes.with_label_values(&[state]).set(n);
            }
            for ((kind, health), (count, bytes)) in master.census() {
                let labels = [kind_label(kind), health_label(health)];
                allocs.with_label_values(&labels).set(i64_of(count));
                alloc_bytes.with_label_values(&labels).set(i64_of(bytes));
            }
            made.follow(master.refusals().made_total());
            for (r, m) in &refused {
                m.follow(master.refusals().refused_total(*r));
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
        let mut families = self.registry.gather();
        families.extend(self.cluster.gather());
        if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
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
        let m = Metrics::new("n1");
        m.data.read.served(4096);
        m.data.read.took(std::time::Duration::from_micros(30));
        m.data.refused(oncilla_net::wire::Status::OutOfBounds);
        let text = String::from_utf8(m.render()).unwrap();
        // This daemon's families carry its node.
        assert!(
            text.contains("oncilla_data_requests_total{fabric=\"tcp\",op=\"read\",node=\"n1\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("oncilla_data_bytes_total{fabric=\"tcp\",op=\"read\",node=\"n1\"} 4096"),
            "{text}"
        );
        let build = format!(
            "oncilla_build_info{{version=\"{}\",node=\"n1\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&build), "{text}");
        for family in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            assert!(text.contains(&format!("{family}{{node=\"n1\"}}")), "{text}");
        }
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            let mut f = line.split_whitespace().skip(2);
            let (name, kind) = (f.next().unwrap(), f.next().unwrap());
            assert!(
                name.starts_with("oncilla_") || name.starts_with("process_"),
                "{name}"
            );
            match kind {
                "counter" => assert!(name.ends_with("_total"), "{name}"),
                "histogram" => assert!(name.ends_with("_seconds"), "{name}"),
                _ => {}
            }
        }
    }
}
