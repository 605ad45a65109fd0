//! What a gRPC listener tells its services about a connection, and how a
//! connection proves itself: [`Conn`] is the connection's info in every
//! request's extensions (tonic's `ConnectInfo`), and [`Unproven`] holds
//! whatever the listener lent the connection until its first call that
//! the [`crate::credential::Authenticate`] interceptor admits (a place in
//! the budget for connections nobody has vouched for), then gives it back.
//!
//! So a peer without the token holds a connection only inside that budget,
//! where newcomers evict it, however long it keeps the connection alive.
//! This module never decides who is admitted and never touches a socket.

use std::any::Any;
use std::sync::{Arc, Mutex};

use tonic::transport::server::TcpConnectInfo;
use tonic::Request;

/// A connection's info: the transport's own, and its [`Unproven`].
#[derive(Clone, Debug)]
pub struct Conn<T> {
    pub info: T,
    pub unproven: Unproven,
}

/// What a connection holds until it proves itself (nothing, on listeners
/// whose peers the kernel names).
#[derive(Clone, Default)]
pub struct Unproven(Arc<Mutex<Option<Box<dyn Any + Send>>>>);

impl std::fmt::Debug for Unproven {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Unproven")
    }
}

impl Unproven {
    /// Keeps `place` until the connection proves itself (or ends).
    pub fn hold(&self, place: Box<dyn Any + Send>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(place);
    }

    /// The connection made an admitted call: gives back what it held.
    pub fn proven(&self) {
        let held = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(held);
    }

    /// Whether the connection still holds something.
    pub fn holds(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

/// Marks the connection `req` came on as proven, on a TCP listener (with
/// TLS too: tonic puts the inner info beside its TLS wrapper).
pub fn prove<T>(req: &Request<T>) {
    if let Some(c) = req.extensions().get::<Conn<TcpConnectInfo>>() {
        c.unproven.proven();
    }
}
