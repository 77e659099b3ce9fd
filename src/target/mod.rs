//! Generic targets: any gRPC service ([`grpc`]) or HTTP endpoint ([`http`]), driven by the same
//! load driver, connection modes and counting as faultrig's own flavours (each is a
//! [`crate::bench::Target`]).
//!
//! A target is described by a plain struct ([`GrpcTargetSpec`], [`HttpTargetSpec`]) whose
//! fields are the `faultrig bench` flags and, with the same names, the keys of a TOML table.
//! Its one `resolve` step checks everything (files read, protos compiled or fetched by
//! reflection, data checked against the message, templates parsed) before any load, and says
//! what is wrong with which flag.

pub mod grpc;
pub mod http;
mod reflection;
pub mod template;

pub use grpc::{GrpcTarget, GrpcTargetSpec};
pub use http::{HttpTarget, HttpTargetSpec};
pub use template::Template;

/// Bad target input: which flag (or file), and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {why}")]
pub struct TargetError {
    /// The flag, with the file or value when there is one: `--proto greet.proto`.
    pub what: String,
    pub why: String,
}

impl TargetError {
    pub fn new(what: impl Into<String>, why: impl Into<String>) -> TargetError {
        TargetError {
            what: what.into(),
            why: why.into(),
        }
    }
}

/// A flag's value, or the contents of the file it names when it starts with `@`.
fn inline_or_file(flag: &str, value: &str) -> Result<String, TargetError> {
    match value.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| TargetError::new(format!("{flag} @{path}"), format!("cannot read: {e}"))),
        None => Ok(value.to_string()),
    }
}
