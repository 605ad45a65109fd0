//! The C ABI from C, compiled with the system C compiler against
//! `liboncilla/include/oncilla.h` and the shared library cargo built, run
//! against a real local cluster:
//!
//! - `tests/c/abi.c`: every kind, copies with offsets, the status codes of
//!   bad input, remote memory through `ocm_map`'s pointer, and a named
//!   allocation made by one C process and attached, checked and freed by a
//!   second;
//! - the ported applications in `examples/c/` (BFS, the relational
//!   operators) at small sizes, each checking its own answers.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::Cluster;

/// Compiles the C program `source` (relative to the repository root) into
/// `dir`; returns the program.
fn compile(dir: &Path, source: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // `cargo test` leaves the shared library in deps/ (only `cargo build`
    // copies it up a level); this test binary lives in deps/ too.
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let lib_dir = [deps.clone(), deps.parent().unwrap().to_path_buf()]
        .into_iter()
        .find(|d| d.join("libliboncilla.so").exists())
        .unwrap_or_else(|| {
            panic!(
                "no libliboncilla.so in {} or above; run the workspace tests (`cargo test --workspace`)",
                deps.display()
            )
        });
    let exe = dir.join(Path::new(source).file_stem().unwrap());
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args([
            "-std=c11",
            "-O2",
            "-pthread",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-o",
        ])
        .arg(&exe)
        .arg(root.join(source))
        .arg("-I")
        .arg(root.join("liboncilla/include"))
        .arg("-I")
        .arg(root.join("examples/c"))
        .arg("-L")
        .arg(&lib_dir)
        .arg("-lliboncilla")
        // DT_RPATH (not RUNPATH) wins over the LD_LIBRARY_PATH cargo sets,
        // which may name a stale target/debug/libliboncilla.so first.
        .arg("-Wl,--disable-new-dtags")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(
        out.status.success(),
        "compiling {source} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn run(c: &Cluster, exe: &Path, args: &[&str]) -> Output {
    let out = Command::new(exe)
        .args(args)
        .env("ONCILLA_SOCKET", c.socket(0))
        .env("ONCILLA_TOKEN_FILE", c.token_file())
        .env_remove("ONCILLA_TOKEN")
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{}{}",
        exe.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn c_programs_use_every_call_of_the_abi() {
    let c = Cluster::start(2, "32MiB");
    let exe = compile(&c.dir, "tests/c/abi.c");
    let out = run(&c, &exe, &["basic"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for kind in ["local-host", "remote-host"] {
        assert!(text.contains(&format!("ok {kind}:")), "{text}");
    }
    assert!(text.contains("ok bad input"), "{text}");
    assert!(text.contains("ok free"), "{text}");

    let out = run(&c, &exe, &["map"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok map"));
    run(&c, &exe, &["create", "c-shared"]);
    run(&c, &exe, &["attach", "c-shared"]);
    // Nothing is left behind: every allocation was freed.
    assert_eq!(c.allocation_count(), 0);
}

#[test]
fn ported_c_applications_match_their_local_runs() {
    let c = Cluster::start(3, "64MiB");
    let bfs = compile(&c.dir, "examples/c/bfs.c");
    let out = run(&c, &bfs, &["--vertices", "64K", "--reps", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("equals the local run's"), "{text}");
    assert!(text.contains("total (without load)"), "{text}");

    let relational = compile(&c.dir, "examples/c/relational.c");
    let dir = c.dir.to_str().unwrap();
    let args = [
        "--tuples",
        "64K,256K",
        "--r-tuples",
        "16K",
        "--chunk",
        "64K",
        "--reps",
        "1",
        "--dir",
        dir,
    ];
    let out = run(&c, &relational, &args);
    let text = String::from_utf8_lossy(&out.stdout);
    for op in ["select", "join", "spj"] {
        assert!(text.contains(op), "{text}");
    }
    assert!(
        text.contains("every run's rows and checksum equal"),
        "{text}"
    );
    assert_eq!(c.allocation_count(), 0);
}
