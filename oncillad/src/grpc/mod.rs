//! The gRPC edge of the daemon: each service in its own file validates and
//! converts requests, then calls the core (`agent`, `master`). Nothing below
//! this module imports tonic's server types.

pub mod agent;
pub mod links;
pub mod master;
pub mod session;

/// Turns a core result into a gRPC response.
pub(crate) fn reply<T>(
    r: Result<T, crate::error::CoreError>,
) -> Result<tonic::Response<T>, tonic::Status> {
    r.map(tonic::Response::new).map_err(Into::into)
}
