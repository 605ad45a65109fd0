//! The verbs layer's stand-in in a build without the `verbs` feature: the
//! same types and calls as `verbs.rs`, so every caller compiles one code
//! path whatever the build, and none of them can be made. [`Device::open`]
//! is the only way to a [`Device`] and always answers
//! [`RdmaError::NotBuilt`]; every other type is made from a `Device`, so
//! each method of this module is unreachable, and says so to the compiler
//! (`match self.never {}`) instead of pretending to work.
//!
//! `lib.rs` picks this file or `verbs.rs` as the module `verbs`: that is
//! the one place the feature switches anything in the workspace's code.

use std::convert::Infallible;
use std::sync::Arc;

use crate::discover::Port;
use crate::qp::{Endpoint, State};
use crate::{Completion, RdmaError, Wr};

/// An opened port (never, in this build).
pub struct Device {
    /// What sysfs said.
    pub port: Port,
    /// Whether the HCA registers memory on demand.
    pub odp: bool,
    never: Infallible,
}

impl Device {
    /// # Errors
    /// Always [`RdmaError::NotBuilt`].
    pub fn open(_port: &Port) -> Result<Arc<Device>, RdmaError> {
        Err(RdmaError::NotBuilt)
    }

    pub fn present(&self) -> bool {
        match self.never {}
    }

    pub fn endpoint(&self, _qp_num: u32, _psn: u32) -> Endpoint {
        match self.never {}
    }

    /// # Safety
    /// As the verbs build's: never callable here (there is no `Device`).
    ///
    /// # Errors
    /// None: unreachable.
    pub unsafe fn register(
        self: &Arc<Self>,
        _addr: *mut u8,
        _len: usize,
        _remote: bool,
    ) -> Result<Mr, RdmaError> {
        match self.never {}
    }

    /// # Safety
    /// As the verbs build's: never callable here (there is no `Device`).
    ///
    /// # Errors
    /// None: unreachable.
    pub unsafe fn register_device<E>(
        self: &Arc<Self>,
        _addr: u64,
        _len: usize,
        _dmabuf: impl FnOnce() -> Result<std::os::fd::OwnedFd, E>,
    ) -> Result<(Mr, &'static str), RdmaError>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        match self.never {}
    }
}

/// A memory registration (never, in this build).
pub struct Mr {
    pub addr: u64,
    pub len: u64,
    never: Infallible,
}

impl Mr {
    pub fn lkey(&self) -> u32 {
        match self.never {}
    }

    pub fn rkey(&self) -> u32 {
        match self.never {}
    }
}

/// A reliable-connected queue pair (never, in this build).
pub struct Qp {
    pub depth: u32,
    never: Infallible,
}

impl Qp {
    /// # Errors
    /// None: unreachable (there is no `Device`).
    pub fn new(dev: &Arc<Device>, _depth: u32) -> Result<Qp, RdmaError> {
        match dev.never {}
    }

    pub fn endpoint(&self) -> Endpoint {
        match self.never {}
    }

    pub fn device(&self) -> &Arc<Device> {
        match self.never {}
    }

    /// # Errors
    /// None: unreachable.
    pub fn connect(&mut self, _remote: &Endpoint) -> Result<(), RdmaError> {
        match self.never {}
    }

    pub fn state(&self) -> State {
        match self.never {}
    }

    /// # Errors
    /// None: unreachable.
    pub fn hw_state(&self) -> Result<&'static str, RdmaError> {
        match self.never {}
    }

    /// # Errors
    /// None: unreachable.
    pub fn stop(&mut self) -> Result<(), RdmaError> {
        match self.never {}
    }

    /// # Safety
    /// As the verbs build's: never callable here.
    ///
    /// # Errors
    /// None: unreachable.
    pub unsafe fn post(&mut self, _wrs: &[Wr]) -> Result<(), RdmaError> {
        match self.never {}
    }

    /// # Errors
    /// None: unreachable.
    pub fn poll(&mut self, _out: &mut [Completion]) -> Result<usize, RdmaError> {
        match self.never {}
    }
}

// Drop as the verbs build's types do, so callers' explicit drops and
// forgets mean the same in both builds.
impl Drop for Device {
    fn drop(&mut self) {
        match self.never {}
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        match self.never {}
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        match self.never {}
    }
}
