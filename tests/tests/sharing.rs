//! Named allocations shared between processes on different nodes, striped
//! placement, and same-node memory seen from other nodes. Producers and
//! consumers are separate processes: this test binary re-executed in a
//! role (`ONCILLA_TEST_ROLE`).

#![allow(clippy::unwrap_used)]

mod support;

use std::process::{Command, Output};
use std::time::Duration;

use liboncilla::{AllocSpec, Error, Fabric, Kind, Oncilla, Options, Policy};
use support::Cluster;

const ROLE_ENV: &str = "ONCILLA_TEST_ROLE";
const NAME: &str = "shared-table";
const SIZE: usize = (6 << 20) + 12_345;

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1])
        .collect()
}

/// Runs this binary as `role` against agent `node` of `c`.
fn run_role(c: &Cluster, role: &str, node: usize) -> Output {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "role", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .env("ONCILLA_SOCKET", c.socket(node))
        .env("ONCILLA_TOKEN_FILE", c.token_file())
        .env_remove("ONCILLA_TOKEN")
        .env_remove("ONCILLA_FABRIC")
        .output()
        .unwrap()
}

fn assert_role_ok(out: &Output, role: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("{role} ok")),
        "{role} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The roles, run in child processes.
#[test]
fn role() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return; // only meaningful as a child of the tests below
    };
    let ocm = Oncilla::connect_with(Options::from_env().unwrap()).unwrap();
    match role.as_str() {
        "produce" => {
            // Spread over every agent, striped in 1 MiB units.
            let spec = AllocSpec::new(SIZE as u64, Kind::RemoteHost)
                .policy(Policy::Spread)
                .stripe(1 << 20)
                .named(NAME);
            let a = ocm.alloc_with(&spec).unwrap();
            let nodes: std::collections::BTreeSet<&str> = a
                .descriptor()
                .extents
                .iter()
                .map(|e| e.node.as_str())
                .collect();
            assert_eq!(nodes.len(), 3, "spread over every agent");
            // The local stripes go through shared memory, the rest over the
            // run's remote fabric (TCP, or verbs where RDMA is given).
            let fabrics = a.fabrics();
            assert!(
                fabrics.contains(&Fabric::Shm) && fabrics.contains(&support::remote_fabric()),
                "{fabrics:?}"
            );
            a.copy_in(0, &pattern(SIZE)).unwrap();
            // Exits without freeing: the allocation is named, so it stays.
        }
        "consume" => {
            let a = ocm.attach(NAME).unwrap();
            assert_eq!(a.name(), Some(NAME));
            let mut back = vec![0u8; SIZE];
            a.copy_out(0, &mut back).unwrap();
            assert!(back == pattern(SIZE), "consumer saw different bytes");
        }
        "local-writer" => {
            let mut a = ocm
                .alloc_with(&AllocSpec::new(8192, Kind::LocalHost).named("local-page"))
                .unwrap();
            a.localbuf().unwrap()[4000..4005].copy_from_slice(b"hello");
        }
        "hold" => {
            // Attach, tell the parent, and wait until told (by the parent
            // force-freeing the allocation) that it is gone.
            let a = ocm.attach(NAME).unwrap();
            println!("attached");
            let mut byte = [0u8; 1];
            let mut freed = false;
            for _ in 0..200 {
                match a.copy_out(0, &mut byte) {
                    Ok(()) => std::thread::sleep(Duration::from_millis(50)),
                    Err(Error::NotFound(msg)) => {
                        assert!(
                            msg.contains("freed") || msg.contains("no such allocation"),
                            "{msg}"
                        );
                        freed = true;
                        break;
                    }
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            assert!(freed, "never told that the allocation was freed");
        }
        other => panic!("unknown role {other}"),
    }
    println!("{role} ok");
}

#[test]
fn named_allocation_outlives_its_producer_and_is_freed_by_name() {
    let c = Cluster::start(3, "16MiB");
    assert_role_ok(&run_role(&c, "produce", 0), "produce");
    // The producer is gone; the data is not.
    let allocs = c.ocmctl(&["allocs"]);
    let table = String::from_utf8_lossy(&allocs.stdout);
    assert!(table.contains(NAME) && table.contains("NAME"), "{table}");
    assert_role_ok(&run_role(&c, "consume", 1), "consume");
    assert_role_ok(&run_role(&c, "consume", 2), "consume");
    let show = c.ocmctl(&["show", NAME]);
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.contains("spread, stripe 1.0 MiB") && show.contains("FABRIC"),
        "{show}"
    );

    let out = c.ocmctl(&["free", NAME]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(c.allocation_count(), 0);
    let out = run_role(&c, "consume", 1);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success() && said.contains("no allocation is named"),
        "{said}"
    );
}

#[test]
fn freeing_an_attached_allocation_needs_force_and_tells_the_holder() {
    let c = Cluster::start(3, "16MiB");
    assert_role_ok(&run_role(&c, "produce", 0), "produce");
    // A holder on node-0 maps the local stripes and reads the rest over TCP.
    let holder = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "role", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, "hold")
        .env("ONCILLA_SOCKET", c.socket(0))
        .env("ONCILLA_TOKEN_FILE", c.token_file())
        .env_remove("ONCILLA_TOKEN")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let attached = Cluster::eventually(Duration::from_secs(15), || {
        let v: serde_json::Value =
            serde_json::from_slice(&c.ocmctl(&["show", NAME, "--json"]).stdout).unwrap_or_default();
        v["attached"].as_array().is_some_and(|a| !a.is_empty())
    });
    assert!(attached, "holder never attached");
    let out = c.ocmctl(&["free", NAME]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("attached by") && err.contains("force"),
        "{err}"
    );
    let out = c.ocmctl(&["free", NAME, "--force"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = holder.wait_with_output().unwrap();
    assert_role_ok(&out, "hold");
    assert_eq!(c.allocation_count(), 0);
}

/// The master keeps one attachment per session: a session with two
/// handles of one persistent allocation stays attached until the last
/// goes, so another session cannot free it under the handle left, and
/// that handle can still ask where it is.
#[test]
fn a_session_stays_attached_until_its_last_handle_goes() {
    let c = Cluster::start(2, "16MiB");
    let maker = c.client(1);
    let made = maker
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).named("two-handles"))
        .unwrap();
    let user = c.client(0);
    let first = user.attach("two-handles").unwrap();
    let second = user.attach_id(first.id()).unwrap();
    // The maker's own second handle, and the first of the other session's,
    // go.
    drop(maker.attach_id(made.id()).unwrap());
    drop(first);
    let attached = |c: &Cluster| -> usize {
        let v: serde_json::Value =
            serde_json::from_slice(&c.ocmctl(&["show", "two-handles", "--json"]).stdout).unwrap();
        v["attached"].as_array().map_or(0, Vec::len)
    };
    assert_eq!(attached(&c), 2, "both sessions still hold a handle");
    let out = c.ocmctl(&["free", "two-handles"]);
    assert!(!out.status.success(), "freed under a live handle");
    second.copy_in(0, b"still mine").unwrap();
    let mut back = [0u8; 10];
    made.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"still mine");
    drop(second);
    drop(made);
    assert!(
        Cluster::eventually(Duration::from_secs(15), || attached(&c) == 0),
        "the last handles' drops detach both sessions"
    );
    c.ocmctl_ok(&["free", "two-handles"]);
    assert_eq!(c.allocation_count(), 0);
}

#[test]
fn writes_through_localbuf_are_seen_from_another_node() {
    let c = Cluster::start(2, "8MiB");
    assert_role_ok(&run_role(&c, "local-writer", 0), "local-writer");
    let reader = c.client(1);
    let a = reader.attach("local-page").unwrap();
    assert_eq!(a.fabrics(), [support::remote_fabric()]);
    let mut back = [0u8; 5];
    a.copy_out(4000, &mut back).unwrap();
    assert_eq!(&back, b"hello");
}

/// Memory force-freed while another session still maps it is on its way
/// back: the node's pool counts it so, and an allocation that needs it
/// waits for the holder to let go instead of failing for want of room;
/// it then sees none of the old bytes.
#[test]
fn memory_freed_under_a_mapping_serves_the_next_allocation_once_let_go() {
    const SIZE: usize = 6 << 20;
    let c = Cluster::start(2, "8MiB");
    let owner = c.client(0);
    let holder = c.client(0);
    let mut a = owner
        .alloc_with(&AllocSpec::new(SIZE as u64, Kind::LocalHost).named("mapped-twice"))
        .unwrap();
    a.localbuf().unwrap().fill(0xAB);
    let mut h = holder.attach("mapped-twice").unwrap();
    assert!(h.localbuf().unwrap().iter().all(|&b| b == 0xAB));
    a.force_free().unwrap();

    // The holder lets go a little later, while the next allocation waits.
    let letting_go = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        drop(h);
    });
    let mut next = owner
        .alloc_with(&AllocSpec::new(SIZE as u64, Kind::LocalHost))
        .unwrap_or_else(|e| panic!("the freed memory never came back: {e}"));
    letting_go.join().unwrap();
    assert!(
        next.localbuf().unwrap().iter().all(|&b| b == 0),
        "the next allocation saw the freed bytes"
    );
    next.free().unwrap();
    assert_eq!(c.allocation_count(), 0);
}
