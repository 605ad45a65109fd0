//! The C libraries from C, as a user builds against them: installed by
//! `deploy/install-c.sh` (headers, libraries, pkg-config files), compiled
//! with the system C compiler and `pkg-config --cflags --libs`, run against
//! a real local cluster:
//!
//! - `tests/c/abi.c`: every kind, copies with offsets, the status codes of
//!   bad input, remote memory through `ocm_map`'s pointer, and a named
//!   allocation made by one C process and attached, checked and freed by a
//!   second;
//! - `tests/c/oncillamem.c`: a program written for the original runtime's
//!   API, every function of it over every kind;
//! - the ported applications in `examples/c/` (BFS, the relational
//!   operators) at small sizes, each checking its own answers.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use support::Cluster;

/// The C library a program links: liboncilla (`oncilla.h`) or
/// liboncillamem (`oncillamem.h`, the original runtime's API), by its
/// pkg-config name.
#[derive(Clone, Copy)]
enum Lib {
    Oncilla,
    OncillaMem,
}

impl Lib {
    fn name(self) -> &'static str {
        match self {
            Lib::Oncilla => "oncilla",
            Lib::OncillaMem => "oncillamem",
        }
    }
}

/// The prefix `deploy/install-c.sh` installed this build's C libraries,
/// headers and pkg-config files into (once per test process), as a user
/// installs them.
fn installed() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        // `cargo test` leaves the libraries in deps/ (only `cargo build`
        // copies them up a level); this test binary lives in deps/ too.
        let deps = std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .to_path_buf();
        // One prefix, overwritten by each run: only this test installs.
        let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-prefix");
        let out = Command::new(root.join("deploy/install-c.sh"))
            .arg(&prefix)
            .arg(&deps)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "deploy/install-c.sh failed (run the workspace tests, `cargo test --workspace`, to build the libraries):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        prefix
    })
}

/// Compiles the C program `source` (relative to the repository root)
/// against the installed `lib`, with the flags its pkg-config file gives,
/// into `dir`; returns the program.
fn compile(dir: &Path, source: &str, lib: Lib) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let prefix = installed();
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", lib.name()])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run pkg-config: {e}"));
    assert!(
        flags.status.success(),
        "pkg-config {}: {}",
        lib.name(),
        String::from_utf8_lossy(&flags.stderr)
    );
    let flags = String::from_utf8(flags.stdout).unwrap();
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
        .arg(root.join("examples/c"))
        .args(flags.split_whitespace())
        // DT_RPATH (not RUNPATH) wins over the LD_LIBRARY_PATH cargo sets,
        // which names target/debug/deps first.
        .arg("-Wl,--disable-new-dtags")
        .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()))
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

/// What `readelf -d` says of `file`'s dynamic section.
fn dynamic_section(file: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run readelf: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn c_programs_use_every_call_of_the_abi() {
    let c = Cluster::start(2, "32MiB");
    let exe = compile(&c.dir, "tests/c/abi.c", Lib::Oncilla);
    // The library names its ABI (0.MINOR before 1.0), the program records
    // that name, and the installed file answers to it (the program runs).
    let abi = match env!("CARGO_PKG_VERSION_MAJOR") {
        "0" => format!("0.{}", env!("CARGO_PKG_VERSION_MINOR")),
        major => major.to_string(),
    };
    let soname = format!("liboncilla.so.{abi}");
    let lib = installed().join("lib/liboncilla.so");
    assert!(
        dynamic_section(&lib).contains(&format!("Library soname: [{soname}]")),
        "{}",
        dynamic_section(&lib)
    );
    assert!(
        dynamic_section(&exe).contains(&format!("Shared library: [{soname}]")),
        "{}",
        dynamic_section(&exe)
    );
    let file = installed().join(format!("lib/liboncilla.so.{}", env!("CARGO_PKG_VERSION")));
    assert!(file.is_file(), "{file:?}");
    let out = run(&c, &exe, &["basic"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for kind in ["local-host", "remote-host"] {
        assert!(text.contains(&format!("ok {kind}:")), "{text}");
    }
    assert!(text.contains("ok bad input"), "{text}");
    assert!(text.contains("ok batch"), "{text}");
    assert!(text.contains("ok version: 0."), "{text}");
    assert!(text.contains("ok free"), "{text}");

    let out = run(&c, &exe, &["map"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok map"));
    run(&c, &exe, &["create", "c-shared"]);
    run(&c, &exe, &["attach", "c-shared"]);
    // Nothing is left behind: every allocation was freed.
    assert_eq!(c.allocation_count(), 0);
}

#[test]
fn a_program_written_for_the_original_api_runs_unmodified() {
    // Node-0, where the program runs, is smaller than a remote buffer
    // (12 MiB), so remote buffers go to node-1 over the fabric.
    let c = Cluster::start_sized(&["10MiB", "128MiB"], Duration::from_secs(30));
    let exe = compile(&c.dir, "tests/c/oncillamem.c", Lib::OncillaMem);
    let out = run(&c, &exe, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    for kind in [
        "REMOTE_RMA",
        "REMOTE_RDMA",
        "LOCAL_HOST",
        "LOCAL_RMA",
        "LOCAL_RDMA",
    ] {
        assert!(text.contains(&format!("ok OCM_{kind}:")), "{text}");
    }
    for group in ["ok ocm_copy:", "ok bad input", "ok tini"] {
        assert!(text.contains(group), "{text}");
    }
    // Every allocation was freed, the last one by ocm_tini.
    assert!(
        Cluster::eventually(Duration::from_secs(30), || c.allocation_count() == 0),
        "allocations left: {}",
        c.allocation_count()
    );
}

#[test]
fn ported_c_applications_match_their_local_runs() {
    let c = Cluster::start(3, "64MiB");
    let bfs = compile(&c.dir, "examples/c/bfs.c", Lib::Oncilla);
    let out = run(&c, &bfs, &["--vertices", "64K", "--reps", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("equals the local run's"), "{text}");
    assert!(text.contains("total (without load)"), "{text}");

    let relational = compile(&c.dir, "examples/c/relational.c", Lib::Oncilla);
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
