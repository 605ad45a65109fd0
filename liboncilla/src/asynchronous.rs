//! The session for async code: [`AsyncOncilla`] offers [`Oncilla`]'s calls
//! as futures that leave the caller's executor free while they wait.
//!
//! A control call (connect, allocate, attach, free, or any blocking call
//! through [`AsyncOncilla::call`]) runs [`Oncilla`]'s blocking call on a
//! thread of its own and is awaited through a oneshot channel; at most
//! [`MAX_CALLS_IN_FLIGHT`] threads run at once per session, the rest wait
//! their turn without holding a thread. `write` and `read` are batches
//! run on the session's runtime ([`Pending`]): like any batch, they try
//! the copies as the handle was opened first (a replicated allocation's
//! primary) and fail over as batches do. A handle dropped inside a tokio
//! runtime is released in the background of the session's runtime; on
//! another executor its drop waits for the master ([`AsyncOncilla::free`]
//! does not). The futures need no runtime of
//! the caller's: tokio's (either flavour) or any other executor will do.
//! This module only hands calls over; what they do is [`Oncilla`]'s, and
//! it never blocks the thread that polls it.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::allocation::Allocation;
use crate::batch::{Batch, Pending};
use crate::descriptor::Kind;
use crate::error::{Error, Result};
use crate::options::Options;
use crate::session::Oncilla;
use crate::spec::AllocSpec;

/// Most control calls of one session that run at once (each on a thread
/// of its own); more wait, holding no thread.
pub const MAX_CALLS_IN_FLIGHT: usize = 64;

/// A session with the cluster, for async code. Cheap to clone (clones
/// share the session and its bound on calls in flight); thread-safe.
///
/// ```no_run
/// # async fn app() -> liboncilla::Result<()> {
/// use liboncilla::{AsyncOncilla, Kind};
/// let ocm = AsyncOncilla::connect().await?;      // ONCILLA_SOCKET, ONCILLA_TOKEN
/// let buf = ocm.alloc(1 << 20, Kind::RemoteHost).await?;
/// ocm.write(&buf, 0, b"hello".to_vec()).await?;
/// assert_eq!(ocm.read(&buf, 0, 5).await?, b"hello");
/// ocm.free(buf).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AsyncOncilla {
    ocm: Oncilla,
}

impl AsyncOncilla {
    /// Connects using [`Options::from_env`].
    ///
    /// # Errors
    /// As [`Oncilla::connect`].
    pub async fn connect() -> Result<Self> {
        let opts = Options::from_env()?;
        Self::connect_with(opts).await
    }

    /// Connects to the agent at `opts.socket` and opens a session.
    ///
    /// # Errors
    /// As [`Oncilla::connect_with`].
    pub async fn connect_with(opts: Options) -> Result<Self> {
        let ocm = off_thread(move || Oncilla::connect_with(opts), drop, ()).await?;
        Ok(Self::from(ocm))
    }

    /// The same session, for blocking calls (copies into borrowed buffers,
    /// mappings, copies between allocations).
    pub fn blocking(&self) -> &Oncilla {
        &self.ocm
    }

    /// Name of the local node.
    pub fn node(&self) -> &str {
        self.ocm.node()
    }

    /// This session's id, as `ocmctl allocs` shows it.
    pub fn session_id(&self) -> &str {
        self.ocm.session_id()
    }

    /// Ends the session now (see [`Oncilla::close`]).
    pub fn close(&self) {
        self.ocm.close();
    }

    /// Allocates `size` bytes of `kind`, placed by the master.
    ///
    /// # Errors
    /// As [`Oncilla::alloc_with`].
    pub async fn alloc(&self, size: u64, kind: Kind) -> Result<Allocation> {
        self.alloc_with(&AllocSpec::new(size, kind)).await
    }

    /// Allocates as `spec` says. Cancelled (the future dropped), an
    /// allocation the call made anyway is freed, also a named one.
    ///
    /// # Errors
    /// As [`Oncilla::alloc_with`].
    pub async fn alloc_with(&self, spec: &AllocSpec) -> Result<Allocation> {
        let spec = spec.clone();
        self.run(
            move |ocm| ocm.alloc_with(&spec),
            |a: Allocation| {
                let _ = a.free();
            },
        )
        .await
    }

    /// Makes `count` allocations as `spec` says, together, all or none.
    ///
    /// # Errors
    /// As [`Oncilla::alloc_many`].
    pub async fn alloc_many(&self, spec: &AllocSpec, count: usize) -> Result<Vec<Allocation>> {
        let spec = spec.clone();
        self.run(move |ocm| ocm.alloc_many(&spec, count), drop)
            .await
    }

    /// Attaches the persistent allocation called `name`.
    ///
    /// # Errors
    /// As [`Oncilla::attach`].
    pub async fn attach(&self, name: &str) -> Result<Allocation> {
        let name = name.to_string();
        self.run(move |ocm| ocm.attach(&name), drop).await
    }

    /// Attaches the persistent allocation with this id.
    ///
    /// # Errors
    /// As [`Oncilla::attach`].
    pub async fn attach_id(&self, id: u64) -> Result<Allocation> {
        self.run(move |ocm| ocm.attach_id(id), drop).await
    }

    /// Frees `alloc` and says how it went. Dropping a handle inside a
    /// tokio runtime releases it too, in the background of the session (a
    /// persistent one is detached, not freed); so does a free cancelled
    /// before it ran.
    ///
    /// # Errors
    /// As [`Allocation::free`].
    pub async fn free(&self, alloc: Allocation) -> Result<()> {
        self.run(move |_| alloc.free(), drop).await
    }

    /// Frees `allocs` together, all or none. Refused, or cancelled before
    /// it ran, the handles are dropped there: each is released as dropping
    /// it releases it (freed, or detached when persistent).
    ///
    /// # Errors
    /// As [`Oncilla::free_many`].
    pub async fn free_many(&self, allocs: Vec<Allocation>) -> Result<()> {
        self.run(
            move |ocm| {
                let mut allocs = allocs;
                ocm.free_many(&mut allocs)
            },
            drop,
        )
        .await
    }

    /// Runs any blocking call of the session (a copy between allocations,
    /// a mapping, [`Allocation::force_free`]) on a thread of its own, in
    /// turn with the other calls; `f` owns what it uses (hand handles
    /// back in its result). What it returns is dropped there if the
    /// future was dropped first.
    ///
    /// # Errors
    /// `f`'s; [`Error::Internal`] if it panicked.
    pub async fn call<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Oncilla) -> Result<T> + Send + 'static,
    {
        self.run(f, drop).await
    }

    /// Writes `data` at `offset` of `alloc`.
    ///
    /// # Errors
    /// As [`Allocation::copy_in`].
    pub async fn write(&self, alloc: &Allocation, offset: u64, data: Vec<u8>) -> Result<()> {
        let mut batch = Batch::new();
        batch.write(alloc, offset, data);
        self.submit(batch).await.map(drop)
    }

    /// Reads `len` bytes at `offset` of `alloc`.
    ///
    /// # Errors
    /// As [`Allocation::copy_out`].
    pub async fn read(&self, alloc: &Allocation, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut batch = Batch::new();
        batch.read(alloc, offset, vec![0u8; len]);
        let mut buffers = self.submit(batch).await?;
        buffers
            .pop()
            .ok_or_else(|| Error::Internal("a batch of one read gave no buffer".into()))
    }

    /// Starts every copy of `batch`; await the [`Pending`] for their end.
    pub fn submit(&self, batch: Batch) -> Pending {
        self.ocm.submit(batch)
    }

    /// Runs the blocking call `f` on a thread of its own once this session
    /// has fewer than [`MAX_CALLS_IN_FLIGHT`] calls running; `undo` gets
    /// its result when nobody awaits it any more.
    async fn run<T, F, U>(&self, f: F, undo: U) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Oncilla) -> Result<T> + Send + 'static,
        U: FnOnce(T) + Send + 'static,
    {
        let calls = Arc::clone(&self.ocm.client.async_calls);
        let turn = calls
            .acquire_owned()
            .await
            .map_err(|_| Error::Internal("the session's call bound was closed".into()))?;
        let ocm = self.ocm.clone();
        off_thread(move || f(&ocm), undo, turn).await
    }
}

impl From<Oncilla> for AsyncOncilla {
    /// The same session, for async code (its calls share the session's
    /// bound, however many times it is converted).
    fn from(ocm: Oncilla) -> Self {
        Self { ocm }
    }
}

/// Runs `f` on a new thread and awaits its result, holding no thread of
/// the caller's meanwhile. The thread keeps `turn` until it is done with
/// the result: handed over, or given to `undo` (the future was dropped).
async fn off_thread<T, F, U, P>(f: F, undo: U, turn: P) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
    U: FnOnce(T) + Send + 'static,
    P: Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("oncilla-call".into())
        .spawn(move || {
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
                let why = p
                    .downcast_ref::<&str>()
                    .map(ToString::to_string)
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Error::Internal(format!("the call panicked: {why}"))
            });
            if let Err(Ok(Ok(unsent))) = tx.send(out) {
                undo(unsent);
            }
            drop(turn);
        })
        .map_err(|e| Error::Internal(format!("cannot start a thread for the call: {e}")))?;
    match rx.await {
        Ok(out) => out?,
        Err(_) => Err(Error::Internal(
            "the call's thread ended without an answer".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::sync::Mutex;

    /// The caller's thread is free while a call waits: on a runtime of one
    /// thread, a task spawned before a connect runs while the connect is
    /// stuck on an agent that does not answer, and its end (the "agent"
    /// hanging up) is what ends the connect. A call that blocked the
    /// thread would hold the task back until its own deadline and end
    /// first.
    #[test]
    fn a_call_leaves_the_callers_thread_free_while_it_waits() {
        let dir = std::env::temp_dir().join(format!("oncilla-async-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("agent.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).unwrap();
        let (hang_up, told) = std::sync::mpsc::channel::<()>();
        // The "agent": takes the connection, says nothing, hangs up when
        // told (each wait bounded: a test never hangs).
        let bound = std::time::Duration::from_secs(60);
        listener.set_nonblocking(true).unwrap();
        let agent = std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let conn = loop {
                match listener.accept() {
                    Ok((conn, _)) => break Some(conn),
                    Err(_) if started.elapsed() < bound => {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    Err(_) => break None,
                }
            };
            let _ = told.recv_timeout(bound);
            drop(conn);
            drop(listener);
        });
        let order = Arc::new(Mutex::new(Vec::new()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let opts = Options::new(socket.clone(), crate::Token::random());
        let result = rt.block_on({
            let order = Arc::clone(&order);
            async move {
                let other = tokio::spawn({
                    let order = Arc::clone(&order);
                    async move {
                        order.lock().unwrap().push("other task ran");
                        let _ = hang_up.send(());
                    }
                });
                let r = AsyncOncilla::connect_with(opts).await;
                order.lock().unwrap().push("connect ended");
                other.await.unwrap();
                r
            }
        });
        agent.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(result.is_err(), "nothing answered, yet it connected");
        assert_eq!(*order.lock().unwrap(), ["other task ran", "connect ended"]);
    }
}
