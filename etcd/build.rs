//! Compiles the trimmed etcd protos with protox (a pure-Rust protobuf
//! compiler), so building needs no `protoc`: the `etcd-client` crate's
//! build script runs `protoc`, which the default build must not need.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for p in [
        "proto/kv.proto",
        "proto/rpc.proto",
        "proto/v3election.proto",
    ] {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(["v3election.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
