//! Hostile input on a real loopback cluster: values a caller should never
//! send (oversized names and program names, loose and weak token files, a
//! socket path that is not a socket, planted output files; the C ABI's are
//! in `hostile_capi.rs`). Each test performs the attack, checks the specific, harmless
//! refusal, then that the cluster (or the process) still serves.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Kind};
use oncilla_proto::pb;
use support::Cluster;

/// Asserts a refusal is `INVALID_ARGUMENT` with a short message that
/// contains `needle`.
#[track_caller]
fn assert_bounded_refusal<T: std::fmt::Debug>(
    what: &str,
    r: Result<T, (tonic::Code, String)>,
    needle: &str,
) {
    let (code, msg) = r.expect_err(what);
    assert_eq!(code, tonic::Code::InvalidArgument, "{what}: {msg}");
    assert!(msg.contains(needle), "{what}: {msg:?} lacks {needle:?}");
    assert!(msg.len() < 1024, "{what}: a {}-byte message", msg.len());
}

/// A 100 kB allocation name (or node name) was echoed back whole and the
/// client saw an HTTP/2 protocol error instead of the reason. Now the
/// refusal is INVALID_ARGUMENT saying the name is too long, quoting only
/// its start, and the cluster still serves.
#[test]
fn a_huge_name_is_refused_with_a_bounded_message() {
    let c = Cluster::start(2, "32MiB");
    let huge = "a".repeat(100_000);
    let spec = |name: &str, node: &str| pb::AllocSpec {
        size: 4096,
        kind: pb::MemKind::RemoteHost as i32,
        name: name.to_string(),
        placement: Some(pb::Placement {
            nodes: vec![pb::NodeShare {
                node: node.to_string(),
                weight: 1,
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let named = spec(&huge, "node-1");
    let r = c.master_raw(|mut m| async move {
        m.allocate(pb::AllocateRequest {
            spec: Some(named),
            ..Default::default()
        })
        .await
    });
    assert_bounded_refusal(
        "allocate named 100 kB",
        r,
        "is too long: 100000 bytes, at most 128",
    );

    let on_huge_node = spec("", &huge);
    let r = c.master_raw(|mut m| async move {
        m.allocate(pb::AllocateRequest {
            spec: Some(on_huge_node),
            ..Default::default()
        })
        .await
    });
    assert_bounded_refusal("allocate on a 100 kB node name", r, "(100000 bytes)");

    let by_name = pb::AllocRef {
        id: 0,
        name: huge.clone(),
    };
    let r = c.master_raw(|mut m| async move {
        m.get_allocation(pb::GetAllocationRequest {
            alloc: Some(by_name),
        })
        .await
    });
    // A name no allocation can have is refused where it enters, quoted
    // bounded.
    let (code, msg) = r.expect_err("show a 100 kB name");
    assert_eq!(code, tonic::Code::InvalidArgument, "{msg}");
    assert!(
        msg.contains("too long") && msg.contains("(100000 bytes)"),
        "{msg}"
    );
    assert!(msg.len() < 1024, "a {}-byte message", msg.len());

    // Through liboncilla, as an application would.
    let ocm = c.client(0);
    let e = ocm
        .alloc_with(&AllocSpec::new(4096, Kind::RemoteHost).named(huge.as_str()))
        .expect_err("a 100 kB name");
    let msg = e.to_string();
    assert!(msg.contains("too long"), "{msg}");
    assert!(msg.len() < 1024, "a {}-byte message", msg.len());
    c.still_serves();
}

/// Runs `oncillad` with `args` (and a clean environment), expecting it to
/// refuse to start: its exit status and stderr, or a panic when it is
/// still running after 10 s (it is killed then).
fn oncillad_refuses(args: &[&std::ffi::OsStr]) -> String {
    let mut child = Command::new(support::bin("oncillad"))
        .args(args)
        .env_clear()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("oncillad {args:?} still runs after 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        !status.success(),
        "oncillad {args:?} exited with success:\n{err}"
    );
    err
}

/// A token file others can read (0644, or 0666) started the daemons
/// silently. Now oncillad refuses to start, naming the file, its mode and
/// the fix; with the file made private it starts.
#[test]
fn a_token_file_others_can_read_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::start(1, "16MiB");
    let path = c.dir.join("loose-token");
    std::fs::write(&path, c.token.as_str()).unwrap();
    for mode in [0o644, 0o666, 0o640] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let err = oncillad_refuses(&[
            "--master".as_ref(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--token-file".as_ref(),
            path.as_os_str(),
        ]);
        let shown = path.display().to_string();
        assert!(
            err.contains(&format!("token file {shown} has mode {mode:04o}")),
            "{err}"
        );
        assert!(err.contains(&format!("chmod 600 {shown}")), "{err}");
        // An agent (and so every node) refuses the same file.
        let socket = c.dir.join("loose.sock");
        let err = oncillad_refuses(&agent_args(&c, "loose", &socket, &path));
        assert!(err.contains(&format!("has mode {mode:04o}")), "{err}");
        assert!(!socket.exists(), "the refused agent made its socket");
    }
    // The cluster's own token file is 0600 (the launcher writes it so).
    let mode = std::fs::metadata(c.token_file())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    c.still_serves();
}

/// A 1-byte cluster token was accepted, and so was the cluster token
/// file as the metrics token (a scraper's secret then opened everything).
/// Now a daemon refuses a token under 16 bytes and a metrics token that is
/// the cluster token, saying which and how to make one.
#[test]
fn weak_and_shared_tokens_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::start(1, "16MiB");
    let short = c.dir.join("short-token");
    std::fs::write(&short, "x").unwrap();
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = oncillad_refuses(&[
        "--master".as_ref(),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--token-file".as_ref(),
        short.as_os_str(),
    ]);
    assert!(
        err.contains("cluster token is 1 bytes") && err.contains("at least 16"),
        "{err}"
    );
    let token_file = std::path::PathBuf::from(c.token_file());
    for (file, says) in [
        (token_file.as_path(), "holds the cluster token"),
        (short.as_path(), "metrics token is 1 bytes"),
    ] {
        let err = oncillad_refuses(&[
            "--master".as_ref(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--token-file".as_ref(),
            token_file.as_os_str(),
            "--metrics-listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--metrics-token-file".as_ref(),
            file.as_os_str(),
        ]);
        assert!(err.contains(says), "{err}");
        // An agent refuses it too.
        let socket = c.dir.join("weak.sock");
        let mut args = agent_args(&c, "weak", &socket, &token_file);
        args.extend([
            "--metrics-listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--metrics-token-file".as_ref(),
            file.as_os_str(),
        ]);
        let err = oncillad_refuses(&args);
        assert!(err.contains(says), "{err}");
    }
    c.still_serves();
}

/// Arguments for one more agent `name` of `c` on `socket`, with the
/// token file `token`.
fn agent_args<'a>(
    c: &'a Cluster,
    name: &'a str,
    socket: &'a Path,
    token: &'a Path,
) -> Vec<&'a std::ffi::OsStr> {
    vec![
        "--join".as_ref(),
        c.master_addr.as_ref(),
        "--name".as_ref(),
        name.as_ref(),
        "--capacity".as_ref(),
        "4MiB".as_ref(),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--data-listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--socket".as_ref(),
        socket.as_os_str(),
        "--token-file".as_ref(),
        token.as_os_str(),
    ]
}

/// `--socket` pointing at something that is not a stale socket was
/// deleted before binding. Now a regular file, a directory, a symbolic
/// link and a live agent's socket are refused, each left as it was; a
/// stale socket (nothing answers) is replaced and the agent serves on it.
#[test]
fn bind_unix_replaces_only_a_stale_socket() {
    use std::os::unix::net::{UnixListener, UnixStream};
    let c = Cluster::start(1, "16MiB");
    let token = std::path::PathBuf::from(c.token_file());
    let file = c.dir.join("precious.txt");
    std::fs::write(&file, "precious").unwrap();
    let dir = c.dir.join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("inside"), "kept").unwrap();
    let link = c.dir.join("a-link");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    for (path, what) in [
        (&file, "it is a regular file, not a socket"),
        (&dir, "it is a directory, not a socket"),
        (&link, "it is a symbolic link, not a socket"),
    ] {
        let err = oncillad_refuses(&agent_args(&c, "intruder", path, &token));
        assert!(err.contains(what), "{}: {err}", path.display());
        assert!(err.contains(&path.display().to_string()), "{err}");
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious");
    assert_eq!(std::fs::read_to_string(dir.join("inside")).unwrap(), "kept");
    assert_eq!(std::fs::read_link(&link).unwrap(), file);

    let live = c.socket(0);
    let err = oncillad_refuses(&agent_args(&c, "intruder", &live, &token));
    assert!(
        err.contains(&format!("another agent is listening on {}", live.display())),
        "{err}"
    );
    assert!(
        UnixStream::connect(&live).is_ok(),
        "the live socket was touched"
    );

    // A stale socket: bound, then its listener gone.
    let stale = c.dir.join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    assert!(UnixStream::connect(&stale).is_err());
    let mut agent = Command::new(support::bin("oncillad"))
        .args(agent_args(&c, "stale", &stale, &token))
        .env_clear()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let up = Cluster::eventually(Duration::from_secs(15), || {
        UnixStream::connect(&stale).is_ok() && c.node("stale").is_some_and(|n| n["state"] == "up")
    });
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(up, "the agent on a stale socket did not come up");
    c.still_serves();
}

/// Opens a session on agent 0's socket with `program` as its name, as a
/// raw client can; the refusal's code and message. The session, once
/// open, lives until the returned stream is dropped.
fn open_session_named(
    c: &Cluster,
    rt: &tokio::runtime::Runtime,
    program: String,
) -> Result<tonic::Streaming<pb::SessionEvent>, (tonic::Code, String)> {
    use oncilla_net::credential::AttachCredential;
    use oncilla_proto::client;
    use tonic::service::interceptor::InterceptedService;
    let socket = c.socket(0);
    rt.block_on(async {
        let channel = client::unix(&socket).await.unwrap();
        let mut s = client::session(InterceptedService::new(channel, AttachCredential::none()));
        s.open(pb::OpenRequest {
            pid: std::process::id(),
            program,
        })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|e| (e.code(), e.message().to_string()))
    })
}

/// A session opened with a 25 MiB program name, three allocations and a
/// master restart kept the node out of the cluster: its re-registration
/// (which carries every allocation's owner) grew past the message limit,
/// and every open logged the whole name. Now a program name is a file
/// name (at most 255 bytes, no control characters), refused with a
/// bounded message where it enters; the longest accepted name owns
/// allocations that survive a master restart, with the node back.
#[test]
fn a_huge_program_name_is_refused_where_it_enters() {
    let mut c = Cluster::start(2, "32MiB");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (what, program) in [
        ("a 25 MiB program name", "p".repeat(25 << 20)),
        ("a forged log line", "scan\nINFO session opened".to_string()),
        ("256 bytes", "p".repeat(256)),
    ] {
        let r = open_session_named(&c, &rt, program);
        assert_bounded_refusal(what, r, "is not a file name");
    }
    // The longest accepted name, on allocations that the master must
    // learn again from the agents after it restarts.
    let _session = open_session_named(&c, &rt, "p".repeat(255)).expect("a 255-byte name");
    let log = c.log("node-0");
    assert!(log.contains("session opened"), "{log}");
    assert!(log.len() < 1 << 20, "the agent logged {} bytes", log.len());
    let ocm = c.client(0);
    let kept: Vec<_> = (0..3)
        .map(|i| {
            let a = ocm
                .alloc_with(&AllocSpec::new(4096, Kind::RemoteHost).named(format!("kept{i}")))
                .unwrap();
            a.copy_in(0, b"survives").unwrap();
            a
        })
        .collect();
    c.kill_master();
    c.start_master();
    c.wait_nodes_up(2);
    for a in &kept {
        let mut back = [0u8; 8];
        a.copy_out(0, &mut back).unwrap();
        assert_eq!(&back, b"survives");
    }
    drop(kept);
    c.still_serves();
}

/// Runs ocmctl with `args` against `c`'s token under umask 000 (what a
/// careless shell or service manager may hand it).
fn ocmctl_umask0(c: &Cluster, args: &[&std::ffi::OsStr]) -> std::process::Output {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Command::new(support::bin("ocmctl"));
    cmd.args(args).env("ONCILLA_TOKEN_FILE", c.token_file());
    // SAFETY: umask(2) is async-signal-safe and touches only the child's
    // own file-creation mask; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::stat::umask(nix::sys::stat::Mode::empty());
            Ok(())
        });
    }
    cmd.output().unwrap()
}

/// `ocmctl node-keys --out` and `tls-cert --out` followed a symlink planted
/// at the path, or wrote into a file another user planted there (in a
/// 1777 directory), who then read the node keys (the cluster-wide session
/// key among them) and a TLS private key; under umask 000 the CA and
/// certificates came out world-writable. Now every file is made new beside
/// its path, of exactly its mode, and renamed onto it: the symlink's target
/// and the planted file (read through the attacker's open handle) keep
/// their bytes, and the keys land only in a file of mode 0600.
#[test]
fn output_files_never_follow_or_reuse_what_was_planted() {
    use std::io::{Read as _, Seek as _};
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: needs root to plant files as another user");
        return;
    }
    let c = Cluster::start(1, "16MiB");
    let root = std::env::temp_dir().join(format!("oncilla-out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let sticky = root.join("tmp");
    std::fs::create_dir_all(&sticky).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let nobody = nix::unistd::Uid::from_raw(65534);
    let chown = |p: &Path| {
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            p,
            Some(nobody),
            None,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap();
    };
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    let keys_in = |p: &Path| {
        let text = std::fs::read_to_string(p).unwrap();
        assert!(text.contains("node-1"), "{p:?} holds {text:?}");
        assert_eq!(mode(p), 0o600, "{p:?}");
        assert_eq!(
            std::fs::metadata(p).unwrap().uid(),
            0,
            "{p:?} is not root's own"
        );
    };

    // A symlink another user planted, pointing at root's file.
    let victim = root.join("victim");
    std::fs::write(&victim, "victim\n").unwrap();
    let link = sticky.join("keys");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    chown(&link);
    let out = c.ocmctl(&["node-keys", "node-1", "--out", link.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "victim\n");
    assert!(!std::fs::symlink_metadata(&link).unwrap().is_symlink());
    keys_in(&link);

    // A world-readable file another user planted and holds open.
    let planted = sticky.join("planted");
    std::fs::write(&planted, "attacker\n").unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
    chown(&planted);
    let mut held = std::fs::File::open(&planted).unwrap();
    let out = c.ocmctl(&["node-keys", "node-1", "--out", planted.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut seen = String::new();
    held.rewind().unwrap();
    held.read_to_string(&mut seen).unwrap();
    assert_eq!(seen, "attacker\n", "the attacker's file received the keys");
    keys_in(&planted);

    // Under umask 000: exact modes, and no directory others may write.
    let fresh = root.join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    let out = ocmctl_umask0(
        &c,
        &[
            "node-keys".as_ref(),
            "node-1".as_ref(),
            "--out".as_ref(),
            fresh.join("k").as_os_str(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    keys_in(&fresh.join("k"));
    let ca = root.join("ca");
    let out = ocmctl_umask0(&c, &["tls-ca".as_ref(), "--out".as_ref(), ca.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let certs = ca.join("certs");
    let out = ocmctl_umask0(
        &c,
        &[
            "tls-cert".as_ref(),
            "node-1".as_ref(),
            "--host".as_ref(),
            "127.0.0.1".as_ref(),
            "--ca".as_ref(),
            ca.as_os_str(),
            "--out".as_ref(),
            certs.as_os_str(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (p, want) in [
        (ca.clone(), 0o755),
        (ca.join("ca.pem"), 0o644),
        (ca.join("ca-key.pem"), 0o600),
        (certs.clone(), 0o755),
        (certs.join("node-1.pem"), 0o644),
        (certs.join("node-1-key.pem"), 0o600),
    ] {
        assert_eq!(mode(&p), want, "{p:?}: {:o}", mode(&p));
    }
    let leftovers: Vec<_> = std::fs::read_dir(&sticky)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    std::fs::remove_dir_all(&root).unwrap();
    c.still_serves();
}
