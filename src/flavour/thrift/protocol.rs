//! Apache Thrift's binary protocol (TBinaryProtocol), written from the Thrift specification:
//! message envelopes, structs, the values our records use, skipping of anything else, and
//! `TApplicationException`. Framing (TFramedTransport's 4-byte length) is the caller's.
//!
//! Decoding never trusts a length: every length is checked against the bytes left in the frame
//! before anything is allocated, and nesting is bounded, so a malformed frame is an error, never
//! a panic or a huge allocation.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::rig::pb;

/// Thrift's type tags (`TType`).
pub(crate) const STOP: u8 = 0;
pub(crate) const BOOL: u8 = 2;
pub(crate) const BYTE: u8 = 3;
pub(crate) const DOUBLE: u8 = 4;
pub(crate) const I16: u8 = 6;
pub(crate) const I32: u8 = 8;
pub(crate) const I64: u8 = 10;
pub(crate) const STRING: u8 = 11;
pub(crate) const STRUCT: u8 = 12;
pub(crate) const MAP: u8 = 13;
pub(crate) const SET: u8 = 14;
pub(crate) const LIST: u8 = 15;
pub(crate) const UUID: u8 = 16;

/// Strict binary protocol, version 1, in the envelope's first word.
const VERSION_1: u32 = 0x8001_0000;
const VERSION_MASK: u32 = 0xffff_0000;

/// Structs nested deeper than this are refused rather than followed (a stack guard).
const MAX_DEPTH: u32 = 64;

/// Bytes a list may reserve before its elements arrive.
const PREALLOCATE: usize = 64 << 10;

/// The fewest bytes a value of type `ttype` takes on the wire (1 for an unknown tag, which
/// fails when read).
fn min_encoded_size(ttype: u8) -> usize {
    match ttype {
        I16 => 2,
        I32 | STRING => 4,
        I64 | DOUBLE => 8,
        MAP => 6,
        SET | LIST => 5,
        UUID => 16,
        _ => 1,
    }
}

/// What a message is (`TMessageType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MessageType {
    Call = 1,
    Reply = 2,
    Exception = 3,
    Oneway = 4,
}

impl MessageType {
    fn from_u8(v: u8) -> Option<MessageType> {
        Some(match v {
            1 => MessageType::Call,
            2 => MessageType::Reply,
            3 => MessageType::Exception,
            4 => MessageType::Oneway,
            _ => return None,
        })
    }
}

/// A message's envelope: what it is, which method, and the sequence id that pairs a reply with
/// its call. The name is borrowed when writing (a call's or the request's own), so a call
/// allocates nothing for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Envelope<'a> {
    pub kind: MessageType,
    pub name: std::borrow::Cow<'a, str>,
    pub seq_id: i32,
}

/// Bytes that are not valid Thrift, or a value our records cannot hold.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("thrift: {message}")]
pub struct ThriftError {
    pub message: String,
    /// True when the bytes are not Thrift at all (a bad length or type tag, a truncated value):
    /// whatever follows cannot be trusted. False for a well-formed value out of a field's range,
    /// which a server answers with an exception and goes on.
    pub malformed: bool,
}

impl ThriftError {
    pub(crate) fn malformed(message: impl Into<String>) -> ThriftError {
        ThriftError {
            message: message.into(),
            malformed: true,
        }
    }
}

fn err<T>(text: impl Into<String>) -> Result<T, ThriftError> {
    Err(ThriftError::malformed(text))
}

/// `TApplicationException` type codes.
pub mod app_error {
    pub(crate) const UNKNOWN_METHOD: i32 = 1;
    pub const INVALID_MESSAGE_TYPE: i32 = 2;
    pub const BAD_SEQUENCE_ID: i32 = 4;
    pub const MISSING_RESULT: i32 = 5;
    pub(crate) const INTERNAL_ERROR: i32 = 6;
    pub(crate) const PROTOCOL_ERROR: i32 = 7;
}

/// Thrift's `TApplicationException { 1: string message, 2: i32 type }`: how a server reports a
/// failed call that the service's IDL declares no exception for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ApplicationException {
    pub message: String,
    pub kind: i32,
}

/// A record with a Thrift struct encoding. Implemented for every message of `proto/*.proto` by
/// code that `build.rs` generates from the same descriptors as the protobuf types.
pub(crate) trait ThriftStruct: Sized {
    fn write(&self, w: &mut Writer<'_>);
    fn read(r: &mut Reader) -> Result<Self, ThriftError>;
}

include!(concat!(env!("OUT_DIR"), "/rig_thrift.rs"));

impl ThriftStruct for ApplicationException {
    fn write(&self, w: &mut Writer<'_>) {
        w.field_string(1, &self.message);
        w.field_i32(2, &self.kind);
        w.stop();
    }

    fn read(r: &mut Reader) -> Result<Self, ThriftError> {
        let mut m = ApplicationException::default();
        r.enter()?;
        while let Some((ttype, id)) = r.field_header()? {
            match (id, ttype) {
                (1, STRING) => m.message = r.string()?,
                (2, I32) => m.kind = r.i32()?,
                _ => r.skip(ttype)?,
            }
        }
        r.leave();
        Ok(m)
    }
}

/// Appends Thrift to a buffer.
pub(crate) struct Writer<'a> {
    buf: &'a mut BytesMut,
}

impl<'a> Writer<'a> {
    pub fn new(buf: &'a mut BytesMut) -> Writer<'a> {
        Writer { buf }
    }

    /// The strict envelope: version and type, method name, sequence id.
    pub(crate) fn envelope(&mut self, e: &Envelope<'_>) {
        self.buf.put_u32(VERSION_1 | e.kind as u32);
        self.put_bytes(e.name.as_bytes());
        self.buf.put_i32(e.seq_id);
    }

    /// A struct with one field, `id`: a call's arguments (id 1) or a reply's result (id 0).
    pub(crate) fn single_field_struct(&mut self, id: i16, value: &impl ThriftStruct) {
        self.field_struct(id, value);
        self.stop();
    }

    fn header(&mut self, ttype: u8, id: i16) {
        self.buf.put_u8(ttype);
        self.buf.put_i16(id);
    }

    pub fn stop(&mut self) {
        self.buf.put_u8(STOP);
    }

    fn put_bytes(&mut self, b: &[u8]) {
        // A frame is capped far below 2 GiB, so every length fits an i32.
        self.buf.put_i32(b.len() as i32);
        self.buf.put_slice(b);
    }

    pub(crate) fn field_i64(&mut self, id: i16, v: &(impl Copy + Into<i64>)) {
        self.header(I64, id);
        self.buf.put_i64((*v).into());
    }

    pub(crate) fn field_i32(&mut self, id: i16, v: &i32) {
        self.header(I32, id);
        self.buf.put_i32(*v);
    }

    pub(crate) fn field_double(&mut self, id: i16, v: &f64) {
        self.header(DOUBLE, id);
        self.buf.put_f64(*v);
    }

    pub(crate) fn field_bool(&mut self, id: i16, v: &bool) {
        self.header(BOOL, id);
        self.buf.put_u8(u8::from(*v));
    }

    pub(crate) fn field_string(&mut self, id: i16, v: &str) {
        self.header(STRING, id);
        self.put_bytes(v.as_bytes());
    }

    pub(crate) fn field_binary(&mut self, id: i16, v: &[u8]) {
        self.header(STRING, id);
        self.put_bytes(v);
    }

    pub(crate) fn field_struct(&mut self, id: i16, v: &impl ThriftStruct) {
        self.header(STRUCT, id);
        v.write(self);
    }

    fn list_header(&mut self, id: i16, elem: u8, len: usize) {
        self.header(LIST, id);
        self.buf.put_u8(elem);
        self.buf.put_i32(len as i32);
    }

    pub(crate) fn list_i64(&mut self, id: i16, v: &[impl Copy + Into<i64>]) {
        self.list_header(id, I64, v.len());
        for x in v {
            self.buf.put_i64((*x).into());
        }
    }

    pub(crate) fn list_string(&mut self, id: i16, v: &[String]) {
        self.list_header(id, STRING, v.len());
        for x in v {
            self.put_bytes(x.as_bytes());
        }
    }
}

/// Reads Thrift from one frame. Strings and binaries are slices of the frame, not copies.
pub struct Reader {
    buf: Bytes,
    /// Structs entered and not yet left.
    depth: u32,
}

impl Reader {
    pub fn new(frame: Bytes) -> Reader {
        Reader {
            buf: frame,
            depth: 0,
        }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn need(&self, n: usize, what: &str) -> Result<(), ThriftError> {
        if self.buf.len() < n {
            return err(format!(
                "truncated {what}: {n} bytes needed, {} left in the frame",
                self.buf.len()
            ));
        }
        Ok(())
    }

    /// The envelope, strict (versioned) or the old unversioned form, which Thrift readers
    /// accept by default.
    pub(crate) fn envelope(&mut self) -> Result<Envelope<'static>, ThriftError> {
        self.need(4, "message header")?;
        let first = self.buf.get_u32();
        let (kind, name) = if first & 0x8000_0000 != 0 {
            if first & VERSION_MASK != VERSION_1 {
                return err(format!(
                    "bad protocol version {:#010x}",
                    first & VERSION_MASK
                ));
            }
            let kind = (first & 0xff) as u8;
            (kind, self.string()?)
        } else {
            let name = self.utf8(first as usize, "method name")?;
            self.need(1, "message type")?;
            (self.buf.get_u8(), name)
        };
        let Some(kind) = MessageType::from_u8(kind) else {
            return err(format!("unknown message type {kind}"));
        };
        Ok(Envelope {
            kind,
            name: name.into(),
            seq_id: self.i32()?,
        })
    }

    /// The next field's type and id, or `None` at the struct's end.
    pub(crate) fn field_header(&mut self) -> Result<Option<(u8, i16)>, ThriftError> {
        self.need(1, "field type")?;
        let ttype = self.buf.get_u8();
        if ttype == STOP {
            return Ok(None);
        }
        self.need(2, "field id")?;
        Ok(Some((ttype, self.buf.get_i16())))
    }

    /// Called on entering a struct: bounds the nesting.
    pub(crate) fn enter(&mut self) -> Result<(), ThriftError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return err(format!("structs nested deeper than {MAX_DEPTH}"));
        }
        Ok(())
    }

    pub fn leave(&mut self) {
        self.depth -= 1;
    }

    pub(crate) fn read_struct<T: ThriftStruct>(&mut self) -> Result<T, ThriftError> {
        T::read(self)
    }

    /// A struct holding one wanted field, `id`, of a struct type (a call's arguments, a reply's
    /// result); other fields are skipped. `None` when the field is absent.
    pub(crate) fn single_field_struct<T: ThriftStruct>(
        &mut self,
        id: i16,
    ) -> Result<Option<T>, ThriftError> {
        let mut found = None;
        self.enter()?;
        while let Some((ttype, field)) = self.field_header()? {
            if field == id && ttype == STRUCT {
                found = Some(T::read(self)?);
            } else {
                self.skip(ttype)?;
            }
        }
        self.leave();
        Ok(found)
    }

    pub fn bool(&mut self) -> Result<bool, ThriftError> {
        self.need(1, "bool")?;
        Ok(self.buf.get_u8() != 0)
    }

    pub fn i32(&mut self) -> Result<i32, ThriftError> {
        self.need(4, "i32")?;
        Ok(self.buf.get_i32())
    }

    pub fn i64(&mut self) -> Result<i64, ThriftError> {
        self.need(8, "i64")?;
        Ok(self.buf.get_i64())
    }

    pub(crate) fn double(&mut self) -> Result<f64, ThriftError> {
        self.need(8, "double")?;
        Ok(self.buf.get_f64())
    }

    fn length(&mut self, what: &str) -> Result<usize, ThriftError> {
        let len = self.i32()?;
        if len < 0 {
            return err(format!("negative {what} length {len}"));
        }
        Ok(len as usize)
    }

    pub fn binary(&mut self) -> Result<Bytes, ThriftError> {
        let len = self.length("binary")?;
        self.need(len, "binary")?;
        Ok(self.buf.split_to(len))
    }

    pub fn string(&mut self) -> Result<String, ThriftError> {
        let len = self.length("string")?;
        self.utf8(len, "string")
    }

    fn utf8(&mut self, len: usize, what: &str) -> Result<String, ThriftError> {
        self.need(len, what)?;
        let bytes = self.buf.split_to(len);
        String::from_utf8(bytes.to_vec())
            .map_err(|e| ThriftError::malformed(format!("{what}: {e}")))
    }

    /// A list whose elements must be `elem`, each read by `read`.
    pub(crate) fn list_of<T>(
        &mut self,
        elem: u8,
        mut read: impl FnMut(&mut Reader) -> Result<T, ThriftError>,
    ) -> Result<Vec<T>, ThriftError> {
        let (found, len) = self.collection_header("list")?;
        if found != elem && len > 0 {
            return err(format!(
                "list of type {found} where type {elem} was expected"
            ));
        }
        // The count is only a claim: what is reserved up front is capped by bytes, and further
        // room is paid for by elements actually decoded (a String is 24 bytes in memory for
        // its 4 on the wire).
        let mut items = Vec::with_capacity(len.min(PREALLOCATE / std::mem::size_of::<T>().max(1)));
        for _ in 0..len {
            items.push(read(self)?);
        }
        Ok(items)
    }

    /// Element type and count of a list or set. The count is checked against the bytes left
    /// (every element takes at least its type's smallest encoding), so a lying count is an
    /// error before anything is read.
    fn collection_header(&mut self, what: &str) -> Result<(u8, usize), ThriftError> {
        self.need(1, what)?;
        let elem = self.buf.get_u8();
        let len = self.length(what)?;
        if len.saturating_mul(min_encoded_size(elem)) > self.buf.len() {
            return err(format!(
                "{what} of {len} elements in {} bytes",
                self.buf.len()
            ));
        }
        Ok((elem, len))
    }

    /// Skips one value of type `ttype`: fields this side does not know are passed over, as
    /// Thrift requires. An unknown type tag is an error: nothing after it can be parsed.
    pub fn skip(&mut self, ttype: u8) -> Result<(), ThriftError> {
        let fixed = match ttype {
            BOOL | BYTE => 1,
            I16 => 2,
            I32 => 4,
            I64 | DOUBLE => 8,
            UUID => 16,
            STRING => self.length("string")?,
            STRUCT => {
                self.enter()?;
                while let Some((t, _)) = self.field_header()? {
                    self.skip(t)?;
                }
                self.leave();
                return Ok(());
            }
            MAP => {
                self.need(2, "map header")?;
                let (k, v) = (self.buf.get_u8(), self.buf.get_u8());
                let len = self.length("map")?;
                if len > self.buf.len() {
                    return err(format!("map of {len} entries in {} bytes", self.buf.len()));
                }
                self.enter()?;
                for _ in 0..len {
                    self.skip(k)?;
                    self.skip(v)?;
                }
                self.leave();
                return Ok(());
            }
            SET | LIST => {
                let (elem, len) = self.collection_header("list")?;
                self.enter()?;
                for _ in 0..len {
                    self.skip(elem)?;
                }
                self.leave();
                return Ok(());
            }
            other => return err(format!("unknown type tag {other}")),
        };
        self.need(fixed, "value")?;
        self.buf.advance(fixed);
        Ok(())
    }
}

/// Converts a wire value into a record's field, refusing values the field cannot hold.
pub(crate) trait IntoField<T> {
    fn into_field(self) -> Result<T, ThriftError>;
}

impl<T> IntoField<T> for T {
    fn into_field(self) -> Result<T, ThriftError> {
        Ok(self)
    }
}

impl IntoField<u32> for i64 {
    fn into_field(self) -> Result<u32, ThriftError> {
        u32::try_from(self).map_err(|_| ThriftError {
            message: format!("{self} does not fit a uint32 field"),
            malformed: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A list of strings as it travels: element type, count, then each string.
    fn string_list(items: &[String]) -> Vec<u8> {
        let mut out = vec![STRING];
        out.extend_from_slice(&(items.len() as u32).to_be_bytes());
        for s in items {
            out.extend_from_slice(&(s.len() as u32).to_be_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        out
    }

    proptest! {
        #![proptest_config(crate::fuzz::config())]

        /// Lists whose counts lie: what is reserved is bounded by bytes, not by the claim.
        #[test]
        fn fuzz_string_lists(bytes in crate::fuzz::hostile(
            proptest::collection::vec("[a-z]{0,3}", 0..40).prop_map(|v| string_list(&v))
        )) {
            let len = bytes.len();
            let mut r = Reader::new(Bytes::from(bytes));
            if let Ok(items) = r.list_of(STRING, |r| r.string()) {
                let most = (2 * items.len()).max(PREALLOCATE / std::mem::size_of::<String>());
                prop_assert!(items.capacity() <= most, "{} for {len} bytes", items.capacity());
            }
        }
    }

    /// A count that the bytes left cannot hold (4 bytes per string at least) is an error
    /// before anything is reserved; before, 2²⁰ empty strings claimed in 1 MiB reserved 24 MiB.
    #[test]
    fn a_lying_list_count_is_refused() {
        let mut bytes = string_list(&[]);
        bytes[1..5].copy_from_slice(&(1u32 << 20).to_be_bytes());
        bytes.extend(std::iter::repeat_n(0u8, 1 << 20));
        let err = Reader::new(Bytes::from(bytes))
            .list_of(STRING, |r| r.string())
            .unwrap_err();
        assert!(
            err.malformed && err.message.contains("list of 1048576"),
            "{err}"
        );
    }

    fn encode(v: &impl ThriftStruct) -> Bytes {
        let mut buf = BytesMut::new();
        v.write(&mut Writer::new(&mut buf));
        buf.freeze()
    }

    fn decode<T: ThriftStruct>(b: Bytes) -> Result<T, ThriftError> {
        let mut r = Reader::new(b);
        let v = T::read(&mut r)?;
        assert_eq!(r.remaining(), 0, "every byte read");
        Ok(v)
    }

    fn order() -> pb::Order {
        pb::Order {
            order_id: -7,
            phone: "+86 138 0000 0000".into(),
            name: "Zhang Wěi".into(),
            order_num: "ON-1".into(),
            order_date: "2026-11-30".into(),
            ticket_type: i32::MIN,
            amount: 12.5,
            order_status: 3,
        }
    }

    /// The exact bytes of the specification for a small struct, so the encoding is Thrift's and
    /// not merely self-consistent.
    #[test]
    fn deduct_request_bytes_are_the_specifications() {
        let req = pb::DeductRequest {
            sku: "ab".into(),
            quantity: 5,
        };
        let expected: &[u8] = &[
            STRING, 0, 1, 0, 0, 0, 2, b'a', b'b', // 1: string sku
            I32, 0, 2, 0, 0, 0, 5, // 2: i32 quantity
            STOP,
        ];
        assert_eq!(&encode(&req)[..], expected);
        assert_eq!(
            decode::<pb::DeductRequest>(Bytes::from_static(expected)).unwrap(),
            req
        );

        let mut buf = BytesMut::new();
        Writer::new(&mut buf).envelope(&Envelope {
            kind: MessageType::Call,
            name: "Deduct".into(),
            seq_id: 9,
        });
        let mut head = vec![0x80, 0x01, 0x00, 0x01, 0, 0, 0, 6];
        head.extend_from_slice(b"Deduct");
        head.extend_from_slice(&[0, 0, 0, 9]);
        assert_eq!(&buf[..], &head[..]);
    }

    #[test]
    fn every_record_round_trips() {
        let o = order();
        assert_eq!(decode::<pb::Order>(encode(&o)).unwrap(), o);
        let blob = pb::Blob {
            data: Bytes::from((0..=255u8).collect::<Vec<_>>()),
        };
        assert_eq!(decode::<pb::Blob>(encode(&blob)).unwrap(), blob);
        let wide = crate::workload::Generator::new(crate::workload::Workload::Wide, 1).call(3);
        let crate::rig::Call::EchoWide(wide) = wide else {
            panic!("wide workload makes EchoWide calls")
        };
        assert_eq!(decode::<pb::Wide>(encode(&*wide)).unwrap(), *wide);
        let reply = pb::DeductReply {
            remaining: i64::MAX,
            ok: true,
        };
        assert_eq!(decode::<pb::DeductReply>(encode(&reply)).unwrap(), reply);
        let ex = ApplicationException {
            message: "no".into(),
            kind: app_error::INTERNAL_ERROR,
        };
        assert_eq!(decode::<ApplicationException>(encode(&ex)).unwrap(), ex);
    }

    #[test]
    fn unknown_fields_are_skipped_and_missing_ones_default() {
        let mut buf = BytesMut::new();
        let mut w = Writer::new(&mut buf);
        w.field_i64(1, &42i64); // order_id
        w.field_string(99, "from a newer peer");
        w.list_string(100, &["a".into(), "b".into()]);
        w.field_struct(101, &order());
        w.stop();
        let got = decode::<pb::Order>(buf.freeze()).unwrap();
        assert_eq!(
            got,
            pb::Order {
                order_id: 42,
                ..Default::default()
            }
        );
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let good = encode(&order());
        // Every truncation fails cleanly.
        for cut in 0..good.len() {
            assert!(
                decode::<pb::Order>(good.slice(..cut)).is_err(),
                "cut at {cut}"
            );
        }
        // A string claiming more bytes than the frame holds.
        let lying = Bytes::from_static(&[STRING, 0, 2, 0x7f, 0xff, 0xff, 0xff, b'x']);
        assert!(decode::<pb::Order>(lying)
            .unwrap_err()
            .message
            .contains("truncated"));
        // An unknown type tag.
        let bad_tag = Bytes::from_static(&[0x63, 0, 1, 0, 0]);
        assert!(decode::<pb::Order>(bad_tag)
            .unwrap_err()
            .message
            .contains("type tag"));
        // A list claiming two billion elements.
        let huge = Bytes::from_static(&[LIST, 0, 8, I64, 0x7f, 0, 0, 0]);
        assert!(decode::<pb::Wide>(huge).is_err());
        // A uint32 field given a value it cannot hold.
        let mut buf = BytesMut::new();
        let mut w = Writer::new(&mut buf);
        w.field_i64(10, &-1i64); // version_010 is uint32
        w.stop();
        assert!(decode::<pb::Wide>(buf.freeze())
            .unwrap_err()
            .message
            .contains("uint32"));
        // Structs nested past the bound.
        let mut deep = vec![];
        for _ in 0..100 {
            deep.extend_from_slice(&[STRUCT, 0, 1]);
        }
        deep.extend(std::iter::repeat_n(STOP, 101));
        assert!(decode::<pb::Order>(Bytes::from(deep))
            .unwrap_err()
            .message
            .contains("nested"));
    }

    #[test]
    fn old_style_envelopes_are_read() {
        let mut b = BytesMut::new();
        b.put_i32(4);
        b.put_slice(b"Ping");
        b.put_u8(MessageType::Oneway as u8);
        b.put_i32(-3);
        let e = Reader::new(b.freeze()).envelope().unwrap();
        assert_eq!(
            (e.kind, &*e.name, e.seq_id),
            (MessageType::Oneway, "Ping", -3)
        );
        let bad = Bytes::from_static(&[0x80, 0x02, 0, 1, 0, 0, 0, 0]);
        assert!(Reader::new(bad)
            .envelope()
            .unwrap_err()
            .message
            .contains("version"));
    }

    /// The committed IDL is what build.rs derives from the proto files.
    #[test]
    fn committed_idl_matches_the_protos() {
        let generated = include_str!(concat!(env!("OUT_DIR"), "/rig.thrift"));
        let committed = include_str!("../../../proto/rig.thrift");
        assert!(
            generated == committed,
            "proto/rig.thrift is out of date; copy {}/rig.thrift over it",
            env!("OUT_DIR")
        );
    }
}
