//! What this node holds, as both the agent (which fills and empties it)
//! and the data servers in `fabric` (which serve from it) see
//! it: the held allocations and their extents ([`held`]), the processes
//! that map them ([`lease`]), the RDMA registrations of held memory
//! ([`keys`]), and how writes reach a replicated allocation's other copies
//! ([`copying`]).
//!
//! It sits below `agent` and `fabric` and imports neither, so `fabric`
//! never imports `agent`. It never talks to the network, never makes a
//! registration and never decides what is held.

pub mod copying;
pub mod held;
pub mod keys;
pub mod lease;
