//! Copies between two allocations (issue 22) on a real loopback cluster:
//! every placement pair moves the right bytes at odd offsets, and the
//! agents' own byte counters show which way they went. A side mapped in
//! the client is read into or written out of directly (the fabric moves
//! the bytes once), and between two allocations on other nodes the
//! destination's agent pulls from the source's: no byte passes through the
//! client. The remote allocations use the TCP fabric even where verbs
//! works (the Soft-RoCE guest), so the agents' TCP counters see every
//! byte. Loopback only; every wait bounded.
#![allow(clippy::unwrap_used)]

mod support;

use liboncilla::{AllocSpec, Allocation, Fabric, Kind, Oncilla};
use support::{bytes, get, sample, Cluster};

const AGENTS: [&str; 3] = ["node-0", "node-1", "node-2"];

/// Bytes the agents' TCP data servers counted for `op`, summed over all.
fn moved(c: &Cluster, op: &str) -> u64 {
    let token = std::fs::read_to_string(c.metrics_token_file()).unwrap();
    AGENTS
        .iter()
        .map(|n| {
            let series =
                format!(r#"oncilla_data_bytes_total{{fabric="tcp",op="{op}",node="{n}"}}"#);
            let addr = c.metrics_addr(n).unwrap();
            let (code, text) = get(&addr, "/metrics", Some(&token));
            assert_eq!(code, 200, "{n}: {text}");
            sample(&text, &series).unwrap_or(0.0) as u64
        })
        .sum()
}

/// What one copy made the agents move: bytes read, written and pulled.
fn traffic(c: &Cluster, copy: impl FnOnce()) -> [u64; 3] {
    let ops = ["read", "write", "pull"];
    let before = ops.map(|op| moved(c, op));
    copy();
    let after = ops.map(|op| moved(c, op));
    [0, 1, 2].map(|i| after[i] - before[i])
}

fn check(a: &Allocation, offset: u64, want: &[u8]) {
    let mut back = vec![0u8; want.len()];
    a.copy_out(offset, &mut back).unwrap();
    assert!(back == want, "allocation {} holds other bytes", a.id());
}

fn fill(a: &Allocation, seed: u8) -> Vec<u8> {
    let data = bytes(a.size() as usize, seed);
    a.copy_in(0, &data).unwrap();
    data
}

#[test]
fn copies_between_allocations_take_no_needless_bounce() {
    let c = Cluster::start_metrics(3, "96MiB");
    let ocm: Oncilla = c.client(0);
    let len: u64 = (20 << 20) + 12_345;
    let size = len + (1 << 20);
    // Striped over node-1 and node-2 in 1 MiB units, so segments cross
    // extents on both sides at different places.
    let striped = ocm
        .alloc_with(
            &AllocSpec::new(size, Kind::RemoteHost)
                .on_nodes(["node-1", "node-2"])
                .stripe(1 << 20)
                .fabric(Fabric::Tcp),
        )
        .unwrap();
    let remote = ocm
        .alloc_with(
            &AllocSpec::new(size, Kind::RemoteHost)
                .on_nodes(["node-2", "node-1"])
                .fabric(Fabric::Tcp),
        )
        .unwrap();
    let local = ocm.alloc(size, Kind::LocalHost).unwrap();
    let local2 = ocm.alloc(size, Kind::LocalHost).unwrap();
    let (s_off, d_off) = (4_097u64, 777_777u64);
    let n = usize::try_from(len).unwrap();

    // Remote -> remote: the destination's agents pull; the client neither
    // reads nor writes a byte of it.
    let data = fill(&striped, 1);
    let [read, write, pull] = traffic(&c, || {
        ocm.copy(&remote, d_off, &striped, s_off, len).unwrap();
    });
    check(&remote, d_off, &data[s_off as usize..][..n]);
    assert_eq!(
        (read, write, pull),
        (len, 0, len),
        "remote -> remote: agents read {read}, were written {write}, pulled {pull} bytes"
    );

    // Remote -> local (mapped): one read straight into the mapping.
    let [read, write, pull] = traffic(&c, || {
        ocm.copy(&local, d_off, &remote, d_off, len).unwrap();
    });
    check(&local, d_off, &data[s_off as usize..][..n]);
    assert_eq!((read, write, pull), (len, 0, 0), "remote -> local");

    // Local (mapped) -> remote: one write straight out of the mapping.
    let data = fill(&local, 2);
    let [read, write, pull] = traffic(&c, || {
        ocm.copy(&striped, s_off, &local, d_off, len).unwrap();
    });
    check(&striped, s_off, &data[d_off as usize..][..n]);
    assert_eq!((read, write, pull), (0, len, 0), "local -> remote");

    // Local -> local: between the mappings, no fabric at all.
    let [read, write, pull] = traffic(&c, || {
        ocm.copy(&local2, 0, &local, d_off, len).unwrap();
    });
    check(&local2, 0, &data[d_off as usize..][..n]);
    assert_eq!((read, write, pull), (0, 0, 0), "local -> local");

    // Within one remote allocation, ranges apart: its agents pull from
    // themselves. Overlapping ranges are refused, and nothing moves.
    let data = fill(&striped, 3);
    ocm.copy(&striped, len, &striped, 0, size - len).unwrap();
    check(&striped, len, &data[..usize::try_from(size - len).unwrap()]);
    let err = ocm.copy(&striped, 10, &striped, 0, 100).unwrap_err();
    assert!(
        matches!(&err, liboncilla::Error::InvalidArgument(m) if m.contains("overlap")),
        "{err}"
    );
    let err = ocm.copy(&remote, size - 10, &striped, 0, 11).unwrap_err();
    assert!(
        matches!(err, liboncilla::Error::OutOfBounds { .. }),
        "{err}"
    );

    c.still_serves();
}
