//! liboncilla: allocate memory anywhere in an Oncilla cluster and copy to and
//! from it with one-sided operations.
//!
//! # Quick start
//! ```no_run
//! use liboncilla::{Kind, Oncilla};
//! # fn main() -> liboncilla::Result<()> {
//! let ocm = Oncilla::connect()?;              // ONCILLA_SOCKET, ONCILLA_TOKEN
//! let buf = ocm.alloc(1 << 30, Kind::RemoteHost)?;
//! buf.copy_in(0, b"hello")?;
//! let mut out = [0u8; 5];
//! buf.copy_out(0, &mut out)?;
//! assert_eq!(&out, b"hello");
//! # Ok(()) }                                   // `buf` is freed on drop
//! ```
//!
//! # Threads and resources
//! [`Oncilla`] is `Send + Sync` and cheap to clone; copies from several
//! threads run concurrently. The library runs a one-thread async runtime of
//! its own; its calls block the calling thread, also inside another async
//! runtime (they work there, holding that worker). Async code uses
//! [`AsyncOncilla`] instead, whose calls are futures that leave the
//! executor's threads free (a batch's [`Pending`] is one too).
//! Allocations are freed when dropped, and
//! every allocation of the session is freed when the process exits, even
//! by a crash; persistent allocations live until freed explicitly.
//!
//! # Sharing and coherence
//! A named allocation ([`AllocSpec::named`]) outlives its creator; any
//! process on any node can [`Oncilla::attach`] it. Memory is not coherent
//! beyond this: a copy is complete, and visible to every later reader, when
//! `copy_in` returns; there is no ordering between concurrent writers, and
//! a reader racing a writer may see some of each. Order access with your
//! own synchronisation.

//!
//! # Layout
//! [`Options`] reads every `ONCILLA_*` setting; the session (`session`, on
//! the runtime and control channel of `client`) makes and attaches
//! allocations; opening one (`allocation`) decides once
//! how each extent is reached (`route`: mapped memory, TCP or verbs); the
//! data path (`fabric`, private) runs the pieces through the transport of
//! each route; `device` plans copies that touch GPU memory of this process
//! (on the device, GPUDirect RDMA, or staged) and `batch` runs copies in
//! the background. [`Operator`] copies by descriptor without a session.

mod affinity;
mod allocation;
mod asynchronous;
mod batch;
mod between;
mod client;
mod descriptor;
mod device;
mod error;
mod fabric;
mod failover;
pub mod ffi;
mod map;
mod operator;
mod options;
mod route;
mod runtime;
mod session;
mod spec;
mod staging;

pub use affinity::{Affinity, AffinityError};
pub use allocation::Allocation;
pub use asynchronous::{AsyncOncilla, MAX_CALLS_IN_FLIGHT};
pub use batch::{Batch, Pending};
pub use descriptor::{Descriptor, Extent};
pub use error::{Error, Result};
pub use fabric::{streams_for, STREAM_MIN};
pub use map::{MapOptions, MapStats, Mapped, OwnedMapping, MAX_BLOCK};
pub use oncilla_model::alloc::MAX_BATCH;
/// The cluster token and CA an [`Operator`] and [`Options`] take: re-exported
/// so applications need no other crate of the workspace.
pub use oncilla_net::auth::{Token, TokenError};
pub use oncilla_net::tls::ClientTls;
pub use operator::Operator;
pub use options::{OptionError, Options, RdmaOptions, DEFAULT_STREAMS, STAGING_DEFAULT};
pub use session::Oncilla;
pub use spec::{AllocSpec, Fabric, Kind, Policy};
