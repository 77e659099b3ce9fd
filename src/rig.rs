//! The operations every flavour carries, defined once in `proto/rig.proto`.
//!
//! [`pb`] holds the generated protobuf types (also serde, for the JSON flavours) and the tonic
//! service. [`Call`] and [`Reply`] are one call and its answer, whatever the flavour.

use prost::Message;

/// Generated from `proto/rig.proto` and `proto/wide.proto` by `build.rs`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/rig.rs"));
}

/// The four operations, with the names HTTP paths and gRPC use and the codes tcp-binary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    EchoOrder,
    EchoBlob,
    EchoWide,
    Deduct,
}

impl Operation {
    pub const ALL: [Operation; 4] = [
        Operation::EchoOrder,
        Operation::EchoBlob,
        Operation::EchoWide,
        Operation::Deduct,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Operation::EchoOrder => "EchoOrder",
            Operation::EchoBlob => "EchoBlob",
            Operation::EchoWide => "EchoWide",
            Operation::Deduct => "Deduct",
        }
    }

    /// Whether the reply is the request's message again.
    pub fn echoes(self) -> bool {
        self != Operation::Deduct
    }

    pub(crate) fn from_name(name: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|op| op.name() == name)
    }

    /// The method number on the tcp-binary wire.
    pub fn code(self) -> u16 {
        match self {
            Operation::EchoOrder => 1,
            Operation::EchoBlob => 2,
            Operation::EchoWide => 3,
            Operation::Deduct => 4,
        }
    }

    pub(crate) fn from_code(code: u16) -> Option<Operation> {
        Operation::ALL.into_iter().find(|op| op.code() == code)
    }
}

/// One request. Large messages are boxed so a `Call` stays small to move around.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    EchoOrder(pb::Order),
    EchoBlob(pb::Blob),
    EchoWide(Box<pb::Wide>),
    Deduct(pb::DeductRequest),
}

/// One answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    EchoOrder(pb::Order),
    EchoBlob(pb::Blob),
    EchoWide(Box<pb::Wide>),
    Deduct(pb::DeductReply),
}

/// A message that could not be decoded or encoded: always a `protocol` outcome.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct CodecError(pub String);

impl Call {
    pub fn operation(&self) -> Operation {
        match self {
            Call::EchoOrder(_) => Operation::EchoOrder,
            Call::EchoBlob(_) => Operation::EchoBlob,
            Call::EchoWide(_) => Operation::EchoWide,
            Call::Deduct(_) => Operation::Deduct,
        }
    }

    /// Protobuf encoding of the request message (the fuzz tests' input; the flavours encode
    /// into their own frames with `encode_protobuf_into`).
    #[cfg(test)]
    pub(crate) fn encode_protobuf(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.protobuf_len());
        self.encode_protobuf_into(&mut out);
        out
    }

    /// Size of the protobuf encoding.
    pub(crate) fn protobuf_len(&self) -> usize {
        match self {
            Call::EchoOrder(m) => m.encoded_len(),
            Call::EchoBlob(m) => m.encoded_len(),
            Call::EchoWide(m) => m.encoded_len(),
            Call::Deduct(m) => m.encoded_len(),
        }
    }

    /// Appends the protobuf encoding to `buf` (no intermediate copy).
    pub(crate) fn encode_protobuf_into(&self, buf: &mut impl bytes::BufMut) {
        match self {
            Call::EchoOrder(m) => m.encode_raw(buf),
            Call::EchoBlob(m) => m.encode_raw(buf),
            Call::EchoWide(m) => m.encode_raw(buf),
            Call::Deduct(m) => m.encode_raw(buf),
        }
    }

    pub(crate) fn decode_protobuf(op: Operation, bytes: &[u8]) -> Result<Call, CodecError> {
        let err = |e: prost::DecodeError| CodecError(format!("bad {} request: {e}", op.name()));
        Ok(match op {
            Operation::EchoOrder => Call::EchoOrder(pb::Order::decode(bytes).map_err(err)?),
            Operation::EchoBlob => Call::EchoBlob(pb::Blob::decode(bytes).map_err(err)?),
            Operation::EchoWide => Call::EchoWide(Box::new(pb::Wide::decode(bytes).map_err(err)?)),
            Operation::Deduct => Call::Deduct(pb::DeductRequest::decode(bytes).map_err(err)?),
        })
    }

    pub fn encode_json(&self) -> Vec<u8> {
        let encoded = match self {
            Call::EchoOrder(m) => serde_json::to_vec(m),
            Call::EchoBlob(m) => serde_json::to_vec(m),
            Call::EchoWide(m) => serde_json::to_vec(m),
            Call::Deduct(m) => serde_json::to_vec(m),
        };
        encoded.expect("generated messages always serialise")
    }

    pub(crate) fn decode_json(op: Operation, bytes: &[u8]) -> Result<Call, CodecError> {
        let err = |e: serde_json::Error| CodecError(format!("bad {} request JSON: {e}", op.name()));
        Ok(match op {
            Operation::EchoOrder => Call::EchoOrder(serde_json::from_slice(bytes).map_err(err)?),
            Operation::EchoBlob => Call::EchoBlob(serde_json::from_slice(bytes).map_err(err)?),
            Operation::EchoWide => Call::EchoWide(serde_json::from_slice(bytes).map_err(err)?),
            Operation::Deduct => Call::Deduct(serde_json::from_slice(bytes).map_err(err)?),
        })
    }
}

impl Reply {
    pub fn operation(&self) -> Operation {
        match self {
            Reply::EchoOrder(_) => Operation::EchoOrder,
            Reply::EchoBlob(_) => Operation::EchoBlob,
            Reply::EchoWide(_) => Operation::EchoWide,
            Reply::Deduct(_) => Operation::Deduct,
        }
    }

    pub(crate) fn protobuf_len(&self) -> usize {
        match self {
            Reply::EchoOrder(m) => m.encoded_len(),
            Reply::EchoBlob(m) => m.encoded_len(),
            Reply::EchoWide(m) => m.encoded_len(),
            Reply::Deduct(m) => m.encoded_len(),
        }
    }

    /// Appends the protobuf encoding to `buf` (no intermediate copy).
    pub(crate) fn encode_protobuf_into(&self, buf: &mut impl bytes::BufMut) {
        match self {
            Reply::EchoOrder(m) => m.encode_raw(buf),
            Reply::EchoBlob(m) => m.encode_raw(buf),
            Reply::EchoWide(m) => m.encode_raw(buf),
            Reply::Deduct(m) => m.encode_raw(buf),
        }
    }

    pub(crate) fn decode_protobuf(op: Operation, bytes: &[u8]) -> Result<Reply, CodecError> {
        let err = |e: prost::DecodeError| CodecError(format!("bad {} reply: {e}", op.name()));
        Ok(match op {
            Operation::EchoOrder => Reply::EchoOrder(pb::Order::decode(bytes).map_err(err)?),
            Operation::EchoBlob => Reply::EchoBlob(pb::Blob::decode(bytes).map_err(err)?),
            Operation::EchoWide => Reply::EchoWide(Box::new(pb::Wide::decode(bytes).map_err(err)?)),
            Operation::Deduct => Reply::Deduct(pb::DeductReply::decode(bytes).map_err(err)?),
        })
    }

    pub fn encode_json(&self) -> Vec<u8> {
        let encoded = match self {
            Reply::EchoOrder(m) => serde_json::to_vec(m),
            Reply::EchoBlob(m) => serde_json::to_vec(m),
            Reply::EchoWide(m) => serde_json::to_vec(m),
            Reply::Deduct(m) => serde_json::to_vec(m),
        };
        encoded.expect("generated messages always serialise")
    }

    pub(crate) fn decode_json(op: Operation, bytes: &[u8]) -> Result<Reply, CodecError> {
        let err = |e: serde_json::Error| CodecError(format!("bad {} reply JSON: {e}", op.name()));
        Ok(match op {
            Operation::EchoOrder => Reply::EchoOrder(serde_json::from_slice(bytes).map_err(err)?),
            Operation::EchoBlob => Reply::EchoBlob(serde_json::from_slice(bytes).map_err(err)?),
            Operation::EchoWide => Reply::EchoWide(serde_json::from_slice(bytes).map_err(err)?),
            Operation::Deduct => Reply::Deduct(serde_json::from_slice(bytes).map_err(err)?),
        })
    }
}

/// JSON carries `bytes` fields as standard base64 strings, as protobuf's JSON mapping does.
pub mod base64_bytes {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<bytes::Bytes, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map(bytes::Bytes::from)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_round_trip_names_and_codes() {
        for op in Operation::ALL {
            assert_eq!(Operation::from_name(op.name()), Some(op));
            assert_eq!(Operation::from_code(op.code()), Some(op));
        }
        assert_eq!(Operation::from_code(0), None);
    }

    #[test]
    fn blob_json_uses_base64() {
        let call = Call::EchoBlob(pb::Blob {
            data: vec![0, 1, 2, 255].into(),
        });
        let json = String::from_utf8(call.encode_json()).unwrap();
        assert_eq!(json, r#"{"data":"AAEC/w=="}"#);
        assert_eq!(
            Call::decode_json(Operation::EchoBlob, json.as_bytes()).unwrap(),
            call
        );
    }

    #[test]
    fn missing_json_fields_take_protobuf_defaults() {
        let call = Call::decode_json(Operation::Deduct, br#"{"sku":"a"}"#).unwrap();
        assert_eq!(
            call,
            Call::Deduct(pb::DeductRequest {
                sku: "a".into(),
                quantity: 0
            })
        );
    }
}
