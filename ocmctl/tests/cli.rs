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

#[test]
fn bench_alloc_runs_on_its_own_cluster() {
    let out = Command::new(env!("CARGO_BIN_EXE_ocmctl"))
        .args(["bench", "alloc", "--iterations", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--iterations must be between"));

    let out = Command::new(env!("CARGO_BIN_EXE_ocmctl"))
        .args(["bench", "alloc", "--agents", "1", "--capacity", "16MiB"])
        .args(["--size", "64B", "--size", "8MiB", "--size", "1GiB"])
        .args(["--iterations", "5", "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Progress goes to stderr: stdout is one JSON document.
    assert!(err.contains("pool ready"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    assert_eq!(rows[1]["size"], 8 << 20);
    assert!(rows[0]["alloc_us"]["p50"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[0]["paper_alloc_ib_ms"], 1.26);
    assert_eq!(v["skipped_sizes"][0], 1u64 << 30);
}

#[test]
fn bench_soak_survives_an_agent_restart_without_corruption_or_leaks() {
    let out = Command::new(env!("CARGO_BIN_EXE_ocmctl"))
        .args(["bench", "soak", "--seconds", "4", "--clients", "2"])
        .args(["--restarts", "1", "--capacity", "64MiB"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("node-2 restarted 1 times"), "{stdout}");
    assert!(stdout.contains("corrupted bytes  0"), "{stdout}");
    assert!(
        stdout.contains("leaked at the end: 0 allocations listed, 0 B placed"),
        "{stdout}"
    );
}
