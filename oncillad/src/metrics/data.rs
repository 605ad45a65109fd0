//! The TCP data server's metrics: requests, bytes and durations per
//! operation, requests refused by reason, connections (authenticated and
//! still in their hello) and connections refused or evicted, with handles
//! resolved here once (no label lookup, no lock on the way).
//!
//! A request is counted before the reply that completes it leaves (the
//! ack of a write or pull, the bytes of a read or map), so a client that
//! has seen its request done finds it in the next scrape; its duration is
//! observed once the reply is out.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncilla_net::wire::Status;
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntGaugeVec, Registry};

use crate::listen::{Pending, Seats};

/// One operation's handles.
pub struct OpMetrics {
    requests: IntCounter,
    bytes: IntCounter,
    seconds: Histogram,
}

impl OpMetrics {
    /// A request of `len` bytes served: called before its completing
    /// reply is sent.
    pub fn served(&self, len: usize) {
        self.requests.inc();
        self.bytes.inc_by(u64::try_from(len).unwrap_or(u64::MAX));
    }

    /// The time from its header to its reply sent.
    pub fn took(&self, took: Duration) {
        self.seconds.observe(took.as_secs_f64());
    }
}

/// Why a data connection was turned away at its hello.
#[derive(Debug, Clone, Copy)]
pub enum HelloRefusal {
    WrongToken,
    BadVersion,
    NoSeat,
}

/// The data server's families.
pub struct Transfers {
    pub read: OpMetrics,
    pub write: OpMetrics,
    /// Third-party copies: bytes this agent read from another agent into
    /// its pool for a client (fabric `tcp`, op `pull`).
    pub pull: OpMetrics,
    /// Same-node mappings granted (fabric `shm`, op `map`; the bytes are
    /// the lengths mapped, then copied by the client itself).
    pub map: OpMetrics,
    refusals: [IntCounter; 7],
    hello: [IntCounter; 3],
    connections: IntGaugeVec,
    evictions: [super::Mirror; 2],
    listener: Mutex<Option<(Arc<Pending>, Arc<Seats>)>>,
}

/// Latency buckets: 10 µs to 10 s.
const BUCKETS: [f64; 13] = [
    1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0,
];

impl Transfers {
    pub(super) fn new(r: &Registry) -> Self {
        let requests = super::counter_vec(
            r,
            "oncilla_data_requests_total",
            "Data requests served, by fabric and operation (read: bytes out of the pool, write: bytes into it).",
            &["fabric", "op"],
        );
        let bytes = super::counter_vec(
            r,
            "oncilla_data_bytes_total",
            "Bytes moved by served data requests, by fabric and operation.",
            &["fabric", "op"],
        );
        let name = "oncilla_data_request_duration_seconds";
        let seconds = super::registered(
            r,
            name,
            HistogramVec::new(
                HistogramOpts::new(
                    name,
                    "Time from a data request's header to its last byte sent or received, by fabric and operation.",
                )
                .buckets(BUCKETS.to_vec()),
                &["fabric", "op"],
            ),
        );
        let refusals = super::counter_vec(
            r,
            "oncilla_data_request_refusals_total",
            "Data requests refused, by reason.",
            &["reason"],
        );
        let hello = super::counter_vec(
            r,
            "oncilla_data_connection_refusals_total",
            "Data connections turned away at their hello, by reason (wrong_token, bad_version, no_seat: every seat busy).",
            &["reason"],
        );
        let connections = super::gauge_vec(
            r,
            "oncilla_data_connections",
            "Open data connections: authenticated, or pending (still in their hello).",
            &["state"],
        );
        let evictions = super::counter_vec(
            r,
            "oncilla_data_connection_evictions_total",
            "Data connections closed to make room: pending (a stranger's hello over budget) or idle (an authenticated connection between requests).",
            &["state"],
        );
        let op = |fabric: &str, name: &str| OpMetrics {
            requests: requests.with_label_values(&[fabric, name]),
            bytes: bytes.with_label_values(&[fabric, name]),
            seconds: seconds.with_label_values(&[fabric, name]),
        };
        Self {
            read: op("tcp", "read"),
            write: op("tcp", "write"),
            pull: op("tcp", "pull"),
            map: op("shm", "map"),
            refusals: [
                "no_such_allocation",
                "out_of_bounds",
                "too_large",
                "internal",
                "busy",
                "other",
                "not_primary",
            ]
            .map(|r| refusals.with_label_values(&[r])),
            hello: ["wrong_token", "bad_version", "no_seat"].map(|r| hello.with_label_values(&[r])),
            connections,
            evictions: ["pending", "idle"]
                .map(|s| super::Mirror::new(evictions.with_label_values(&[s]))),
            listener: Mutex::new(None),
        }
    }

    /// A request refused with `status`.
    pub fn refused(&self, status: Status) {
        let i = match status {
            Status::NoSuchAllocation | Status::BadKey => 0,
            Status::OutOfBounds => 1,
            Status::TooLarge => 2,
            Status::Internal => 3,
            Status::Busy => 4,
            Status::Ok => 5,
            Status::NotPrimary => 6,
        };
        self.refusals[i].inc();
    }

    /// A connection turned away at its hello.
    pub fn hello_refused(&self, why: HelloRefusal) {
        self.hello[why as usize].inc();
    }

    /// The listener's budgets, read at each scrape.
    pub fn watch_listener(&self, pending: Arc<Pending>, seats: Arc<Seats>) {
        *self.listener.lock().unwrap_or_else(|e| e.into_inner()) = Some((pending, seats));
    }

    pub(super) fn sample(&self) {
        let listener = self.listener.lock().unwrap_or_else(|e| e.into_inner());
        let Some((pending, seats)) = listener.as_ref() else {
            return;
        };
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.connections
            .with_label_values(&["authenticated"])
            .set(n(seats.len()));
        self.connections
            .with_label_values(&["pending"])
            .set(n(pending.len()));
        // The budgets count evictions themselves.
        self.evictions[0].follow(pending.evicted());
        self.evictions[1].follow(seats.evicted());
    }
}
