//! Compiles `oncilla.proto` with protox (a pure-Rust protobuf compiler), so
//! building needs no `protoc` and downloads nothing.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=oncilla.proto");
    let fds = protox::compile(["oncilla.proto"], ["."])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
