//! liboncilla called from async code, on a real loopback cluster: a tokio
//! application (either runtime flavour) connects, allocates, copies,
//! awaits a batch and drops every handle and the session inside its
//! runtime. Before, the first call panicked ("Cannot start a runtime from
//! within a runtime"), and so did a handle dropped there (its free blocks
//! on the session's runtime).

#![allow(clippy::unwrap_used)]

mod support;

use liboncilla::{AllocSpec, Batch, Kind, Oncilla, Options};
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

#[test]
fn the_blocking_api_works_inside_a_tokio_runtime_and_batches_are_futures() {
    let c = Cluster::start(2, "32MiB");
    let opts = || Options::new(c.socket(0), c.token.clone());
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    current.block_on(app(opts()));
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    multi.block_on(async { tokio::spawn(app(opts())).await.unwrap() });
    assert_eq!(c.allocation_count(), 0, "every allocation freed");
    c.still_serves();
}
