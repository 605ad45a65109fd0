//! ocmctl as a Unix tool: a reader that closes the pipe early, `-` for
//! stdin and stdout, `ocmctl run` passing its program's exit status and
//! its signals on, and a wrong `--master` said in words.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::process::Stdio;

use support::Cluster;

/// `ocmctl show` of an allocation with 3,072 extents (some 300 kB of
/// text) and `ocmctl get` of 12 MiB, each read for one line or one block
/// and then closed: ocmctl ends quietly with success, no panic; nor does
/// a closed stderr make it panic.
#[test]
fn a_reader_that_closes_early_ends_ocmctl_quietly() {
    let c = Cluster::start(2, "32MiB");
    let id = c
        .ocmctl_ok(&[
            "alloc", "12MiB", "--node", "node-0", "--node", "node-1", "--stripe", "4KiB",
        ])
        .trim()
        .to_string();
    for args in [vec!["show", id.as_str()], vec!["get", id.as_str()]] {
        let mut child = c
            .ocmctl_command(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 64];
        stdout.read_exact(&mut first).unwrap();
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {err}", out.status);
        assert!(err.is_empty(), "{args:?}: {err}");
    }
    c.ocmctl_ok(&["free", &id]);

    // A closed stderr loses ocmctl's notes and errors, nothing else: the
    // node table (whose notes go to stderr) still comes out, and an error
    // still exits 1, without a panic.
    for (args, ok) in [(vec!["nodes"], true), (vec!["show", "no-such-name"], false)] {
        let mut child = c
            .ocmctl_command(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stderr.take());
        let mut table = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut table)
            .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(i32::from(!ok)), "{args:?}: {status:?}");
        if ok {
            assert!(table.contains("node-1"), "{table}");
        }
    }
}

/// `put ID -` reads stdin, `get ID -o -` writes stdout; stdin longer than
/// the room left is refused, saying how much was written.
#[test]
fn a_dash_is_stdin_and_stdout() {
    let c = Cluster::start(2, "32MiB");
    let id = c.ocmctl_ok(&["alloc", "1MiB"]).trim().to_string();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let mut put = c
        .ocmctl_command(&["put", &id, "-", "--offset", "10"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    put.stdin.take().unwrap().write_all(&data).unwrap();
    let out = put.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = c.ocmctl(&["get", &id, "--offset", "10", "--len", "300000", "-o", "-"]);
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert!(got.stdout == data, "stdout is not what stdin gave");
    assert!(!c.dir.join("-").exists(), "no file named -");
    // Offsets and lengths take units.
    let kib = c.ocmctl(&["get", &id, "--offset", "1KiB", "--len", "2k"]);
    assert!(
        kib.status.success(),
        "{}",
        String::from_utf8_lossy(&kib.stderr)
    );
    assert!(
        kib.stdout == data[1014..1014 + 2048],
        "1KiB..+2k of the allocation"
    );

    let mut over = c
        .ocmctl_command(&["put", &id, "-", "--offset", "900000"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The refusal may come before all of it is written: a closed pipe
    // here is the refusal, not a failure of the test.
    let _ = over.stdin.take().unwrap().write_all(&data);
    let out = over.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("holds more than"), "{err}");
    c.ocmctl_ok(&["free", &id]);
}

/// `ocmctl run` exits with its program's status; a SIGINT to ocmctl goes
/// to the program, and both end with nothing left running.
#[test]
fn run_passes_the_status_and_the_signal_on() {
    let run = |script: &str| {
        let mut cmd = std::process::Command::new(support::bin("ocmctl"));
        cmd.args(["run", "--agents", "1", "--capacity", "16MiB", "--"])
            .args(["sh", "-c", script])
            .env_remove("ONCILLA_TOKEN");
        cmd
    };
    let out = run("exit 7").output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = tempfile_dir();
    let pidfile = dir.join("pid");
    let script = format!("echo $$ > {}; exec sleep 120", pidfile.display());
    let mut ocmctl = run(&script).stderr(Stdio::piped()).spawn().unwrap();
    let started = Cluster::eventually(Cluster::EVENT, || {
        std::fs::read_to_string(&pidfile).is_ok_and(|s| s.ends_with('\n'))
    });
    assert!(started, "the program never started");
    let program: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(ocmctl.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let mut status = None;
    let ended = Cluster::eventually(Cluster::EVENT, || {
        status = ocmctl.try_wait().unwrap();
        status.is_some()
    });
    assert!(ended, "ocmctl did not end after SIGINT");
    let status = status.unwrap();
    let mut err = String::new();
    ocmctl
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("killed by signal 2"), "{err}");
    let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(program), None).is_err();
    assert!(gone, "the program {program} still runs");
    let _ = std::fs::remove_dir_all(dir);
}

/// An agent's gRPC port given as the master's: the error says so.
#[test]
fn a_wrong_master_address_is_said_in_words() {
    let c = Cluster::start(1, "16MiB");
    let agent = c.node("node-0").unwrap()["agent_addr"]
        .as_str()
        .unwrap()
        .to_string();
    let out = c.ocmctl(&["nodes", "--master", &agent]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("does not serve this call as a master"),
        "{err}"
    );
}

/// A directory of its own for one test.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ocmctl-unix-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
