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
//! its own, so it must not be called from inside another async runtime's
//! worker (use `spawn_blocking`). Allocations are freed when dropped, and
//! every allocation of the session is freed when the process exits, even
//! by a crash; persistent allocations live until freed explicitly.

mod client;
mod descriptor;
mod error;
pub mod fabric;

pub use client::{AllocSpec, Allocation, Oncilla, Options};
pub use descriptor::{Descriptor, Extent, Kind};
pub use error::{Error, Result};
