//! The tokio runtime a session (and the verbs engine) runs its calls on,
//! usable from plain threads and from async code alike.
//!
//! liboncilla's API blocks; applications call it from anywhere, also from
//! inside a tokio runtime of their own, where a runtime may be neither
//! blocked on nor dropped (tokio panics). There a call runs on a thread of
//! its own, for the call's length (the caller's worker waits, as for any
//! blocking call: copies in the background are `Pending`, a future), and
//! the runtime is shut down without waiting for its tasks. This module
//! owns only that; it never decides what runs on the runtime.

use std::future::Future;
use std::mem::ManuallyDrop;
use std::ops::Deref;

use tokio::runtime::{Handle, Runtime};

/// A runtime of this library's own.
pub(crate) struct OwnRuntime(ManuallyDrop<Runtime>);

impl OwnRuntime {
    pub(crate) fn new(rt: Runtime) -> Self {
        Self(ManuallyDrop::new(rt))
    }

    /// Runs `fut` to its end on this runtime and returns its output, from
    /// a plain thread or from inside any runtime.
    pub(crate) fn block_on<F>(&self, fut: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        if !in_runtime() {
            return self.0.block_on(fut);
        }
        std::thread::scope(|s| match s.spawn(|| self.0.block_on(fut)).join() {
            Ok(out) => out,
            Err(panic) => std::panic::resume_unwind(panic),
        })
    }
}

/// Whether this thread is inside a tokio runtime's context (a worker, a
/// blocking-pool thread, or one that entered a handle).
fn in_runtime() -> bool {
    Handle::try_current().is_ok()
}

impl Deref for OwnRuntime {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        &self.0
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        // SAFETY: the runtime is taken out once, here, as its owner is
        // dropped; nothing reaches `self.0` after this (drop is the last
        // use of `self`).
        let rt = unsafe { ManuallyDrop::take(&mut self.0) };
        if in_runtime() {
            // Dropping waits for the runtime's blocking tasks, which a
            // runtime's thread may not do.
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own() -> OwnRuntime {
        OwnRuntime::new(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap(),
        )
    }

    #[test]
    fn it_blocks_and_drops_from_plain_threads_and_from_async_code() {
        let rt = own();
        assert_eq!(rt.block_on(async { 7 }), 7);
        drop(rt);
        // Inside another runtime, of either flavour: tokio would panic
        // on a plain block_on or drop.
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        current.block_on(async {
            let rt = own();
            assert_eq!(rt.block_on(async { 8 }), 8);
            drop(rt);
        });
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        multi.block_on(async {
            tokio::spawn(async {
                let rt = own();
                assert_eq!(rt.block_on(async { 9 }), 9);
            })
            .await
            .unwrap();
        });
    }
}
