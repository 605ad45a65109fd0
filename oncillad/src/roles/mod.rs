//! The daemon's two roles, each started on its own: [`master::start`]
//! builds the master's core and its service (with `election`, only while
//! etcd elects this master), [`agent::start`] the node's
//! pool, its data and map servers, its membership loop and its services.
//! `lib.rs` binds the shared gRPC port, picks the roles the configuration
//! asks for, and serves. A role never reaches into the other: in one
//! process they meet only on the gRPC router.

pub(crate) mod agent;
mod election;
pub(crate) mod master;
