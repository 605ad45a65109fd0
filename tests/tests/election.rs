//! Standby masters elected through a real etcd (Debian's `etcd-server`,
//! which `.ci/run` installs; started here on loopback): a killed leader is
//! replaced within its lease and the new one rebuilds the table from the
//! agents; a leader cut off (frozen with SIGSTOP) stops acting once its
//! lease ends, answers as a standby when it comes back, and agents refuse
//! its term; with etcd gone the leader stops at its lease's end and no
//! standby takes over until etcd is back. Every wait is bounded.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Kind, Policy};
use nix::sys::signal::Signal;
use oncilla_cluster::etcd::Etcd;
use oncilla_proto::client;
use oncilla_proto::pb;
use serde_json::Value;
use support::Cluster;

/// The leaders' lease: the shortest the daemon takes, so take-overs are
/// quick.
const LEASE_SECS: u64 = 2;
/// How long a take-over may take: the lease, an election, a recovery
/// window, on a loaded machine.
const BOUND: Duration = Duration::from_secs(60);

/// A started etcd of `members`, or `None` (and a line saying so) without
/// the program.
fn etcd(members: usize) -> Option<Etcd> {
    if !Etcd::available() {
        println!("skipped: no etcd program (apt-get install etcd-server; .ci/run installs it)");
        return None;
    }
    Some(Etcd::start(members, BOUND).unwrap_or_else(|e| panic!("{e}")))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// What master `i` answers to a node listing, asked once and at it alone
/// (no following, no waiting).
fn ask(c: &Cluster, i: usize) -> Result<usize, tonic::Status> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = client::lazy(&c.master_addrs[i], &c.token, None).unwrap();
        let mut m = client::master(channel);
        let mut req = tonic::Request::new(pb::ListNodesRequest {});
        req.set_timeout(Duration::from_secs(2));
        m.list_nodes(req).await.map(|r| r.into_inner().nodes.len())
    })
}

/// The master that leads once one does (bounded).
fn leader(c: &Cluster) -> usize {
    let mut found = None;
    assert!(
        Cluster::eventually(BOUND, || {
            found = (0..c.master_addrs.len()).find(|&i| ask(c, i).is_ok());
            found.is_some()
        }),
        "no master leads"
    );
    found.unwrap()
}

fn allocs(c: &Cluster) -> Vec<Value> {
    c.ocmctl_json(&["allocs", "--json"])
        .as_array()
        .cloned()
        .unwrap()
}

/// What an allocation is, beside what a restart may change (health,
/// attachments).
fn shape(a: &Value) -> (Value, Value, Value) {
    (a["id"].clone(), a["size"].clone(), a["extents"].clone())
}

/// Agent `i`'s gRPC address, from the master.
fn agent_addr(c: &Cluster, i: usize) -> String {
    let name = oncilla_cluster::node_name(i);
    c.master()
        .unwrap()
        .nodes()
        .unwrap()
        .into_iter()
        .find(|n| n.info.name == name)
        .unwrap()
        .info
        .agent_addr
}

/// A release asked of agent `i` with the cluster token, as a master of
/// `term` asks one (0: a master that was not elected).
fn release_as(c: &Cluster, i: usize, term: u64) -> Result<(), tonic::Status> {
    let addr = agent_addr(c, i);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut a = client::agent(client::lazy(&addr, &c.token, None).unwrap());
        let mut req = tonic::Request::new(pb::ReleaseRequest {
            alloc_id: 1 << 50,
            ranges: Vec::new(),
        });
        client::set_term(&mut req, term);
        a.release(req).await.map(|_| ())
    })
}

#[test]
fn a_standby_takes_over_when_the_leader_is_killed() {
    let Some(etcd) = etcd(1) else { return };
    let c = Cluster::start_elected(2, "16MiB", 1, &etcd.urls(), LEASE_SECS);
    let first = leader(&c);
    let ocm = c.client(0);
    let a = ocm
        .alloc_with(
            &AllocSpec::new(3 << 20, Kind::RemoteHost)
                .policy(Policy::Spread)
                .stripe(1 << 20),
        )
        .unwrap();
    let data = pattern(3 << 20, 7);
    a.copy_in(0, &data).unwrap();
    c.ocmctl_ok(&["alloc", "1MiB", "--node", "node-1"]);
    let before: Vec<_> = allocs(&c).iter().map(shape).collect();
    assert_eq!(before.len(), 2);

    c.kill_master_at(first);
    let killed = Instant::now();
    // ocmctl, given both masters, waits through the take-over.
    let out = c.ocmctl(&["alloc", "1MiB", "--node", "node-0"]);
    let took = killed.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ocmctl alloc during the take-over: {err}"
    );
    assert_eq!(
        err.lines().count(),
        1,
        "one line saying why it waits: {err}"
    );
    assert!(
        err.contains("standby") || err.contains("re-register"),
        "{err}"
    );
    let second = leader(&c);
    assert_ne!(second, first);
    // The new leader rebuilt the table from the agents.
    let after: Vec<_> = allocs(&c).iter().map(shape).collect();
    assert_eq!(after.len(), 3);
    for b in &before {
        assert!(after.contains(b), "{b:?} missing after the take-over");
    }
    // The application's session carries on: its agent followed the leader.
    let mut back = vec![0u8; 3 << 20];
    a.copy_out(0, &mut back).unwrap();
    assert!(back == data, "bytes changed across the take-over");
    let more = ocm.alloc(1 << 20, Kind::RemoteHost).unwrap();
    more.free().unwrap();
    a.free().unwrap();
    // The old leader, back, stands by and names the new one.
    c.start_master_at(first).unwrap();
    assert!(Cluster::eventually(BOUND, || {
        ask(&c, first).is_err_and(|s| {
            oncilla_proto::status::standby_leader(&s) == Some(Some(c.master_addrs[second].clone()))
        })
    }));
    println!(
        "take-over: kill -9 of the leader to ocmctl's allocation done: {} ms (lease {LEASE_SECS} s)",
        took.as_millis()
    );
}

#[test]
fn a_cut_off_leader_stops_acting_and_agents_refuse_its_term() {
    let Some(etcd) = etcd(1) else { return };
    let c = Cluster::start_elected(2, "16MiB", 1, &etcd.urls(), LEASE_SECS);
    let first = leader(&c);
    let other = 1 - first;
    // Agents follow the elected term: an unelected master's release, or
    // one of a term older than any election's, is refused.
    for term in [0, 1] {
        let refused = release_as(&c, 0, term).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(
            refused.message().contains("deposed") || refused.message().contains("not elected"),
            "{}",
            refused.message()
        );
    }
    // A term named in a call is compared, never learnt: a token holder
    // naming a huge one does not lock the leader out.
    release_as(&c, 0, u64::MAX).unwrap();
    c.ocmctl_ok(&["alloc", "1MiB", "--node", "node-0"]);

    // Frozen, as a machine cut off from etcd and everyone would be.
    c.signal_master(first, Signal::SIGSTOP);
    assert!(
        Cluster::eventually(BOUND, || ask(&c, other).is_ok()),
        "the standby did not take over"
    );
    c.ocmctl_ok(&["alloc", "1MiB", "--node", "node-0"]);
    c.signal_master(first, Signal::SIGCONT);
    // Back, it finds its lease ended: it acts no more and names the leader.
    assert!(Cluster::eventually(BOUND, || {
        ask(&c, first).is_err_and(|s| {
            oncilla_proto::status::standby_leader(&s) == Some(Some(c.master_addrs[other].clone()))
        })
    }));
    c.ocmctl_ok(&["alloc", "1MiB", "--node", "node-1"]);
    assert_eq!(allocs(&c).len(), 3);
    assert_eq!(leader(&c), other);
}

#[test]
fn without_etcd_the_leader_stops_at_its_lease_end_and_nobody_takes_over() {
    let Some(mut etcd) = etcd(1) else { return };
    let c = Cluster::start_elected(2, "16MiB", 1, &etcd.urls(), LEASE_SECS);
    let first = leader(&c);
    c.ocmctl_ok(&["alloc", "1MiB", "--node", "node-0"]);

    etcd.kill_member(0);
    // The leader cannot renew: it stops acting, with a clear refusal.
    assert!(
        Cluster::eventually(BOUND, || (0..2).all(|i| ask(&c, i).is_err())),
        "a master still acts without etcd"
    );
    let refused = ask(&c, first).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(
        refused.message().contains("standby"),
        "{}",
        refused.message()
    );
    // And stays so: nobody leads without etcd (asked for a while, bounded).
    let quiet = Instant::now() + Duration::from_secs(2 * LEASE_SECS);
    while Instant::now() < quiet {
        assert!(
            (0..2).all(|i| ask(&c, i).is_err()),
            "a master took over without etcd"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    etcd.start_member(0).unwrap();
    etcd.wait_healthy(BOUND).unwrap();
    leader(&c);
    c.ocmctl_ok(&["alloc", "1MiB", "--node", "node-1"]);
    assert_eq!(allocs(&c).len(), 2, "the table was rebuilt whole");
}

#[test]
fn three_etcd_members_elect_through_the_loss_of_one() {
    let Some(mut etcd) = etcd(3) else { return };
    let c = Cluster::start_elected(1, "16MiB", 1, &etcd.urls(), LEASE_SECS);
    let first = leader(&c);
    etcd.kill_member(0);
    c.kill_master_at(first);
    let killed = Instant::now();
    let second = leader(&c);
    assert_ne!(second, first);
    c.ocmctl_ok(&["alloc", "1MiB", "--node", "node-0"]);
    println!(
        "take-over with 3 etcd members, one of them down: {} ms to a leader answering",
        killed.elapsed().as_millis()
    );
}
