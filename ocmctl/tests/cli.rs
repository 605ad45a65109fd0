//! ocmctl's own argument handling, without a cluster.

#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn bad_input_is_one_clear_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_ocmctl"))
        .args(["alloc", "12XB", "--token", "t", "--master", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("ocmctl: invalid size \"12XB\""), "{err}");

    let out = Command::new(env!("CARGO_BIN_EXE_ocmctl"))
        .args(["nodes"])
        .env_remove("ONCILLA_TOKEN")
        .env_remove("ONCILLA_TOKEN_FILE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no cluster token"));

    let out = Command::new(env!("CARGO_BIN_EXE_ocmctl"))
        .args(["demo", "--agents", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--agents must be between 1 and 16"));
}
