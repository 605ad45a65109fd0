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
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    assert!(help.contains("ONCILLA_CAPACITY"), "env names documented");
}

#[test]
fn refuses_bad_configuration() {
    let out = oncillad(&["--token", "t"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to run"));

    let out = oncillad(&["--master"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no cluster token"));

    let out = oncillad(&[
        "--join",
        "127.0.0.1:1",
        "--token",
        "t",
        "--capacity",
        "64PiB",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid size"));

    let sock = std::env::temp_dir().join(format!("oncillad-cli-{}.sock", std::process::id()));
    let out = oncillad(&[
        "--join",
        "127.0.0.1:1",
        "--token",
        "t",
        "--capacity",
        "1000TiB",
        "--listen",
        "127.0.0.1:0",
        "--data-listen",
        "127.0.0.1:0",
        "--socket",
        sock.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exceeds this node's physical memory"), "{err}");
    assert!(!sock.exists());
}
