//! Generates the data-plane service from `proto/hawser/v1/replication.proto`. Uses the
//! protoc inside the `protoc-bin-vendored` crate unless `PROTOC` names another, so a
//! machine without a system protoc builds hawser.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not baked in when it is compiled: a script built for
    // one checkout is reused by another that shares the target directory.
    let manifest_dir =
        std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR is not set")?;
    let root = std::path::Path::new(&manifest_dir).join("../../proto");
    let proto = root.join("hawser/v1/replication.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let mut config = tonic_prost_build::Config::new();
    match std::env::var_os("PROTOC") {
        Some(protoc) => config.protoc_executable(protoc),
        None => config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?),
    };
    // A batch's payload is `Bytes`: the chunks of a large one are views of it, and a
    // receiver hands a batch to the blocking pool without copying it.
    tonic_prost_build::configure()
        .bytes(".hawser.replication.v1.Batch.payload")
        .compile_with_config(config, &[proto], &[root])?;
    Ok(())
}
