//! `include/oncilla.h` is what cbindgen makes of `src/capi.rs` now: a stale
//! header fails here. `ONCILLA_BLESS=1` rewrites it instead.

use std::path::Path;

#[test]
fn oncilla_h_is_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).unwrap();
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .unwrap()
        .write(&mut made);
    let path = crate_dir.join("include/oncilla.h");
    if std::env::var_os("ONCILLA_BLESS").is_some() {
        std::fs::write(&path, &made).unwrap();
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == made,
        "{} is stale: run `ONCILLA_BLESS=1 cargo test -p liboncilla --test header` and commit it",
        path.display()
    );
}
