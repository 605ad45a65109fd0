//! The gRPC edge of the daemon: each service in its own file converts
//! requests into checked domain values (`oncilla_proto::convert`), calls the
//! core (`agent`, `master`) and converts the results back; `status` maps
//! core errors to statuses and `links` carries the core's ports to peers.
//! Nothing below this module imports tonic or a wire type.

pub mod agent;
mod authority;
pub mod links;
pub mod master;
pub mod session;
mod status;

use oncilla_proto::convert::WireError;

/// Turns a core result into a gRPC response, converting the value to its
/// wire type.
pub(crate) fn reply<T, W: From<T>>(
    r: Result<T, crate::error::CoreError>,
) -> Result<tonic::Response<W>, tonic::Status> {
    r.map(|v| tonic::Response::new(W::from(v)))
        .map_err(Into::into)
}

/// A wire request as the checked domain value it must be, or
/// INVALID_ARGUMENT saying what is wrong with it.
pub(crate) fn checked<T, W>(w: W) -> Result<T, tonic::Status>
where
    T: TryFrom<W, Error = WireError>,
{
    T::try_from(w).map_err(|e| tonic::Status::invalid_argument(format!("invalid request: {e}")))
}
