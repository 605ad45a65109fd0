//! Data-path servers: how remote clients reach the pool's bytes.

pub mod shm;
pub mod tcp;
