//! Generates the gRPC code from `proto/`. Uses the protoc that ships inside the
//! `protoc-bin-vendored` crate unless `PROTOC` names another, so a machine without a
//! system protoc builds hawser.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not baked in when it is compiled: a script built for
    // one checkout is reused by another that shares the target directory.
    let manifest_dir =
        std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR is not set")?;
    let root = std::path::Path::new(&manifest_dir).join("../../proto");
    let proto = root.join("hawser/v1/hawser.proto");
    let mut config = tonic_prost_build::Config::new();
    match std::env::var_os("PROTOC") {
        Some(protoc) => config.protoc_executable(protoc),
        None => config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?),
    };
    // The proto files live outside this crate, so say explicitly that they matter.
    println!("cargo:rerun-if-changed={}", proto.display());
    tonic_prost_build::configure().compile_with_config(config, &[proto], &[root])?;
    Ok(())
}
