//! A cluster whose TCP listeners speak TLS (issue 21's "TLS for every TCP
//! listener, as an option, tested"): applications, operators and daemons
//! work through it unchanged, what crosses a data port is ciphertext, and
//! peers that do not speak TLS get nothing.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Fabric, Kind};
use oncilla_net::tls::tunnel;
use oncilla_net::wire::{self, Op, Reply, Request, Status, Welcome, KEY_LEN, REPLY_LEN};
use support::Cluster;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 11) as u8)
        .collect()
}

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "ocmctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The data address of node `name`, from the master.
fn data_addr(c: &Cluster, name: &str) -> String {
    c.master()
        .expect("master")
        .nodes()
        .expect("nodes")
        .into_iter()
        .map(|n| n.info)
        .find(|i| i.name == name)
        .map(|i| i.data_addr)
        .unwrap_or_else(|| panic!("no node {name}"))
}

#[test]
fn applications_and_operators_work_through_a_tls_cluster() {
    let c = Cluster::start_tls(2, "64MiB");
    assert!(c.tls.is_some());

    // An application configures nothing: its agent hands it the CA.
    let ocm = c.client(0);
    for (node, size) in [("node-1", 5 << 20), ("node-0", 1 << 20)] {
        let a = ocm
            .alloc_with(
                &AllocSpec::new(size as u64, Kind::RemoteHost)
                    .on_nodes([node])
                    .fabric(Fabric::Tcp),
            )
            .unwrap_or_else(|e| panic!("alloc on {node}: {e}"));
        let data = pattern(size, 0x3c);
        a.copy_in(0, &data).expect("copy_in over TLS");
        let mut back = vec![0u8; size];
        a.copy_out(0, &mut back).expect("copy_out over TLS");
        assert!(back == data, "bytes from {node} came back different");
        a.free().expect("free");
    }
    // A copy between two allocations elsewhere: node-0's agent pulls from
    // node-1's over TLS, trusting the cluster CA.
    let remote = |node: &str| {
        ocm.alloc_with(
            &AllocSpec::new(3 << 20, Kind::RemoteHost)
                .on_nodes([node])
                .fabric(Fabric::Tcp),
        )
        .unwrap()
    };
    let (from, to) = (remote("node-1"), remote("node-0"));
    let data = pattern(3 << 20, 0x5d);
    from.copy_in(0, &data).unwrap();
    ocm.copy(&to, 0, &from, 0, 3 << 20).expect("pull over TLS");
    let mut back = vec![0u8; 3 << 20];
    to.copy_out(0, &mut back).unwrap();
    assert!(back == data, "pulled bytes came back different");
    drop((from, to));

    // Operators: gRPC to the master and data ports over TLS.
    let v: serde_json::Value = serde_json::from_str(&ok(&c.ocmctl(&["nodes", "--json"]))).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2, "{v}");
    let id = ok(&c.ocmctl(&["alloc", "2MiB", "--node", "node-1"]));
    let id = id.trim();
    let input = c.dir.join("in.bin");
    let data = pattern(1_500_000, 7);
    std::fs::write(&input, &data).unwrap();
    ok(&c.ocmctl(&["put", id, input.to_str().unwrap()]));
    let output = c.dir.join("out.bin");
    ok(&c.ocmctl(&[
        "get",
        id,
        "--len",
        "1500000",
        "-o",
        output.to_str().unwrap(),
    ]));
    assert!(
        std::fs::read(&output).unwrap() == data,
        "ocmctl get differs"
    );
    ok(&c.ocmctl(&["free", id]));

    // An operator who does not trust the cluster CA reaches nothing.
    let out = Command::new(support::bin("ocmctl"))
        .args(["nodes"])
        .env("ONCILLA_MASTER", &c.master_addr)
        .env("ONCILLA_TOKEN_FILE", c.token_file())
        .env_remove("ONCILLA_TLS_CA")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "plain gRPC reached a TLS master");
    assert!(
        err.contains("master unreachable") && err.contains("--tls-ca"),
        "{err}"
    );
}

/// Accepts one connection and relays it to `to`, recording every byte
/// that passes in either direction.
fn recording_proxy(to: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    std::thread::spawn(move || {
        let (client, _) = l.accept().unwrap();
        let server = TcpStream::connect(to).unwrap();
        let pipe = |mut from: TcpStream, mut to: TcpStream, seen: Arc<Mutex<Vec<u8>>>| {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                // Bounded: ends when either side closes or after 30 s idle.
                from.set_read_timeout(Some(Duration::from_secs(30)))
                    .unwrap();
                while let Ok(n) = from.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    // Recorded before it is passed on, so whatever the
                    // far side has received is already in `seen`.
                    seen.lock().unwrap().extend_from_slice(&buf[..n]);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Both);
            })
        };
        let a = pipe(
            client.try_clone().unwrap(),
            server.try_clone().unwrap(),
            Arc::clone(&record),
        );
        let b = pipe(server, client, record);
        let _ = (a.join(), b.join());
    });
    (addr, seen)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn what_crosses_a_data_port_is_ciphertext() {
    let c = Cluster::start_tls(2, "64MiB");
    let tls = c.tls.clone().expect("a TLS cluster");
    let a = c.persistent_on(1 << 20, "node-1");
    let key: [u8; KEY_LEN] = a.access_key.as_slice().try_into().unwrap();
    let (proxy, seen) = recording_proxy(data_addr(&c, "node-1"));

    let tcp = TcpStream::connect(&proxy).unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    let mut s = tunnel::connect(tcp, tls.data(), "127.0.0.1", until, Duration::from_secs(10))
        .expect("TLS through the proxy");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    wire::write_hello(&mut s, c.token.as_bytes()).unwrap();
    let (code, msg) = wire::read_welcome(&mut s).unwrap();
    assert_eq!(code, Welcome::Ok, "{msg}");
    let payload = pattern(256 << 10, 0xa5);
    let write = Request {
        op: Op::Write,
        alloc_id: a.id,
        key,
        offset: 0,
        len: payload.len() as u64,
    };
    s.write_all(&write.encode()).unwrap();
    s.write_all(&payload).unwrap();
    let mut head = [0u8; REPLY_LEN];
    s.read_exact(&mut head).unwrap();
    assert_eq!(Reply::decode(&head).unwrap().status, Status::Ok);
    let read = Request {
        op: Op::Read,
        ..write
    };
    s.write_all(&read.encode()).unwrap();
    s.read_exact(&mut head).unwrap();
    let mut back = vec![0u8; payload.len()];
    s.read_exact(&mut back).unwrap();
    assert!(back == payload, "read back differs");
    drop(s);

    let seen = seen.lock().unwrap().clone();
    // Both copies of the payload crossed the proxy, as ciphertext.
    assert!(
        seen.len() > 2 * payload.len(),
        "only {} bytes seen",
        seen.len()
    );
    for (what, secret) in [
        ("the cluster token", c.token.as_bytes()),
        ("the access key", &key[..]),
        ("the payload", &payload[1000..1064]),
    ] {
        assert!(!contains(&seen, secret), "{what} crossed the wire in clear");
    }
    ok(&c.ocmctl(&["free", &a.id.to_string()]));
}

#[test]
fn plaintext_peers_get_nothing_from_tls_listeners() {
    let c = Cluster::start_tls(2, "64MiB");
    let addr = data_addr(&c, "node-1");

    // A plain data client with the right token: no welcome, connection
    // ended within the handshake deadline.
    let started = Instant::now();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    wire::write_hello(&mut s, c.token.as_bytes()).unwrap();
    let answer = wire::read_welcome(&mut s);
    assert!(
        !matches!(answer, Ok((Welcome::Ok, _))),
        "a plaintext hello was welcomed: {answer:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    // A silent one is cut at the deadline, not held.
    let mut silent = TcpStream::connect(&addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let started = Instant::now();
    let n = silent.read(&mut [0u8; 16]).unwrap_or(0);
    assert_eq!(n, 0, "a silent peer was sent bytes");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "held {:?}",
        started.elapsed()
    );

    c.still_serves();
}

/// Peers that finish the TLS handshake and then say nothing, or stop
/// reading, hold nothing for long: the hello deadline closes the
/// protocol's end, and the tunnel's threads follow it.
#[test]
fn silent_tls_peers_leave_no_threads_behind() {
    let c = Cluster::start_tls(2, "64MiB");
    let tls = c.tls.clone().unwrap();
    let addr = data_addr(&c, "node-1");
    let tunnel_threads = |c: &Cluster| {
        c.agent_threads(1)
            .iter()
            .filter(|(name, _)| name.starts_with("oncilla-tls"))
            .count()
    };
    let before = tunnel_threads(&c);
    let mut held = Vec::new();
    for _ in 0..20 {
        let tcp = TcpStream::connect(&addr).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        held.push(
            tunnel::connect(tcp, tls.data(), "127.0.0.1", until, Duration::from_secs(60)).unwrap(),
        );
    }
    // The agent's side finishes its handshake a moment after ours.
    assert!(
        Cluster::eventually(Cluster::EVENT, || tunnel_threads(&c) >= before + 40),
        "20 tunnels should hold 40 relay threads on the agent, not {}: {:?}",
        tunnel_threads(&c),
        c.agent_threads(1)
            .iter()
            .map(|t| t.0.clone())
            .collect::<Vec<_>>()
    );
    // Past the 5 s hello deadline every one is closed by the agent.
    assert!(
        Cluster::eventually(Duration::from_secs(15), || tunnel_threads(&c) <= before),
        "{} relay threads left on the agent",
        tunnel_threads(&c)
    );
    for mut s in held {
        let mut b = [0u8; 1];
        assert_eq!(
            s.read(&mut b).unwrap_or(0),
            0,
            "a silent peer was sent bytes"
        );
    }
    c.still_serves();
}
