//! The client against a real etcd (Debian's `etcd-server`, which `.ci/run`
//! installs), started on loopback ports in a temporary directory: a lease
//! not kept alive hands the leadership to the next campaigner with a larger
//! term, a resignation ends it, and bad endpoints are clear errors. Every
//! wait is bounded.

#![allow(clippy::unwrap_used)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oncilla_etcd::{Etcd, EtcdError};

/// A one-member etcd on loopback, killed on drop.
struct Server {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A started etcd, or `None` (and a line saying so) without the binary.
fn etcd() -> Option<Server> {
    if Command::new("etcd").arg("--version").output().is_err() {
        println!("skipped: no etcd binary (apt-get install etcd-server; .ci/run installs it)");
        return None;
    }
    let (client, peer) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("oncilla-etcd-{}-{client}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
    let child = Command::new("etcd")
        .args(["--name", "t", "--data-dir"])
        .arg(dir.join("data"))
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("t={peer_url}")])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Some(Server { child, dir, url })
}

/// A client of `s` once it grants leases (bounded).
async fn ready(s: &Server) -> Etcd {
    let etcd = Etcd::new(std::slice::from_ref(&s.url), Duration::from_secs(2)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match etcd.grant(Duration::from_secs(1)).await {
            Ok(_) => return etcd,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!(
                "etcd not up in 30 s: {e}; its log: {}",
                std::fs::read_to_string(s.dir.join("etcd.log")).unwrap_or_default()
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_not_kept_alive_hands_the_leadership_on_with_a_larger_term() {
    let Some(server) = etcd() else { return };
    let etcd = ready(&server).await;
    // Long enough that a renewal every half second never lapses on a
    // loaded machine; B then waits at most this long after A stops.
    let ttl = Duration::from_secs(5);

    let a = etcd.grant(ttl).await.unwrap();
    let mut a_alive = etcd.keep_alive(a.id).await.unwrap();
    assert!(a_alive.renew().await.unwrap() > Duration::ZERO);
    let first = etcd
        .campaign("oncilla/master", b"a:7070", a.id)
        .await
        .unwrap();
    let leader = etcd.leader("oncilla/master").await.unwrap().unwrap();
    assert_eq!(
        (leader.value.as_slice(), leader.term),
        (&b"a:7070"[..], first.term)
    );

    // B campaigns with a lease it keeps alive; it waits while A's lives.
    let b = etcd.grant(ttl).await.unwrap();
    let keeper = {
        let etcd = etcd.clone();
        tokio::spawn(async move {
            let mut alive = etcd.keep_alive(b.id).await.unwrap();
            for _ in 0..240 {
                alive.renew().await.unwrap();
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let second = {
        let etcd = etcd.clone();
        tokio::spawn(async move { etcd.campaign("oncilla/master", b"b:7070", b.id).await })
    };
    for _ in 0..6 {
        a_alive.renew().await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!second.is_finished(), "B led while A's lease lived");
    }

    // A stops renewing: within its time to live B leads, with a larger term.
    let started = Instant::now();
    let second = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("B did not lead within 30 s of A's last renewal")
        .unwrap()
        .unwrap();
    println!("B led {:?} after A's last renewal", started.elapsed());
    assert!(second.term > first.term, "{second:?} after {first:?}");
    let leader = etcd.leader("oncilla/master").await.unwrap().unwrap();
    assert_eq!(
        (leader.value.as_slice(), leader.term),
        (&b"b:7070"[..], second.term)
    );
    match a_alive.renew().await {
        Err(EtcdError::LeaseGone(id)) => assert_eq!(id, a.id),
        other => panic!("renewing an expired lease: {other:?}"),
    }

    etcd.resign(&second).await.unwrap();
    assert_eq!(etcd.leader("oncilla/master").await.unwrap(), None);
    keeper.abort();
    etcd.revoke(b.id).await.unwrap();
}

#[tokio::test]
async fn endpoints_that_cannot_be_used_are_clear_errors() {
    assert!(matches!(
        Etcd::new(&[], Duration::from_secs(1)),
        Err(EtcdError::NoEndpoint)
    ));
    let bad = Etcd::new(&["not a url".to_string()], Duration::from_secs(1));
    assert!(
        matches!(&bad, Err(EtcdError::Endpoint { endpoint, .. }) if endpoint == "not a url"),
        "{:?}",
        bad.err()
    );
    // Nobody listens there: the call fails within the connect timeout.
    let port = free_port();
    let etcd = Etcd::new(
        &[format!("http://127.0.0.1:{port}")],
        Duration::from_secs(1),
    )
    .unwrap();
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(20), etcd.grant(Duration::from_secs(1)))
        .await
        .expect("a grant from nobody did not end")
        .unwrap_err();
    assert!(
        matches!(
            err,
            EtcdError::Call {
                call: "lease grant",
                ..
            }
        ),
        "{err}"
    );
    println!("refused after {:?}: {err}", started.elapsed());
}
