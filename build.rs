//! Compiles `proto/*.proto` with protox (pure Rust: no system `protoc`) and generates the prost
//! messages and tonic service. The same message types serve every flavour, so they also derive
//! serde for the JSON flavours.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["rig.proto"], ["proto"])?;
    tonic_prost_build::configure()
        // Blobs are shared, not copied, between the workload, the client and the verifier.
        .bytes(".rig.Blob.data")
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .type_attribute(".", "#[serde(default)]")
        .field_attribute(
            "rig.Blob.data",
            "#[serde(with = \"crate::rig::base64_bytes\")]",
        )
        .compile_fds(descriptors)?;
    Ok(())
}
