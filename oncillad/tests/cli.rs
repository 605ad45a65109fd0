//! The daemon's command line: help, and refusing bad configurations with one
//! clear message before touching anything.

#![allow(clippy::unwrap_used)]

use std::process::Command;

fn oncillad(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_oncillad"))
        .args(args)
        .env_remove("ONCILLA_TOKEN")
        .env_remove("ONCILLA_TOKEN_FILE")
        .output()
        .unwrap()
}

/// Arguments for an agent that would join a master at an unreachable
/// address, export `capacity`, and listen on loopback and `sock`.
fn agent_args(capacity: &str, sock: &std::path::Path) -> Vec<String> {
    let sock = sock.to_str().unwrap();
    [
        "--join",
        "127.0.0.1:1",
        "--token",
        "0123456789abcdef0123456789abcdef",
        "--capacity",
        capacity,
        "--listen",
        "127.0.0.1:0",
        "--data-listen",
        "127.0.0.1:0",
        "--socket",
        sock,
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn help_documents_every_flag() {
    let out = oncillad(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--master",
        "--join",
        "--name",
        "--listen",
        "--data-listen",
        "--socket",
        "--capacity",
        "--token",
        "--token-file",
        "--config",
        "--hugepages",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    assert!(help.contains("ONCILLA_CAPACITY"), "env names documented");
}

#[test]
fn refuses_bad_configuration() {
    let out = oncillad(&["--token", "0123456789abcdef0123456789abcdef"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to run"));

    let out = oncillad(&["--master"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no cluster token"));

    let out = oncillad(&[
        "--join",
        "127.0.0.1:1",
        "--token",
        "0123456789abcdef0123456789abcdef",
        "--capacity",
        "64PiB",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid size"));

    let sock = std::env::temp_dir().join(format!("oncillad-cli-{}.sock", std::process::id()));
    let args = agent_args("1000TiB", &sock);
    let out = oncillad(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exceeds this node's physical memory"), "{err}");
    assert!(!sock.exists());
}

/// Says why a test did not run, in one line.
fn skip(test: &str, why: &str) {
    println!("{test}: skipped: {why}");
}

#[test]
fn refuses_capacity_it_cannot_lock() {
    let test = "refuses_capacity_it_cannot_lock";
    if !nix::unistd::geteuid().is_root() {
        return skip(test, "needs root to run the daemon as an unprivileged user");
    }
    let sock = std::env::temp_dir().join(format!("oncillad-lock-{}.sock", std::process::id()));
    // An unprivileged user with a 64 KiB locked-memory limit.
    let out = Command::new("prlimit")
        .args([
            "--memlock=65536:65536",
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
        ])
        .args(["--clear-groups", "--inh-caps=-all"])
        .arg(env!("CARGO_BIN_EXE_oncillad"))
        .args([
            "--join",
            "127.0.0.1:1",
            "--token",
            "0123456789abcdef0123456789abcdef",
            "--capacity",
            "64MiB",
        ])
        .args(["--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0"])
        .arg("--socket")
        .arg(&sock)
        .output();
    let Ok(out) = out else {
        return skip(test, "prlimit/setpriv (util-linux) not installed");
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("locked-memory limit (RLIMIT_MEMLOCK) is 64.0 KiB")
            && err.contains("ulimit -l"),
        "{err}"
    );
    assert!(!sock.exists());
}

#[test]
fn hugepages_on_refuses_without_enough() {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let (free, size) = (field("HugePages_Free:"), field("Hugepagesize:") * 1024);
    // One page more than the node has free.
    let capacity = if size == 0 {
        1 << 21
    } else {
        (free + 1) * size
    };
    let sock = std::env::temp_dir().join(format!("oncillad-huge-{}.sock", std::process::id()));
    let mut args = agent_args(&capacity.to_string(), &sock);
    args.extend(["--hugepages".to_string(), "on".to_string()]);
    let out = oncillad(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--hugepages on:"), "{err}");
    if size != 0 {
        assert!(err.contains("vm.nr_hugepages="), "{err}");
    }
    assert!(!sock.exists());
}

#[test]
fn check_config_prints_the_merged_settings_without_secrets() {
    let dir = std::env::temp_dir().join(format!("oncilla-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        "heartbeat_ms = 900\nname = \"from-file\"\ncapacity = \"8MiB\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_oncillad"))
        .args(["--check-config", "--config", file.to_str().unwrap()])
        .args(["--join", "m:7070", "--token", "a-secret-token-value"])
        .args(["--heartbeat-ms", "700"])
        .env("ONCILLA_NAME", "from-env")
        .env_remove("ONCILLA_TOKEN")
        .env_remove("ONCILLA_TOKEN_FILE")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Flags over environment over file.
    assert!(text.contains("heartbeat_ms = 700"), "{text}");
    assert!(text.contains("name = \"from-env\""), "{text}");
    assert!(text.contains("capacity = \"8388608\""), "{text}");
    assert!(text.contains("# token = \"(set)\""), "{text}");
    assert!(
        !text.contains("a-secret-token-value"),
        "the token was printed"
    );

    let bad = Command::new(env!("CARGO_BIN_EXE_oncillad"))
        .args([
            "--check-config",
            "--join",
            "m:7070",
            "--token",
            "0123456789abcdef0123456789abcdef",
        ])
        .env_remove("ONCILLA_TOKEN")
        .env_remove("ONCILLA_TOKEN_FILE")
        .env_remove("ONCILLA_CAPACITY")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--capacity"));
    std::fs::remove_dir_all(dir).unwrap();
}

/// `deploy/systemd/oncillad.service` passes `systemd-analyze verify` (with
/// this build's binary in place of /usr/local/bin/oncillad).
#[test]
fn the_systemd_unit_verifies() {
    let analyze = std::path::Path::new("/usr/bin/systemd-analyze");
    if !analyze.exists() {
        eprintln!("skipped the_systemd_unit_verifies: no systemd-analyze on this host");
        return;
    }
    let unit = include_str!("../../deploy/systemd/oncillad.service")
        .replace("/usr/local/bin/oncillad", env!("CARGO_BIN_EXE_oncillad"));
    assert!(unit.contains("Type=notify") && unit.contains("LimitMEMLOCK=infinity"));
    let dir = std::env::temp_dir().join(format!("oncilla-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("oncillad.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(dir).unwrap();
    assert!(
        out.status.success() && !said.contains("oncillad.service"),
        "{said}"
    );
}

/// In a memory cgroup of 200 MiB, an agent asked for 1 GiB of base pages
/// is refused at once, naming the cgroup's limit (before, it pre-faulted
/// into an OOM kill, exit 137, with nothing in its log). Skipped, one
/// line, where no child cgroup can be made here.
#[test]
fn a_capacity_past_the_memory_cgroup_is_refused_naming_it() {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    // v1 (a memory hierarchy of its own) or v2 (the unified one).
    let place = text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            Some((
                format!("/sys/fs/cgroup/memory{path}"),
                "memory.limit_in_bytes",
            ))
        } else if controllers.is_empty() {
            Some((format!("/sys/fs/cgroup{path}"), "memory.max"))
        } else {
            None
        }
    });
    let Some((parent, limit_file)) = place else {
        eprintln!("skipped: no memory cgroup for this process");
        return;
    };
    let dir = std::path::PathBuf::from(format!("{parent}/oncilla-room-{}", std::process::id()));
    let made = std::fs::create_dir(&dir)
        .and_then(|()| std::fs::write(dir.join(limit_file), (200u64 << 20).to_string()));
    if let Err(e) = made {
        let _ = std::fs::remove_dir(&dir);
        eprintln!("skipped: cannot make a memory cgroup under {parent}: {e}");
        return;
    }
    let sock = std::env::temp_dir().join(format!("oncillad-room-{}.sock", std::process::id()));
    let args = agent_args("1GiB", &sock);
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
        .arg(&dir)
        .arg(env!("CARGO_BIN_EXE_oncillad"))
        .args(&args)
        .args(["--hugepages", "off"])
        .env_remove("ONCILLA_TOKEN")
        .env_remove("ONCILLA_TOKEN_FILE")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("capacity 1.0 GiB is more than this process may still take")
            && err.contains("the memory cgroup")
            && err.contains("limit 200.0 MiB"),
        "{err}"
    );
    assert!(!sock.exists());
}
