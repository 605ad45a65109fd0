//! Gives liboncillamem.so its SONAME, liboncillamem.so.ABI, so programs linked
//! against it name the ABI they were built for and run only with a
//! library of that ABI. ABI is the major version, or `0.MINOR` while the
//! major version is 0 (each 0.x may break it): the names cargo-c gives.
//! `deploy/install-c.sh` installs the file under that name.

fn main() {
    let part = |k: &str| std::env::var(k).unwrap_or_default();
    let major = part("CARGO_PKG_VERSION_MAJOR");
    let abi = if major == "0" {
        format!("0.{}", part("CARGO_PKG_VERSION_MINOR"))
    } else {
        major
    };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liboncillamem.so.{abi}");
}
