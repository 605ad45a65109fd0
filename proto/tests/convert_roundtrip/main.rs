//! Round trips (proptest, a bounded number of cases) of every conversion in
//! `oncilla_proto::convert`: an arbitrary valid domain value (built through
//! the model's own constructors and checks where it has them) goes to its
//! protobuf message, through encoded bytes, and back to an equal value.
//! Where a conversion is lossy by design (an unspecified enum, an absent
//! message read as its default), what the code documents is checked
//! instead. Every enum-like integer field refuses an unknown value with
//! `WireError::UnknownEnum`, and every required sub-message its absence
//! with `WireError::Missing`, never defaulting silently.

#![allow(clippy::unwrap_used)]

use oncilla_model::alloc::{
    program_name, session_id, AllocRef, AllocSpec, Allocation, Extent, Health, Invalid, NodeShare,
    Owner, Placement, RdmaRegion, KEY_LEN, MAX_ALLOCATION, MAX_BATCH, MAX_ID, MAX_REPLICAS,
};
use oncilla_model::cluster::{
    Heartbeat, HeartbeatReply, Listed, Piece, Range, Registered, Registration, Release,
    ReplicaShare, Reservation, Reserved, SessionReport, SetCopies,
};
use oncilla_model::node::{
    AgentStatus, Drain, GpuDevice, NodeInfo, NodeList, NodeState, NodeStatus, PoolUsage, RdmaPort,
};
use oncilla_model::quota::{Limits, Report, Subject, Summary, UserReport};
use oncilla_model::{Fabric, Kind, Policy, PAGE};
use oncilla_proto::convert::rdma::EndpointError;
use oncilla_proto::convert::{self, WireError};
use oncilla_proto::pb;
use oncilla_rdma::qp::Endpoint;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use prost::Message;

mod properties;
mod strategies;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

/// A message as the peer reads it: encoded to bytes and decoded again.
fn wire<M: Message + Default>(m: &M) -> M {
    M::decode(m.encode_to_vec().as_slice()).unwrap()
}

/// The refusal of an unknown wire value of the enum `what`.
fn unknown(what: &'static str, value: i32) -> Option<WireError> {
    Some(WireError::UnknownEnum { what, value })
}
