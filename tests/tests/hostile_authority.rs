//! Least authority, on a real loopback cluster: an application holds no
//! cluster token, only the credential its agent gave its session, and that
//! credential reaches its own session's calls and data connections and
//! nothing else. Each test performs the attack with raw gRPC or a raw data
//! connection, checks the refusal, then that the cluster still serves.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write as _;
use std::net::TcpStream;
use std::time::Duration;

use liboncilla::{AllocSpec, Fabric, Kind, Oncilla, Options};
use oncilla_net::credential::{AttachCredential, Credential, NodeKeys};
use oncilla_net::wire;
use oncilla_proto::{client, pb};
use support::Cluster;
use tokio_stream::StreamExt;
use tonic::service::interceptor::InterceptedService;

/// A raw session on agent 0's Unix socket opened without any token, as an
/// application would: (session id, the credential the agent gave it).
struct RawSession {
    rt: tokio::runtime::Runtime,
    id: String,
    credential: Credential,
    // The open stream: the session lives as long as it does.
    _stream: tonic::Streaming<pb::SessionEvent>,
}

fn open_raw(c: &Cluster) -> RawSession {
    open_raw_on(c, 0)
}

/// A raw session through agent `i`.
fn open_raw_on(c: &Cluster, i: usize) -> RawSession {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let socket = c.socket(i);
    let (id, credential, stream) = rt.block_on(async {
        let channel = client::unix(&socket).await.unwrap();
        let mut s = client::session(InterceptedService::new(channel, AttachCredential::none()));
        let mut stream = s
            .open(pb::OpenRequest {
                pid: std::process::id(),
                program: "attacker".into(),
            })
            .await
            .unwrap()
            .into_inner();
        let first = stream.next().await.unwrap().unwrap();
        let cred = Credential::parse_session(&first.credential).unwrap();
        (first.session_id, cred, stream)
    });
    RawSession {
        rt,
        id,
        credential,
        _stream: stream,
    }
}

/// The code and message of a refused call.
fn refused<T>(r: Result<tonic::Response<T>, tonic::Status>) -> (tonic::Code, String) {
    match r {
        Ok(_) => panic!("the call was accepted"),
        Err(s) => (s.code(), s.message().to_string()),
    }
}

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
        // Another agent: the node credential is not the token.
        let mut a = client::agent(client::lazy_as(&agent0, &cred, None).unwrap());
        let (code, msg) = refused(
            a.release(pb::ReleaseRequest {
                alloc_id: theirs.id(),
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

    assert_eq!(c.node("node-0").unwrap()["state"], "up");
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

const ROLE_ENV: &str = "ONCILLA_AUTHORITY_ROLE";
/// The user the other process runs as (`nobody` on Debian).
const OTHER_UID: u32 = 65534;

/// The other user's process: attaches `private` (refused) and `open`
/// (allowed, and reads what the owner wrote), tries to free `open`
/// (refused), and allocates and frees its own.
#[test]
fn role() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return; // only meaningful as a child of the test below
    };
    let socket = std::env::var("ONCILLA_SOCKET").unwrap();
    let ocm = Oncilla::connect_with(Options::without_token(socket)).unwrap();
    if role == "fair-share" {
        // Another user beside a greedy one: served in full.
        let a = ocm.alloc(16 << 20, Kind::RemoteHost).unwrap();
        a.copy_in(0, b"mine").unwrap();
        let mut back = [0u8; 4];
        a.copy_out(0, &mut back).unwrap();
        assert_eq!(&back, b"mine");
        a.free().unwrap();
        println!("fair-share ok");
        return;
    }
    if role == "map" {
        // Maps a same-node allocation beside a user who filled its share
        // of files in flight.
        let mut a = ocm.alloc(1 << 20, Kind::LocalHost).unwrap();
        a.localbuf().unwrap()[..4].copy_from_slice(b"mine");
        let mut back = [0u8; 4];
        a.copy_out(0, &mut back).unwrap();
        assert_eq!(&back, b"mine");
        a.free().unwrap();
        println!("map ok");
        return;
    }
    if role == "pull" {
        // A third-party copy (node-1 to node-2's agent pulling) beside a
        // user whose pulls are at their pace.
        let src = ocm
            .alloc_with(&AllocSpec::new(4 << 20, Kind::RemoteHost).on_nodes(["node-1"]))
            .unwrap();
        let dst = ocm
            .alloc_with(&AllocSpec::new(4 << 20, Kind::RemoteHost).on_nodes(["node-2"]))
            .unwrap();
        src.copy_in(0, &[9u8; 4 << 20]).unwrap();
        let started = std::time::Instant::now();
        ocm.copy(&dst, 0, &src, 0, 4 << 20).unwrap();
        println!("other user's 4 MiB pull took {:?}", started.elapsed());
        let mut back = vec![0u8; 4 << 20];
        dst.copy_out(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 9));
        src.free().unwrap();
        dst.free().unwrap();
        println!("pull ok");
        return;
    }
    if role == "small-files" {
        // Small allocations on node-1 (each holds a memory file there),
        // beside a user who took its share of them.
        for i in 0..8u8 {
            let spec = AllocSpec::new(4096, Kind::RemoteHost)
                .on_nodes(["node-1"])
                .persistent();
            let a = ocm.alloc_with(&spec).unwrap();
            a.copy_in(0, &[i; 64]).unwrap();
            let mut back = [0u8; 64];
            a.copy_out(0, &mut back).unwrap();
            assert_eq!(back, [i; 64]);
            a.free().unwrap();
        }
        println!("small-files ok");
        return;
    }
    assert_eq!(role, "other-user");
    let err = ocm.attach("private").unwrap_err();
    assert!(
        matches!(&err, liboncilla::Error::PermissionDenied(m) if m.contains("private to the user")),
        "{err}"
    );
    let open = ocm.attach("open").unwrap();
    let mut back = [0u8; 6];
    open.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"shared");
    let err = open.free().unwrap_err();
    assert!(
        matches!(&err, liboncilla::Error::PermissionDenied(m) if m.contains("another user")),
        "{err}"
    );
    let mine = ocm.alloc(1 << 20, Kind::RemoteHost).unwrap();
    mine.copy_in(0, b"mine").unwrap();
    mine.free().unwrap();
    println!("other-user ok");
}

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

/// Lets user [`OTHER_UID`] reach agent `i`'s sockets (the operator's
/// choice of who may use a node; the test's cluster is private to root).
fn open_sockets_to_others(c: &Cluster, i: usize) {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = c.socket(i).parent().unwrap().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    for path in [
        c.socket(i),
        std::path::PathBuf::from(format!("{}.map", c.socket(i).display())),
    ] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
}

/// Runs this test binary's [`role`] as user [`OTHER_UID`] on agent 0;
/// asserts it printed "ROLE ok".
fn run_role_as_other_user(c: &Cluster, role: &str) {
    use std::os::unix::process::CommandExt as _;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "role", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .env("ONCILLA_SOCKET", c.socket(0))
        .env_remove("ONCILLA_TOKEN")
        .env_remove("ONCILLA_TOKEN_FILE")
        .uid(OTHER_UID)
        .gid(OTHER_UID)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("{role} ok")),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Another user's application on agent 0 allocates, copies and frees
/// (as [`OTHER_UID`]; one line and nothing else where this is not root).
fn another_user_is_served(c: &Cluster) {
    if nix::unistd::geteuid().is_root() {
        open_sockets_to_others(c, 0);
        run_role_as_other_user(c, "fair-share");
    } else {
        println!("skipped the other user's part: needs root to run a process as another user");
    }
}

/// The operator allocates `size` on `node` with `ocmctl`, writes, reads
/// back and frees it.
fn operator_is_served(c: &Cluster, node: &str, size: &str) {
    let id = c.ocmctl_ok(&["alloc", size, "--node", node]);
    let file = c.dir.join("payload");
    std::fs::write(&file, b"operator").unwrap();
    c.ocmctl_ok(&["put", &id, file.to_str().unwrap()]);
    let get = c.ocmctl(&["get", &id, "--len", "8"]);
    assert_eq!(
        get.stdout,
        b"operator",
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert!(c.ocmctl(&["free", &id]).status.success());
}

/// Lowers agent `i`'s open-file limit to `n` (soft and hard) with
/// `prlimit`, as an operator may on a running agent.
fn lower_agent_nofile(c: &Cluster, i: usize, n: u64) {
    let set = std::process::Command::new("prlimit")
        .args(["--pid", &c.agent_pid(i).unwrap().to_string()])
        .arg(format!("--nofile={n}:{n}"))
        .output()
        .unwrap();
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
}

/// `ocmctl quota show --json` of the cluster.
fn quotas(c: &Cluster) -> serde_json::Value {
    c.ocmctl_json(&["quota", "show", "--json"])
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

/// Before, one session made about 20,000 allocations of 4 KiB, each
/// holding a memory file (a descriptor) on its node, until the agent hit
/// EMFILE: new applications then failed `ocm_init` and new data
/// connections were closed at once, for as long as the allocations lived.
/// Now only memory a process may map holds a file (persistent allocations,
/// and a session's on its own node: see the next test), the node's memory
/// files stay under a budget (its open-file limit less a quarter kept for
/// connections, checked as the limit is now) and one user's small
/// allocations may hold half of it: the greedy user's persistent ones are
/// refused with a message naming its share, and a new application,
/// another user's small allocations and the operator are all served on
/// that node.
#[test]
fn small_allocations_cannot_use_up_a_nodes_descriptors() {
    let c = Cluster::start(2, "64MiB");
    // The systemd unit's limit is 65,536; a low one makes the attack quick
    // (1,024: 768 for memory files, a user's share 384).
    lower_agent_nofile(&c, 1, 1024);
    let greedy = c.client(0);
    let mut held = Vec::new();
    let mut refusal = None;
    for _ in 0..1024 {
        let spec = AllocSpec::new(4096, Kind::RemoteHost)
            .on_nodes(["node-1"])
            .persistent();
        match greedy.alloc_with(&spec) {
            Ok(a) => held.push(a),
            Err(e) => {
                refusal = Some(e.to_string());
                break;
            }
        }
    }
    let msg = refusal.expect("the greedy user was never refused");
    assert!(msg.contains("its share (384"), "{msg}");
    assert_eq!(
        held.len(),
        384,
        "small allocations one user holds on node-1"
    );

    // A new application starts and copies on that node.
    let fresh = c.client(0);
    let spec = AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-1"]);
    let a = fresh.alloc_with(&spec).unwrap();
    a.copy_in(0, b"fresh").unwrap();
    let mut back = [0u8; 5];
    a.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"fresh");
    a.free().unwrap();
    // The operator's small allocation on it.
    operator_is_served(&c, "node-1", "4KiB");
    // Another user's small allocations there.
    if nix::unistd::geteuid().is_root() {
        open_sockets_to_others(&c, 0);
        run_role_as_other_user(&c, "small-files");
    } else {
        println!("skipped the other user's part: needs root to run a process as another user");
    }
    // The greedy user's files come back when it lets go.
    for a in held {
        a.free().unwrap();
    }
    greedy
        .alloc_with(
            &AllocSpec::new(4096, Kind::RemoteHost)
                .on_nodes(["node-1"])
                .persistent(),
        )
        .unwrap()
        .free()
        .unwrap();
    c.still_serves();
}

/// Asks agent `i`'s map server, as a raw session of that node, for the
/// first extent of `a`; the reply's status and message (empty on a grant).
fn raw_map(c: &Cluster, i: usize, a: &oncilla_model::alloc::Allocation) -> (wire::Status, String) {
    let (_, status, msg) = map_request(c, i, &open_raw_on(c, i), a);
    (status, msg)
}

/// A map connection to agent `i` with `me`'s credential that asked for the
/// first extent of `a`: the connection (a grant's files and the grant
/// itself are left unread in it), the reply's status, and its message
/// (empty on a grant).
fn map_request(
    c: &Cluster,
    i: usize,
    me: &RawSession,
    a: &oncilla_model::alloc::Allocation,
) -> (std::os::unix::net::UnixStream, wire::Status, String) {
    use std::io::Read as _;
    let mut s =
        std::os::unix::net::UnixStream::connect(format!("{}.map", c.socket(i).display())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    wire::write_hello(&mut s, me.credential.as_bytes()).unwrap();
    let (welcome, msg) = wire::read_welcome(&mut s).unwrap();
    assert_eq!(welcome, wire::Welcome::Ok, "{msg}");
    let extent = &a.extents[0];
    let req = wire::Request {
        op: wire::Op::Read,
        alloc_id: a.id,
        key: a.access_key.as_slice().try_into().unwrap(),
        offset: extent.alloc_offset,
        len: extent.len,
    };
    s.write_all(&req.encode()).unwrap();
    let mut head = [0u8; wire::REPLY_LEN];
    s.read_exact(&mut head).unwrap();
    let reply = wire::Reply::decode(&head).unwrap();
    if reply.status == wire::Status::Ok {
        return (s, reply.status, String::new());
    }
    let mut msg = vec![0u8; usize::try_from(reply.len).unwrap()];
    s.read_exact(&mut msg).unwrap();
    (s, reply.status, String::from_utf8(msg).unwrap())
}

/// Memory nobody may map (a session's on another node than the session's)
/// holds no memory file: one application's thousand small allocations on
/// another node, more than that node's whole budget of files, are all
/// served and cost it no descriptor, their bytes are where they were put,
/// and that node's own applications still map theirs.
#[test]
fn small_allocations_nobody_maps_hold_no_descriptor() {
    let c = Cluster::start(2, "64MiB");
    // 768 memory files at most on node-1, 384 for one user.
    lower_agent_nofile(&c, 1, 1024);
    let pid = c.agent_pid(1).unwrap();
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let before = fds();
    let app = c.client(0);
    let spec = AllocSpec::new(4096, Kind::RemoteHost)
        .on_nodes(["node-1"])
        .fabric(Fabric::Tcp);
    let held: Vec<_> = (0..1000)
        .map(|i| {
            app.alloc_with(&spec)
                .unwrap_or_else(|e| panic!("allocation {i} refused: {e}"))
        })
        .collect();
    let after = fds();
    println!("node-1 descriptors: {before} before 1,000 small allocations, {after} after");
    assert!(
        after < before + 64,
        "1,000 small allocations nobody maps took {} descriptors on node-1",
        after - before
    );
    for (i, a) in held.iter().enumerate().step_by(97) {
        a.copy_in(0, &[i as u8; 4096]).unwrap();
    }
    for (i, a) in held.iter().enumerate().step_by(97) {
        let mut back = [0u8; 4096];
        a.copy_out(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == i as u8), "allocation {i}'s bytes");
    }
    // Asked anyway, node-1's map server refuses to hand out their memory
    // (its files back other memory too).
    let record = c
        .master()
        .unwrap()
        .allocation(&oncilla_model::alloc::AllocRef::Id(held[0].id()))
        .unwrap();
    let (status, msg) = raw_map(&c, 1, &record);
    assert_eq!(status, wire::Status::OutOfBounds, "{msg}");
    assert!(
        msg.contains("belongs to a session of another node"),
        "{msg}"
    );
    // A persistent allocation's memory there is handed out.
    let kept = c.persistent_on(4096, "node-1");
    let (status, msg) = raw_map(&c, 1, &kept);
    assert_eq!(status, wire::Status::Ok, "{msg}");
    c.ocmctl_ok(&["free", &kept.id.to_string()]);
    // An application on node-1 maps its own memory there, beside them.
    let local = c.client(1);
    let mine = local.alloc(4096, Kind::LocalHost).unwrap();
    assert_eq!(mine.fabrics(), [Fabric::Shm]);
    mine.copy_in(0, b"mapped").unwrap();
    let mut back = [0u8; 6];
    mine.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"mapped");
    mine.free().unwrap();
    for a in held {
        a.free().unwrap();
    }
    c.still_serves();
}

/// Before, 150 map connections each asking for grants of a 64 MiB
/// allocation and reading nothing left every descriptor the agent could
/// have in flight (the kernel bounds them per sending user, by the
/// agent's open-file limit) in sockets nobody read: other applications
/// got "agent closed the map socket" until the attacker closed. Now each
/// grant's files are charged to the user they go to (an eighth of the
/// limit each, half of it in all), and a connection reads no further
/// request until its process took them: the attacker is refused with a
/// message naming its share, another user maps, the operator copies, and
/// once the attacker closes its connections its share is back.
#[test]
fn one_user_cannot_fill_the_descriptors_in_flight() {
    use std::io::Read as _;
    let c = Cluster::start(2, "96MiB");
    // The unit's limit is 65,536; 1,024 makes the attack short (a user's
    // share 128 files in flight).
    lower_agent_nofile(&c, 0, 1024);
    let bait = c.persistent_on(32 << 20, "node-0");
    let me = open_raw(&c);
    let mut held = Vec::new();
    let mut files = 0;
    let mut refusal = None;
    for _ in 0..64 {
        // The reply and grant only: the files ride on later bytes, left
        // unread in the socket.
        let (mut s, status, msg) = map_request(&c, 0, &me, &bait);
        if status != wire::Status::Ok {
            assert_eq!(status, wire::Status::Busy);
            refusal = Some(msg);
            break;
        }
        let mut grant = [0u8; wire::GRANT_LEN];
        s.read_exact(&mut grant).unwrap();
        files = wire::MapGrant::decode(&grant).files;
        held.push(s);
    }
    let msg = refusal.expect("the attacker was never refused");
    assert!(files > 1, "a grant of {files} files");
    let share = 128;
    assert_eq!(held.len() as u64, share / files, "grants left unread");
    assert!(
        msg.contains(&format!(
            "uid 0 has {} memory files in flight",
            held.len() as u64 * files
        )) && msg.contains("share (128)"),
        "{msg}"
    );

    // Another user maps; the operator copies.
    if nix::unistd::geteuid().is_root() {
        open_sockets_to_others(&c, 0);
        run_role_as_other_user(&c, "map");
    } else {
        println!("skipped the other user's part: needs root to run a process as another user");
    }
    operator_is_served(&c, "node-0", "1MiB");

    // Closing the connections drops the unread files: the share is back.
    drop(held);
    let ocm = c.client(0);
    let mut last = String::new();
    let mapped = Cluster::eventually(Duration::from_secs(10), || {
        match ocm.alloc(1 << 20, Kind::LocalHost) {
            Ok(mut a) => {
                a.localbuf().unwrap()[..2].copy_from_slice(b"ok");
                a.free().unwrap();
                true
            }
            Err(e) => {
                last = e.to_string();
                false
            }
        }
    });
    assert!(mapped, "the attacker's share never came back: {last}");
    let out = c.ocmctl(&["free", &bait.id.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
