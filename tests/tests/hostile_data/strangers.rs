//! Strangers on every listener: idle or dripping connections to the data
//! port, the map socket and the gRPC port, a wrong token, HTTP/2 prefaces
//! that never finish; none of them blocks a copy or the master.

use super::*;

#[test]
fn idle_and_dripping_strangers_never_block_a_copy() {
    let idle_n = hostile_budget(2000);
    let c = Cluster::start(2, "64MiB");
    let addr = data_addr(&c, "node-1");
    // A session that already has its data connection, and one made during
    // the attack (a new handshake must get through).
    let before = c.client(0);
    normal_copy_with(&before, "node-1", 4096, 1);

    let idle = idle_tcp(addr, idle_n, Duration::from_secs(20));
    assert!(
        idle.len() >= idle_n / 2,
        "only {} of {idle_n} idle connections opened",
        idle.len()
    );
    // Drippers: a valid hello's first bytes, one a second.
    let drip_n = hostile_budget(idle_n + 1100) - idle_n;
    let mut drip = idle_tcp(addr, drip_n, Duration::from_secs(10));
    let mut hello = Vec::new();
    wire::write_hello(&mut hello, b"not-the-token").unwrap();
    let drip_step = |drip: &mut [TcpStream], k: usize| {
        for s in drip.iter_mut() {
            let _ = s.write(&hello[k % hello.len()..][..1]);
        }
    };
    drip_step(&mut drip, 0);
    let started = Instant::now();

    // While they are all open, every copy succeeds, old session and new.
    let peak_threads = threads(&c, 1);
    for round in 0..5u8 {
        normal_copy_with(&before, "node-1", 4096, round);
        normal_copy(&c, "node-1", 1 << 20, round);
        drip_step(&mut drip, usize::from(round) + 1);
    }
    eprintln!(
        "{} idle and {} dripping data connections open: {peak_threads} agent threads",
        idle.len(),
        drip.len()
    );
    assert!(
        peak_threads < 64 + MAX_PENDING + 64,
        "{} idle connections made {peak_threads} agent threads",
        idle.len()
    );

    // Past the handshake deadline every hostile socket has been closed by
    // the agent, the drippers included although they kept sending.
    let mut k = 10;
    let open = open_past_deadline(started, HANDSHAKE_DEADLINE, || {
        drip_step(&mut drip, k);
        k += 1;
        idle.iter().filter(|s| !tcp_closed(s)).count()
            + drip.iter().filter(|s| !tcp_closed(s)).count()
    });
    let open_idle = idle.iter().filter(|s| !tcp_closed(s)).count();
    assert_eq!(
        open_idle, 0,
        "idle connections still open past the handshake deadline ({open} in all)"
    );
    let open_drip = drip.iter().filter(|s| !tcp_closed(s)).count();
    assert_eq!(
        open_drip, 0,
        "dripping connections still open past the handshake deadline"
    );
    drop((idle, drip));
    normal_copy(&c, "node-1", 1 << 20, 9);
    c.still_serves();
}

#[test]
fn a_wrong_token_learns_nothing_but_the_refusal() {
    let c = Cluster::start(1, "16MiB");
    let addr = data_addr(&c, "node-0");
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // An unknown version with a wrong token: the agent must not say which
    // version it speaks to someone without the token.
    let mut hello = wire::MAGIC.to_vec();
    hello.extend_from_slice(&99u16.to_le_bytes());
    hello.extend_from_slice(&5u16.to_le_bytes());
    hello.extend_from_slice(b"wrong");
    s.write_all(&hello).unwrap();
    let (code, msg) = wire::read_welcome(&mut s).unwrap();
    assert_eq!(code, Welcome::Denied);
    assert_eq!(msg, "permission denied: wrong cluster token");
    normal_copy(&c, "node-0", 4096, 3);
    c.still_serves();
}

#[test]
fn idle_map_socket_connections_keep_threads_bounded() {
    let n = hostile_budget(2000);
    let c = Cluster::start(1, "16MiB");
    let map = oncilla_net::map_socket(&c.socket(0));
    let baseline = threads(&c, 0);
    let mut hostile = Vec::with_capacity(n);
    for _ in 0..n {
        match UnixStream::connect(&map) {
            Ok(s) => hostile.push(s),
            Err(e) => panic!("map connection {}: {e}", hostile.len()),
        }
    }
    let started = Instant::now();
    // Right after the burst: pending connections' threads plus evicted ones
    // not yet gone (a busy machine schedules their exit late); 2,000 before
    // the limits.
    let peak = (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            threads(&c, 0)
        })
        .max()
        .unwrap_or(0);
    eprintln!("{n} idle map connections: at most {peak} agent threads (baseline {baseline})");
    assert!(
        peak <= baseline + 3 * MAX_PENDING + 32,
        "{n} idle map connections made {peak} agent threads (baseline {baseline})"
    );
    // Once the evicted threads are gone, only the pending budget's remain
    // (well before their hello deadline ends them too).
    let settled = baseline + MAX_PENDING + 16;
    assert!(
        Cluster::eventually(Duration::from_secs(5), || threads(&c, 0) <= settled),
        "{n} idle map connections keep {} agent threads (baseline {baseline}, pending budget {MAX_PENDING})",
        threads(&c, 0)
    );
    // Same-node memory still maps and copies while they are open.
    let ocm = c.client(0);
    let mut a = ocm.alloc(64 << 10, Kind::LocalHost).expect("local alloc");
    assert_eq!(a.fabrics(), [Fabric::Shm]);
    let data = pattern(64 << 10, 6);
    a.localbuf().expect("mapped").copy_from_slice(&data);
    let mut back = vec![0u8; data.len()];
    a.copy_out(0, &mut back).unwrap();
    assert!(back == data, "mapped bytes did not come back");
    a.free().unwrap();

    let open = open_past_deadline(started, MAP_DEADLINE, || {
        hostile.iter().filter(|s| !unix_closed(s)).count()
    });
    assert_eq!(open, 0, "idle map connections still open past the deadline");
    drop(hostile);
    assert!(
        threads(&c, 0) <= baseline + 4,
        "threads did not come back to {baseline}: {}",
        threads(&c, 0)
    );
    let ocm = c.client(0);
    let a = ocm.alloc(4096, Kind::LocalHost).expect("alloc after");
    a.copy_in(0, &[1u8; 4096]).unwrap();
    a.free().unwrap();
    c.still_serves();
}

#[test]
fn idle_grpc_connections_do_not_stop_the_master_or_the_session_socket() {
    let n = hostile_budget(1000);
    let c = Cluster::start(1, "16MiB");
    let addr: SocketAddr = c.master_addr.parse().expect("master address");
    let hostile = idle_tcp(addr, n, Duration::from_secs(10));
    // And the agent's session socket (a gRPC server too).
    let idle_session: Vec<UnixStream> = (0..n / 2)
        .map(|i| {
            UnixStream::connect(c.socket(0))
                .unwrap_or_else(|e| panic!("session connection {i}: {e}"))
        })
        .collect();
    let started = Instant::now();
    assert!(hostile.len() >= n / 2, "only {} opened", hostile.len());
    let out = c.ocmctl(&["nodes"]);
    assert!(
        out.status.success(),
        "ocmctl nodes failed with {} idle gRPC connections: {}",
        hostile.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("node-0"));
    let ocm = c.client(0);
    let a = ocm
        .alloc(4096, Kind::RemoteHost)
        .expect("alloc during the attack");
    a.copy_in(0, &[2u8; 4096]).unwrap();
    a.free().unwrap();
    let open = open_past_deadline(started, PREFACE_DEADLINE, || {
        hostile.iter().filter(|s| !tcp_closed(s)).count()
            + idle_session.iter().filter(|s| !unix_closed(s)).count()
    });
    assert_eq!(
        hostile.iter().filter(|s| !tcp_closed(s)).count(),
        0,
        "idle gRPC connections still open past the preface deadline ({open} in all)"
    );
    let open = idle_session.iter().filter(|s| !unix_closed(s)).count();
    assert_eq!(
        open, 0,
        "idle session-socket connections still open past the preface deadline"
    );
    assert_eq!(c.nodes_up(), 1);
    c.still_serves();
}

/// Before, about 4,100 connections that sent the HTTP/2 preface (and
/// answered PINGs) held every one of the master's gRPC connections:
/// `ocmctl nodes` and `ocmctl health` timed out. Now a TCP connection
/// keeps its place in the pending budget (64, 32 from one address, the
/// oldest evicted first) until its first call the interceptor admits: the
/// strangers evict each other, and the operator is served during the flood.
#[test]
fn strangers_that_speak_http2_cannot_fill_the_master() {
    // Past the master's 4,096 connections; fewer where descriptors are short.
    let n = hostile_budget(4200);
    let c = Cluster::start(1, "16MiB");
    let addr: SocketAddr = c.master_addr.parse().expect("master address");
    // The client preface and an empty SETTINGS frame (RFC 9113 §3.4),
    // each connection in turn, waiting for the server's SETTINGS (it read
    // the preface) before the next, as a patient attacker would.
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut hostile = Vec::with_capacity(n);
    while hostile.len() < n && Instant::now() < deadline {
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else {
            continue;
        };
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut frame = [0u8; 9];
        if s.write_all(&preface).is_ok() && s.read_exact(&mut frame).is_ok() {
            hostile.push(s);
        }
    }
    let spoke = hostile.len();
    assert!(spoke >= n / 2, "only {spoke} spoke HTTP/2");
    for args in [&["nodes"][..], &["health"][..]] {
        let out = c.ocmctl(args);
        assert!(
            out.status.success(),
            "ocmctl {args:?} failed during {spoke} HTTP/2 strangers: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let open = hostile.iter().filter(|s| !tcp_closed(s)).count();
    assert!(
        open <= MAX_PENDING,
        "{open} of {spoke} strangers still hold a connection (the budget is {MAX_PENDING})"
    );
    assert_eq!(c.nodes_up(), 1);
    c.still_serves();
}
