//! liboncilla called from async code, on a real loopback cluster: a tokio
//! application (either runtime flavour) connects, allocates, copies,
//! awaits a batch and drops every handle and the session inside its
//! runtime. Before, the first call panicked ("Cannot start a runtime from
//! within a runtime"), and so did a handle dropped there (its free blocks
//! on the session's runtime). Then the async API (`AsyncOncilla`: every
//! call a future) does the same on both tokio flavours and on an executor
//! that is not tokio's.

#![allow(clippy::unwrap_used)]

mod support;

use liboncilla::{AllocSpec, AsyncOncilla, Batch, Kind, Oncilla, Options};
use support::Cluster;

async fn app(opts: Options) {
    let ocm = Oncilla::connect_with(opts).unwrap();
    let local = ocm.alloc(1 << 20, Kind::RemoteHost).unwrap();
    let far = ocm
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    local.copy_in(0, &[7u8; 4096]).unwrap();
    let mut batch = Batch::new();
    batch
        .write(&far, 0, vec![9u8; 8192])
        .read(&local, 0, vec![0u8; 4096]);
    // Awaited, not waited for: the worker is free meanwhile.
    let buffers = ocm.submit(batch).await.unwrap();
    assert!(buffers[1].iter().all(|&b| b == 7));
    let mut back = vec![0u8; 8192];
    far.copy_out(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 9));
    let many = ocm
        .alloc_many(&AllocSpec::new(4096, Kind::RemoteHost), 8)
        .unwrap();
    drop(many);
    far.free().unwrap();
    drop(local);
    drop(ocm);
}

/// Runs `app` on a current-thread runtime, then spawned on a
/// multi-thread one; returns the current-thread runtime for more.
fn on_both_flavours<F, Fut>(app: F) -> tokio::runtime::Runtime
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    current.block_on(app());
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    multi.block_on(async { tokio::spawn(app()).await.unwrap() });
    current
}

/// Asserts every allocation is freed, waiting for it with a bound:
/// handles dropped in async code are released in the background.
fn all_freed(c: &Cluster) {
    let freed = Cluster::eventually(Cluster::EVENT, || c.allocation_count() == 0);
    assert!(freed, "{} allocations left", c.allocation_count());
}

#[test]
fn the_blocking_api_works_inside_a_tokio_runtime_and_batches_are_futures() {
    let c = Cluster::start(2, "32MiB");
    let opts = || Options::new(c.socket(0), c.token.clone());
    on_both_flavours(|| app(opts()));
    all_freed(&c);
    c.still_serves();
}

/// The async API end to end: every call a future, copies included.
async fn async_app(opts: Options) {
    let ocm = AsyncOncilla::connect_with(opts).await.unwrap();
    let far = ocm
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-1"]))
        .await
        .unwrap();
    ocm.write(&far, 4096, vec![5u8; 8192]).await.unwrap();
    let back = ocm.read(&far, 4096, 8192).await.unwrap();
    assert!(back.iter().all(|&b| b == 5));
    let named = ocm
        .alloc_with(&AllocSpec::new(4096, Kind::RemoteHost).named("async-shared"))
        .await
        .unwrap();
    ocm.write(&named, 0, vec![3u8; 4096]).await.unwrap();
    let again = ocm.attach("async-shared").await.unwrap();
    assert_eq!(ocm.read(&again, 0, 4096).await.unwrap(), vec![3u8; 4096]);
    drop(again);
    let err = ocm.attach("no-such-allocation").await.unwrap_err();
    assert!(matches!(err, liboncilla::Error::NotFound(_)), "{err}");
    let many = ocm
        .alloc_many(&AllocSpec::new(4096, Kind::RemoteHost), 8)
        .await
        .unwrap();
    assert_eq!(many.len(), 8);
    // Any blocking call, in turn: a copy between two allocations (the
    // other six are released as they drop).
    let mut many = many.into_iter();
    let (a, b) = (many.next().unwrap(), many.next().unwrap());
    drop(many);
    ocm.write(&a, 0, vec![4u8; 4096]).await.unwrap();
    let (a, b) = ocm
        .call(move |o| {
            o.copy(&b, 0, &a, 0, 4096)?;
            Ok((a, b))
        })
        .await
        .unwrap();
    assert_eq!(ocm.read(&b, 0, 4096).await.unwrap(), vec![4u8; 4096]);
    ocm.free(a).await.unwrap();
    drop(b);
    ocm.free(named).await.unwrap();
    ocm.free(far).await.unwrap();
    ocm.close();
}

/// A named allocation whose call is cancelled after it started is freed,
/// not left behind (it outlives the session that would otherwise end it;
/// the test checks it is gone).
async fn cancelled(opts: Options) {
    let ocm = AsyncOncilla::connect_with(opts).await.unwrap();
    let spec = AllocSpec::new(4096, Kind::RemoteHost).named("async-cancelled");
    // Polled once (its call starts on a thread of its own), then dropped.
    match tokio::time::timeout(std::time::Duration::ZERO, ocm.alloc_with(&spec)).await {
        Err(_) => {}
        // The call ended within its first poll: freed here instead.
        Ok(made) => {
            eprintln!("the call ended within its first poll; its undo was not exercised");
            ocm.free(made.unwrap()).await.unwrap();
        }
    }
}

/// Polls `fut` to its end on this thread, parking between wake-ups: an
/// executor that is not tokio's.
fn park_on<F: std::future::Future>(fut: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

#[test]
fn the_async_api_runs_on_tokio_and_on_any_executor() {
    let c = Cluster::start(2, "32MiB");
    let opts = || Options::new(c.socket(0), c.token.clone());
    let current = on_both_flavours(|| async_app(opts()));
    park_on(async_app(opts()));
    current.block_on(cancelled(opts()));
    let gone = Cluster::eventually(Cluster::EVENT, || {
        !c.ocmctl(&["show", "async-cancelled"]).status.success()
    });
    assert!(gone, "a cancelled call left its named allocation behind");
    all_freed(&c);
    c.still_serves();
}
