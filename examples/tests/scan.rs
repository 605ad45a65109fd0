//! The scan example as a user runs it: `ocmctl run` starts a local cluster
//! of two agents and runs the scan in it, on the CPU, striped over both
//! nodes; the scan checks its answers from remote memory and from the file
//! against the reference it computed while loading, and says so.
//!
//! Being an integration test of this package also makes `cargo test
//! --workspace` build the `scan` binary, which the Python suite compares
//! with its own port.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

#[test]
fn the_scan_answers_as_its_reference_from_remote_memory_and_from_a_file() {
    // target/<profile>/deps/<this test> -> target/<profile>/ocmctl
    let exe = std::env::current_exe().unwrap();
    let ocmctl = exe.parent().and_then(Path::parent).unwrap().join("ocmctl");
    assert!(
        ocmctl.exists(),
        "{} not built; run the workspace tests with `cargo test --workspace`",
        ocmctl.display()
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("scan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("table.tbl");
    let out = Command::new(&ocmctl)
        .args(["run", "--agents", "2", "--capacity", "32MiB", "--"])
        .arg(env!("CARGO_BIN_EXE_scan"))
        .args([
            "--rows", "256K", "--chunk", "1MiB", "--stripe", "256KiB", "--cpu", "--file",
        ])
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "the scan failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("both answers match the reference"),
        "{stdout}"
    );
    assert!(!file.exists(), "the scan left its file behind");
}
