//! The C ABI from C: `tests/c/abi.c`, compiled with the system C compiler
//! against `liboncilla/include/oncilla.h` and the shared library cargo
//! built, runs against a real local cluster: every kind, copies with
//! offsets, the status codes of bad input, and a named allocation made by
//! one C process and attached, checked and freed by a second.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::Cluster;

/// Compiles `tests/c/abi.c` into `dir`; returns the program.
fn compile(dir: &Path) -> PathBuf {
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
    let exe = dir.join("abi");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-o"])
        .arg(&exe)
        .arg(root.join("tests/c/abi.c"))
        .arg("-I")
        .arg(root.join("liboncilla/include"))
        .arg("-L")
        .arg(&lib_dir)
        .arg("-lliboncilla")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(
        out.status.success(),
        "compiling tests/c/abi.c failed:\n{}",
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
        "abi {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn c_programs_use_every_call_of_the_abi() {
    let c = Cluster::start(2, "32MiB");
    let exe = compile(&c.dir);
    let out = run(&c, &exe, &["basic"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for kind in ["local-host", "remote-host"] {
        assert!(text.contains(&format!("ok {kind}:")), "{text}");
    }
    assert!(text.contains("ok bad input"), "{text}");
    assert!(text.contains("ok free"), "{text}");

    run(&c, &exe, &["create", "c-shared"]);
    run(&c, &exe, &["attach", "c-shared"]);
    // Nothing is left behind: every allocation was freed.
    assert_eq!(c.allocation_count(), 0);
}
