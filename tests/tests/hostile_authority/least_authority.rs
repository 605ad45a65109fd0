//! What a credential reaches: an application's session credential only its
//! own session's calls and data, a node's credential only that node's
//! part, a data connection nothing it may not know; and nothing once the
//! session ended.

use super::*;

/// An application with no token allocates, copies (same-node mapping and
/// TCP to another node) and frees.
#[test]
fn an_application_needs_no_cluster_token() {
    let c = Cluster::start(2, "32MiB");
    let ocm = Oncilla::connect_with(Options::without_token(c.socket(0))).unwrap();
    for spec in [
        AllocSpec::new(1 << 20, Kind::LocalHost),
        AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-1"]),
    ] {
        let a = ocm.alloc_with(&spec).unwrap();
        let data: Vec<u8> = (0..1 << 20).map(|i| (i % 241) as u8).collect();
        a.copy_in(0, &data).unwrap();
        let mut back = vec![0u8; 1 << 20];
        a.copy_out(0, &mut back).unwrap();
        assert!(back == data);
        a.free().unwrap();
    }
}

/// Before, every application held the cluster token, so it could list
/// every allocation's access key, free anything by id, register as a node
/// and reserve pool memory. A session credential reaches none of that.
#[test]
fn a_session_credential_reaches_only_its_own_session() {
    let c = Cluster::start(2, "32MiB");
    let victim = c.client(0);
    let theirs = victim
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    theirs.copy_in(0, b"victim's bytes").unwrap();
    let me = open_raw(&c);
    let h = c.handle();
    let node1 = c.node("node-1").unwrap();
    let agent1 = node1["agent_addr"].as_str().unwrap().to_string();

    me.rt.block_on(async {
        // The master: no member, no call.
        let mut m = client::master(client::lazy_as(&h.master_addr, &me.credential, None).unwrap());
        let (code, msg) = refused(
            m.list_allocations(pb::ListAllocationsRequest { after: 0 })
                .await,
        );
        assert_eq!(code, tonic::Code::Unauthenticated, "{msg}");
        let (code, msg) = refused(
            m.get_allocation(pb::GetAllocationRequest {
                alloc: Some(pb::AllocRef {
                    id: theirs.id(),
                    name: String::new(),
                }),
            })
            .await,
        );
        assert_eq!(code, tonic::Code::Unauthenticated, "{msg}");
        let (code, msg) = refused(
            m.free(pb::FreeRequest {
                alloc: Some(pb::AllocRef {
                    id: theirs.id(),
                    name: String::new(),
                }),
                ..Default::default()
            })
            .await,
        );
        assert_eq!(code, tonic::Code::Unauthenticated, "{msg}");
        let (code, msg) = refused(
            m.register(pb::RegisterRequest {
                node: Some(pb::NodeInfo {
                    name: "rogue".into(),
                    agent_addr: "127.0.0.1:9".into(),
                    data_addr: "127.0.0.1:9".into(),
                    capacity: 1 << 40,
                    ..Default::default()
                }),
                incarnation: 1,
                ..Default::default()
            })
            .await,
        );
        assert_eq!(code, tonic::Code::Unauthenticated, "{msg}");

        // An agent: queue pairs only (ConnectVerbs), never its pool.
        let mut a = client::agent(client::lazy_as(&agent1, &me.credential, None).unwrap());
        let (code, msg) = refused(
            a.release(pb::ReleaseRequest {
                alloc_id: theirs.id(),
                ranges: Vec::new(),
            })
            .await,
        );
        assert_eq!(code, tonic::Code::PermissionDenied, "{msg}");
        assert!(msg.contains("cluster token"), "{msg}");
        let (code, msg) = refused(a.status(pb::StatusRequest {}).await);
        assert_eq!(code, tonic::Code::PermissionDenied, "{msg}");

        // Its own agent: its own session only.
        let channel = client::unix(&c.socket(0)).await.unwrap();
        let mut s = client::session(InterceptedService::new(
            channel.clone(),
            AttachCredential::new(&me.credential),
        ));
        let (code, msg) = refused(
            s.free(pb::FreeRequest {
                alloc: Some(pb::AllocRef {
                    id: theirs.id(),
                    name: String::new(),
                }),
                session_id: victim.session_id().to_string(),
                force: true,
                requester: None,
            })
            .await,
        );
        assert_eq!(code, tonic::Code::PermissionDenied, "{msg}");
        // Looking another session's allocation up (its access key and
        // where its bytes are): neither as that session nor as itself.
        for session_id in [victim.session_id(), me.id.as_str()] {
            let (code, msg) = refused(
                s.lookup(pb::LookupRequest {
                    session_id: session_id.to_string(),
                    id: theirs.id(),
                })
                .await,
            );
            assert_eq!(code, tonic::Code::PermissionDenied, "{msg}");
        }
        // Without its credential a caller of the socket acts for nobody.
        let mut bare = client::session(InterceptedService::new(channel, AttachCredential::none()));
        let (code, msg) = refused(
            bare.alloc(pb::AllocRequest {
                session_id: me.id.clone(),
                spec: None,
            })
            .await,
        );
        assert_eq!(code, tonic::Code::PermissionDenied, "{msg}");
    });

    // A credential for another session id, or made up, opens no data port.
    let forged = me.credential.as_str().replace(&me.id, victim.session_id());
    let data1 = node1["data_addr"].as_str().unwrap();
    for secret in [forged.as_str(), "session:x:00"] {
        let mut conn = TcpStream::connect(data1).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        wire::write_hello(&mut conn, secret.as_bytes()).unwrap();
        conn.flush().unwrap();
        let (welcome, msg) = wire::read_welcome(&mut conn).unwrap();
        assert_eq!(welcome, wire::Welcome::Denied, "{msg}");
    }

    let mut back = [0u8; 14];
    theirs.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"victim's bytes");
    theirs.free().unwrap();
    c.still_serves();
}

/// Before, every agent held the cluster token: one compromised node could
/// register as any other, list every allocation's access key, free
/// anything and reserve any agent's memory. Now agents hold only their
/// node's keys (the launcher starts them with `--node-keys-file`, no
/// token): node-1's credential acts only as node-1, for node-1's sessions,
/// reaches no allocation list, no data port and no other agent.
#[test]
fn a_node_credential_acts_only_as_its_node() {
    let c = Cluster::start(2, "32MiB");
    let victim = c.client(0);
    let theirs = victim
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-0"]))
        .unwrap();
    theirs.copy_in(0, b"victim's bytes").unwrap();
    let h = c.handle();
    let path = h.node_keys_file(1);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains(h.token.as_str()),
        "an agent's key file holds no token"
    );
    let keys = NodeKeys::load(&path).unwrap();
    let cred = keys.credential().clone();
    let node0 = c.node("node-0").unwrap();
    let agent0 = node0["agent_addr"].as_str().unwrap().to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let target = || {
        Some(pb::AllocRef {
            id: theirs.id(),
            name: String::new(),
        })
    };
    let denied = |(code, msg): (tonic::Code, String), what: &str| {
        assert_eq!(code, tonic::Code::PermissionDenied, "{what}: {msg}");
        assert!(msg.contains("node-1"), "{what}: {msg}");
    };
    rt.block_on(async {
        let mut m = client::master(client::lazy_as(&h.master_addr, &cred, None).unwrap());
        denied(
            refused(
                m.list_allocations(pb::ListAllocationsRequest { after: 0 })
                    .await,
            ),
            "list",
        );
        denied(
            refused(
                m.get_allocation(pb::GetAllocationRequest { alloc: target() })
                    .await,
            ),
            "get",
        );
        denied(
            refused(
                m.free(pb::FreeRequest {
                    alloc: target(),
                    force: true,
                    ..Default::default()
                })
                .await,
            ),
            "free by id",
        );
        denied(
            refused(
                m.free(pb::FreeRequest {
                    alloc: target(),
                    session_id: victim.session_id().to_string(),
                    force: true,
                    requester: None,
                })
                .await,
            ),
            "free for node-0's session",
        );
        // One of its own sessions as the requester and no session id,
        // which the master took for an operator's free of any id.
        let own = || {
            Some(pb::Owner {
                session_id: oncilla_model::alloc::session_id("node-1", Some(0), 1),
                node: "node-1".into(),
                ..Default::default()
            })
        };
        denied(
            refused(
                m.free(pb::FreeRequest {
                    alloc: target(),
                    session_id: String::new(),
                    force: true,
                    requester: own(),
                })
                .await,
            ),
            "free as its own session with no session id",
        );
        denied(
            refused(
                m.free_many(pb::FreeManyRequest {
                    session_id: String::new(),
                    ids: vec![theirs.id()],
                    requester: own(),
                })
                .await,
            ),
            "free_many as its own session with no session id",
        );
        denied(
            refused(
                m.lookup(pb::MasterLookupRequest {
                    id: theirs.id(),
                    requester: Some(pb::Owner {
                        session_id: victim.session_id().to_string(),
                        node: "node-0".into(),
                        ..Default::default()
                    }),
                })
                .await,
            ),
            "look up for node-0's session",
        );
        denied(
            refused(
                m.register(pb::RegisterRequest {
                    node: Some(pb::NodeInfo {
                        name: "node-0".into(),
                        agent_addr: "127.0.0.1:9".into(),
                        data_addr: "127.0.0.1:9".into(),
                        capacity: 1 << 40,
                        ..Default::default()
                    }),
                    incarnation: 7,
                    ..Default::default()
                })
                .await,
            ),
            "register as node-0",
        );
        denied(
            refused(
                m.heartbeat(pb::HeartbeatRequest {
                    name: "node-0".into(),
                    ended_sessions: vec![victim.session_id().to_string()],
                    ..Default::default()
                })
                .await,
            ),
            "heartbeat as node-0",
        );
        denied(
            refused(
                m.allocate(pb::AllocateRequest {
                    spec: Some(pb::AllocSpec {
                        size: 4096,
                        kind: pb::MemKind::RemoteHost as i32,
                        ..Default::default()
                    }),
                    origin_node: "node-1".into(),
                    requester: None,
                })
                .await,
            ),
            "allocate as an operator",
        );
        // Nor drain a node (its own or another): an operator's call.
        for node in ["node-0", "node-1"] {
            denied(
                refused(
                    m.drain(pb::DrainRequest {
                        name: node.into(),
                        drain: true,
                    })
                    .await,
                ),
                "drain a node",
            );
        }
        // Another agent: the node credential is not the token.
        let mut a = client::agent(client::lazy_as(&agent0, &cred, None).unwrap());
        let (code, msg) = refused(
            a.release(pb::ReleaseRequest {
                alloc_id: theirs.id(),
                ranges: Vec::new(),
            })
            .await,
        );
        assert_eq!(code, tonic::Code::Unauthenticated, "{msg}");
    });
    // Nor a data port.
    let data0 = node0["data_addr"].as_str().unwrap();
    let mut conn = TcpStream::connect(data0).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    wire::write_hello(&mut conn, cred.as_bytes()).unwrap();
    conn.flush().unwrap();
    let (welcome, msg) = wire::read_welcome(&mut conn).unwrap();
    assert_eq!(welcome, wire::Welcome::Denied, "{msg}");

    // Still up: a beat missed while a loaded (emulated) machine was busy
    // may show it down for a moment, a crash for good.
    assert!(
        Cluster::eventually(Cluster::EVENT, || c.node("node-0").unwrap()["state"]
            == "up"),
        "node-0 after the attempts: {:?}",
        c.node("node-0")
    );
    let mut back = [0u8; 14];
    theirs.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"victim's bytes");
    theirs.free().unwrap();
    c.still_serves();
}

/// One request on a data connection opened with `secret`: the reply's
/// status and message.
fn ask(addr: &str, secret: &[u8], req: &wire::Request) -> (wire::Status, String) {
    use std::io::Read as _;
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    wire::write_hello(&mut conn, secret).unwrap();
    let (welcome, msg) = wire::read_welcome(&mut conn).unwrap();
    assert_eq!(welcome, wire::Welcome::Ok, "{msg}");
    conn.write_all(&req.encode()).unwrap();
    let mut head = [0u8; wire::REPLY_LEN];
    conn.read_exact(&mut head).unwrap();
    let reply = wire::Reply::decode(&head).unwrap();
    let mut body = vec![0u8; usize::try_from(reply.len).unwrap()];
    conn.read_exact(&mut body).unwrap();
    (reply.status, String::from_utf8_lossy(&body).into_owned())
}

/// Before, a wrong key for a held allocation answered "bad key" and an
/// unknown id "no such allocation", so anyone with a data connection could
/// find which ids a node holds. Both now get the same answer.
#[test]
fn ids_cannot_be_probed_through_the_data_port() {
    let c = Cluster::start(2, "32MiB");
    let ocm = c.client(0);
    let a = ocm
        .alloc_with(&AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-1"]))
        .unwrap();
    let me = open_raw(&c);
    let node1 = c.node("node-1").unwrap();
    let data1 = node1["data_addr"].as_str().unwrap();
    let probe = |alloc_id| wire::Request {
        op: wire::Op::Read,
        alloc_id,
        key: [0x5a; 16],
        offset: 0,
        len: 16,
    };
    let held = ask(data1, me.credential.as_bytes(), &probe(a.id()));
    let absent = ask(data1, me.credential.as_bytes(), &probe(a.id() + 1000));
    assert_eq!(held.0, wire::Status::NoSuchAllocation, "{}", held.1);
    // Alike but for the id and the agent's age in seconds (the probes may
    // fall either side of a second).
    let shape = |msg: &str| {
        let mut out = String::new();
        for ch in msg.chars() {
            if !ch.is_ascii_digit() {
                out.push(ch);
            } else if !out.ends_with('#') {
                out.push('#');
            }
        }
        out
    };
    assert_eq!(
        shape(&held.1),
        shape(&absent.1),
        "a wrong key and an unknown id answer alike"
    );
    let mut back = [0u8; 4];
    a.copy_out(0, &mut back).unwrap();
    a.free().unwrap();
    c.still_serves();
}

/// Before, a session's credential kept opening data connections and map
/// leases after its session ended, and a captured hello could be replayed
/// for ever. Now a credential names its expiry and the agent gives its
/// session a fresh one every third of its lifetime (`--credential-lifetime`,
/// 3 s here): an application keeps working across several lifetimes, a
/// credential past its expiry is refused on every node, and the session's
/// own agent refuses it the moment the session ends and shuts the data
/// connections it opened there.
#[test]
fn a_credential_stops_working_when_its_session_ends() {
    use oncilla_net::credential::{unix_now, CLOCK_SKEW};
    use std::io::Read as _;
    let c = Cluster::start_env(2, "32MiB", &[("ONCILLA_CREDENTIAL_LIFETIME", "3")]);
    // Renewed: calls and copies go on past three lifetimes.
    let ocm = c.client(0);
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let mut rounds = 0;
    while std::time::Instant::now() < until {
        let a = ocm
            .alloc_with(&AllocSpec::new(4096, Kind::RemoteHost).on_nodes(["node-1"]))
            .unwrap_or_else(|e| panic!("round {rounds}: {e}"));
        a.copy_in(0, b"renewed").unwrap();
        a.free().unwrap();
        rounds += 1;
    }
    assert!(rounds > 0);

    let data = |node: &str| {
        c.node(node).unwrap()["data_addr"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let hello = |addr: &str, secret: &[u8]| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        wire::write_hello(&mut s, secret).unwrap();
        let (welcome, msg) = wire::read_welcome(&mut s).unwrap();
        (s, welcome, msg)
    };
    // Past its expiry (and the clock skew): refused on every node.
    let me = open_raw(&c);
    // What the agent gave is good for the lifetime it was told.
    let text = me.credential.as_str();
    let expires: u64 = text.rsplit(':').nth(1).unwrap().parse().unwrap();
    assert!(
        expires <= unix_now() + 4,
        "a credential good until {expires}, now {}",
        unix_now()
    );
    let expired = Credential::session(&c.token, &me.id, unix_now() - CLOCK_SKEW.as_secs() - 1);
    for node in ["node-0", "node-1"] {
        let (_, welcome, msg) = hello(&data(node), expired.as_bytes());
        assert_eq!(welcome, wire::Welcome::Denied, "{node}: {msg}");
    }
    // Live: its connection on its own node is open, until the session ends.
    let credential = me.credential.clone();
    let (mut open, welcome, msg) = hello(&data("node-0"), credential.as_bytes());
    assert_eq!(welcome, wire::Welcome::Ok, "{msg}");
    drop(me);
    let mut byte = [0u8; 1];
    assert_eq!(
        open.read(&mut byte).unwrap(),
        0,
        "the ended session's connection was not shut"
    );
    // Refused at once on its own node, data port and map socket alike.
    let refused = Cluster::eventually(Duration::from_secs(10), || {
        hello(&data("node-0"), credential.as_bytes()).1 == wire::Welcome::Denied
    });
    assert!(
        refused,
        "the ended session's credential still opens a data connection"
    );
    let (_, _, msg) = hello(&data("node-0"), credential.as_bytes());
    assert!(
        msg.contains("session of this credential has ended"),
        "{msg}"
    );
    let mut map =
        std::os::unix::net::UnixStream::connect(format!("{}.map", c.socket(0).display())).unwrap();
    map.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    wire::write_hello(&mut map, credential.as_bytes()).unwrap();
    let (welcome, msg) = wire::read_welcome(&mut map).unwrap();
    assert_eq!(welcome, wire::Welcome::Denied, "{msg}");
    c.still_serves();
}
