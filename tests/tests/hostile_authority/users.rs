//! One user against the others: what another user's process may reach,
//! and the bounds that keep one greedy user from starving the rest
//! (quotas, session-socket connections and sessions, data and map
//! connections, pulls).

use super::*;

/// Before, any process could attach any named allocation and free any
/// persistent one. Now an allocation belongs to the user whose process
/// made it (the agent asks the kernel: SO_PEERCRED); another user may
/// attach it only when it was made shared, and never free it.
#[test]
fn another_users_process_reaches_only_shared_allocations() {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: needs root to run a process as another user");
        return;
    }
    let c = Cluster::start(2, "32MiB");
    let ocm = c.client(0);
    let private = ocm
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).named("private"))
        .unwrap();
    private.copy_in(0, b"secret").unwrap();
    let open = ocm
        .alloc_with(
            &AllocSpec::new(1 << 20, Kind::RemoteHost)
                .named("open")
                .shared(),
        )
        .unwrap();
    open.copy_in(0, b"shared").unwrap();
    open_sockets_to_others(&c, 0);
    run_role_as_other_user(&c, "other-user");
    let mut back = [0u8; 6];
    private.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"secret");
    private.free().unwrap();
    open.free().unwrap();
    c.still_serves();
}

/// One application allocated all of the cluster as persistent allocations
/// and exited: everyone, the operator included, got "not enough capacity"
/// until an operator freed them. Now the operator sets a default quota
/// (kept in the master's quota file); the greedy user (this process's,
/// root: only the cluster token is exempt) is refused past it with a
/// message naming the limit, its persistent allocations count against it
/// after its process is gone and after a master restart, and another
/// user's application and the operator still allocate, copy and free.
#[test]
fn a_greedy_user_is_held_to_its_quota_and_others_are_served() {
    let mut c = Cluster::start(2, "64MiB");
    let set = c.ocmctl(&[
        "quota",
        "set",
        "--default",
        "--bytes",
        "48MiB",
        "--persistent",
        "3",
    ]);
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let me = nix::unistd::getuid().as_raw();
    {
        let greedy = c.client(0);
        let mut kept = Vec::new();
        let mut refusal = None;
        for i in 0..10 {
            let spec = AllocSpec::new(8 << 20, Kind::RemoteHost).named(format!("hoard{i}"));
            match greedy.alloc_with(&spec) {
                Ok(a) => kept.push(a),
                Err(e) => {
                    refusal = Some(e);
                    break;
                }
            }
        }
        assert_eq!(kept.len(), 3, "persistent allocations past the quota");
        let e = refusal.unwrap();
        assert!(
            matches!(&e, liboncilla::Error::QuotaExceeded(m)
                if m.contains("persistent allocations") && m.contains(&format!("uid {me}"))),
            "{e}"
        );
        // Bytes: 24 MiB persistent, 24 MiB more, then no more.
        let more = greedy.alloc(24 << 20, Kind::RemoteHost).unwrap();
        let e = greedy.alloc(4096, Kind::RemoteHost).unwrap_err();
        assert!(
            matches!(&e, liboncilla::Error::QuotaExceeded(m) if m.contains("bytes")),
            "{e}"
        );
        drop(more);
        for a in kept {
            // Persistent: they stay when this process lets go.
            a.detach().unwrap();
        }
    }
    let q = quotas(&c);
    let mine = |q: &serde_json::Value| {
        q["users"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["uid"] == me)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(mine(&q)["usage"]["persistent"], 3, "{q}");
    assert_eq!(mine(&q)["usage"]["bytes"], 24 << 20, "{q}");
    assert_eq!(q["default"]["bytes"], 48 << 20, "{q}");

    // The operator is not held to any quota.
    let out = c.ocmctl(&["alloc", "16MiB"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(c.ocmctl(&["free", &id]).status.success());
    another_user_is_served(&c);

    // A master restart keeps the quota (its file) and learns the usage
    // again from the agents.
    c.kill_master();
    c.start_master();
    c.wait_nodes_up(2);
    let q = quotas(&c);
    assert_eq!(q["default"]["persistent"], 3, "{q}");
    assert_eq!(mine(&q)["usage"]["persistent"], 3, "{q}");
    let e = c
        .client(0)
        .alloc_with(&AllocSpec::new(4096, Kind::RemoteHost).named("one-more"))
        .unwrap_err();
    assert!(matches!(e, liboncilla::Error::QuotaExceeded(_)), "{e}");

    // Freed by the operator, the room is the user's again.
    for i in 0..3 {
        let name = format!("hoard{i}");
        let out = c.ocmctl(&["free", &name]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(mine(&quotas(&c)).is_null(), "nothing held, nothing listed");
    c.still_serves();
}

/// Any application could fill its agent's session socket (4,096 idle
/// HTTP/2 connections: new applications then failed at init) and open
/// sessions without end (40,000 grew an agent by 500 MB). Now one user
/// holds at most an eighth of the socket's connections and 1,024 sessions
/// per agent, refused past them; another user's application is served
/// throughout, and the greedy user is served again once it lets go.
#[test]
fn one_user_cannot_take_the_session_socket_or_open_sessions_without_end() {
    const PER_USER: usize = 512;
    const SESSIONS: usize = 1024;
    let limit = support::raise_nofile(4096);
    if limit < 2048 {
        println!("skipped: {limit} descriptors; the attack holds {PER_USER} connections");
        return;
    }
    let c = Cluster::start(1, "32MiB");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let socket = c.socket(0);
    let open = |s: &mut client::SessionClient| {
        rt.block_on(s.open(pb::OpenRequest {
            pid: std::process::id(),
            program: "greedy".into(),
        }))
        .map(tonic::Response::into_inner)
    };
    // Connections, each with a session on it, until the agent refuses one.
    let mut conns = Vec::new();
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..PER_USER + 16 {
        let channel = match rt.block_on(client::unix(&socket)) {
            Ok(ch) => ch,
            Err(e) => {
                refused = Some(e.to_string());
                break;
            }
        };
        let mut s = client::session(InterceptedService::new(channel, AttachCredential::none()));
        match open(&mut s) {
            Ok(stream) => {
                held.push(stream);
                conns.push(s);
            }
            Err(e) => {
                refused = Some(e.to_string());
                break;
            }
        }
    }
    assert_eq!(conns.len(), PER_USER, "connections one user holds");
    assert!(refused.is_some());
    // More sessions on those connections, until the agent refuses one.
    let mut too_many = None;
    for i in 0..SESSIONS {
        let n = conns.len();
        match open(&mut conns[i % n]) {
            Ok(stream) => held.push(stream),
            Err(e) => {
                too_many = Some(e);
                break;
            }
        }
    }
    assert_eq!(held.len(), SESSIONS, "sessions one user holds");
    let e = too_many.expect("a session past the limit was opened");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("sessions open on this node"), "{e}");
    another_user_is_served(&c);
    // Let go (the runtime's end closes the connections): the greedy user
    // is served again, its places back as the agent sees them close.
    drop(held);
    drop(conns);
    drop(rt);
    assert!(
        Cluster::eventually(Duration::from_secs(30), || {
            liboncilla::Oncilla::connect_with(Options::new(c.socket(0), c.token.clone())).is_ok()
        }),
        "the user's places never came back"
    );
    c.still_serves();
}

/// One session held all 1,024 data connections of a node (reading a
/// little now and then, so none was ever idle): other sessions, operators'
/// hellos and `ocmctl put`/`get` got "too many data connections"; 1,024
/// map connections of one allocation left others "too many map
/// connections". Now one user (the user its session id names) holds at
/// most a quarter of each; another user's application and the operator
/// are served meanwhile.
#[test]
fn one_user_cannot_hold_every_data_or_map_connection() {
    const SHARE: usize = 256;
    let limit = support::raise_nofile(4096);
    if limit < 2048 {
        println!("skipped: {limit} descriptors; the attack holds {SHARE} connections of each kind");
        return;
    }
    let c = Cluster::start(2, "64MiB");
    let me = open_raw(&c);
    let data1 = c.node("node-1").unwrap()["data_addr"]
        .as_str()
        .unwrap()
        .to_string();
    let mut held = Vec::new();
    let mut refusal = None;
    for _ in 0..SHARE + 16 {
        let mut s = TcpStream::connect(&data1).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        wire::write_hello(&mut s, me.credential.as_bytes()).unwrap();
        match wire::read_welcome(&mut s).unwrap() {
            (wire::Welcome::Ok, _) => held.push(s),
            (_, msg) => {
                refusal = Some(msg);
                break;
            }
        }
    }
    assert_eq!(held.len(), SHARE, "data connections one user holds");
    let msg = refusal.unwrap();
    assert!(msg.contains("from this user"), "{msg}");

    // Map leases: every handle of a same-node allocation holds one.
    let ocm = c.client(0);
    let first = ocm
        .alloc_with(&AllocSpec::new(1 << 20, Kind::LocalHost).named("leased"))
        .unwrap();
    let mut handles = vec![first];
    let mut refusal = None;
    for _ in 0..SHARE + 16 {
        match ocm.attach("leased") {
            Ok(h) => handles.push(h),
            Err(e) => {
                refusal = Some(e.to_string());
                break;
            }
        }
    }
    assert_eq!(handles.len(), SHARE, "map connections one user holds");
    let msg = refusal.unwrap();
    assert!(
        msg.contains("too many map connections from this user"),
        "{msg}"
    );

    // The operator, and another user, are served meanwhile.
    operator_is_served(&c, "node-1", "1MiB");
    another_user_is_served(&c);
    drop(held);
    let mut handles = handles.into_iter();
    let owner = handles.next().unwrap();
    drop(handles);
    owner.free().unwrap();
    c.still_serves();
}

/// Before, PULL had no rate or volume limit: 9.7 kB of requests moved
/// 800 MiB between agents. Now the agent that pulls paces each user: at
/// most 8 pulls in flight, and `--pull-rate` bytes a second over time (a
/// second's worth at once); operators are not paced. The greedy user's
/// copy takes at least what its rate allows, its pulls past 8 are refused
/// with a message naming the bound, and another user's pull meanwhile is
/// served at once (its own pace).
#[test]
fn one_users_pulls_are_paced_and_bounded() {
    const MIB: u64 = 1 << 20;
    let mut c = Cluster::start(3, "64MiB");
    c.stop_agent(2);
    c.start_agent_with(2, &["--pull-rate", "4MiB"]);
    c.wait_nodes_up(3);
    let ocm = c.client(0);
    let on = |node: &str, size: u64| {
        ocm.alloc_with(&AllocSpec::new(size, Kind::RemoteHost).on_nodes([node]))
            .unwrap()
    };
    let src = on("node-1", 16 * MIB);
    let dst = on("node-2", 16 * MIB);
    let data: Vec<u8> = (0..16 * MIB).map(|i| (i % 251) as u8).collect();
    src.copy_in(0, &data).unwrap();

    // Paced: the last of four 4 MiB pulls starts once 12 MiB are paid
    // off at 4 MiB/s less a second's worth, so 2 s at least, however fast
    // the machine.
    let started = std::time::Instant::now();
    ocm.copy(&dst, 0, &src, 0, 16 * MIB).unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1950),
        "16 MiB pulled in {took:?}, faster than 4 MiB/s allows"
    );
    let mut back = vec![0u8; data.len()];
    dst.copy_out(0, &mut back).unwrap();
    assert!(back == data, "the paced copy came back different");

    // Bounded: twelve copies at once, each one pull; past 8 in flight (or
    // a turn too far away) they are refused.
    let results: Vec<_> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..12u64)
            .map(|i| {
                let (ocm, dst, src) = (&ocm, &dst, &src);
                s.spawn(move || ocm.copy(dst, i * MIB, src, i * MIB, MIB))
            })
            .collect();
        // The other user, while those wait their turn.
        if nix::unistd::geteuid().is_root() {
            open_sockets_to_others(&c, 0);
            run_role_as_other_user(&c, "pull");
        } else {
            println!("skipped the other user's part: needs root to run a process as another user");
        }
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let refused: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(ToString::to_string)
        .collect();
    assert!(refused.len() >= 2, "only {} of 12 refused", refused.len());
    for msg in &refused {
        assert!(
            msg.contains("pulls in flight on this node") || msg.contains("next pull may start"),
            "{msg}"
        );
    }
    // The operator is not paced.
    let out = c.ocmctl(&["alloc", "1MiB", "--node", "node-2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(c.ocmctl(&["free", &id]).status.success());
    src.free().unwrap();
    dst.free().unwrap();
    c.still_serves();
}
