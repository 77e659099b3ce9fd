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
pub(crate) struct TargetError {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The specs read from TOML tables whose keys are the flags' names (an experiment file's
    /// `[[targets]]`); an unknown key is refused.
    #[test]
    fn specs_deserialize_from_tables_named_like_the_flags() {
        let g: GrpcTargetSpec = toml::from_str(
            r#"
            proto = ["a.proto"]
            import_path = ["inc"]
            call = "pkg.S/M"
            data = '{"id": {{index}}}'
            metadata = ["k=v"]
            expect = "{}"
            "#,
        )
        .unwrap();
        assert_eq!(g.call.as_deref(), Some("pkg.S/M"));
        assert_eq!(
            (g.proto.len(), g.import_path.len(), g.metadata.len()),
            (1, 1, 1)
        );
        assert!(!g.reflect && g.is_set());
        let h: HttpTargetSpec = toml::from_str(
            r#"
            url = "http://h:8080/x"
            method = "PUT"
            header = ["a: b"]
            body = "hi"
            http2 = true
            expect_status = 204
            "#,
        )
        .unwrap();
        assert_eq!((h.http2, h.expect_status), (true, Some(204)));
        assert!(toml::from_str::<HttpTargetSpec>("urll = \"x\"").is_err());
    }

    #[test]
    fn an_http_target_resolves_its_address_method_and_label() {
        let spec = HttpTargetSpec {
            url: Some("http://example.test:8080/items/{{index}}?q=1".into()),
            body: Some("x".into()),
            ..Default::default()
        };
        let (target, addr) = spec.resolve(0).unwrap();
        assert_eq!(addr, "example.test:8080");
        use crate::bench::Target;
        assert_eq!(target.label(), "POST /items/{{index}}?q=1");
        assert_eq!((target.name(), target.payload_bytes()), ("http1", 1));
        let spec = HttpTargetSpec {
            url: Some("http://example.test".into()),
            ..Default::default()
        };
        let (target, addr) = spec.resolve(0).unwrap();
        assert_eq!(
            (addr.as_str(), target.label().as_str()),
            ("example.test:80", "GET /")
        );
        for (url, says) in [
            ("ftp://x/", "use http://"),
            ("http:///x", "bad host"),
            ("http://x/a b", "bad path"),
        ] {
            let spec = HttpTargetSpec {
                url: Some(url.into()),
                ..Default::default()
            };
            let e = spec.resolve(0).err().expect(url).to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
    }
}
