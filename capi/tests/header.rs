//! The two C headers are what cbindgen makes of their crates now:
//! `capi/include/oncilla.h` of this crate and
//! `oncillamem/include/oncillamem.h` of `oncillamem`. A stale header fails
//! here; `ONCILLA_BLESS=1` rewrites it instead.

#![allow(clippy::unwrap_used)]

use std::path::Path;

/// Checks (or, blessing, rewrites) the header `include/NAME` of the crate
/// in `crate_dir`.
fn current(crate_dir: &Path, name: &str) {
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).unwrap();
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .unwrap()
        .write(&mut made);
    let path = crate_dir.join("include").join(name);
    if std::env::var_os("ONCILLA_BLESS").is_some() {
        std::fs::write(&path, &made).unwrap();
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == made,
        "{} is stale: run `ONCILLA_BLESS=1 cargo test -p oncilla-capi --test header` and commit it",
        path.display()
    );
}

#[test]
fn oncilla_h_is_current() {
    current(Path::new(env!("CARGO_MANIFEST_DIR")), "oncilla.h");
}

#[test]
fn oncillamem_h_is_current() {
    current(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../oncillamem"),
        "oncillamem.h",
    );
}
