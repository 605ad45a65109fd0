//! What this node holds, as both the agent (which fills it) and the data
//! servers in [`crate::fabric`] (which serve from it) see it: the RDMA
//! registrations of held memory ([`keys`]).
//!
//! It sits below `agent` and `fabric` and imports neither, so neither
//! has to import the other for these types. It never talks to the network
//! and never makes a registration.

pub mod keys;
