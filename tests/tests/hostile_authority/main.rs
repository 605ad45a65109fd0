//! Least authority, on a real loopback cluster: an application holds no
//! cluster token, only the credential its agent gave its session, and that
//! credential reaches its own session's calls and data connections and
//! nothing else (`least_authority`); one user cannot take what others need
//! (`users`, `descriptors`). Each test performs the attack with raw gRPC, a
//! raw data connection or another user's process, checks the refusal,
//! then that the cluster still serves. This file holds what the attacks
//! share: raw sessions, and the other user's process ([`role`]).

#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod batches;
mod descriptors;
mod least_authority;
mod users;

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
