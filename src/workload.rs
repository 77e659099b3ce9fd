//! What each call carries (`order`, `blob:SIZE`, `wide`, `deduct`), generated deterministically
//! from the run seed and the call's index, and how its reply is checked.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::rig::{pb, Call};

/// Smallest and largest blob payloads.
pub(crate) const MIN_BLOB: usize = 128;
pub(crate) const MAX_BLOB: usize = 16 << 20;
/// Blobs up to this size get the call index stamped in (a copy per call), so a reply matched to
/// the wrong call is caught; bigger ones share one buffer, since copying megabytes per call
/// would be measured as latency.
const STAMPED_BLOB: usize = 64 << 10;
/// SKUs the deduct workload spreads its calls over.
const SKUS: u64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Echo the 8-field order record.
    Order,
    /// Echo an opaque payload of this many bytes.
    Blob(usize),
    /// Echo the 500-field record.
    Wide,
    /// Take one unit of stock.
    Deduct,
}

impl Workload {
    /// Parses `order`, `blob:SIZE` (e.g. `blob:16KiB`), `wide` or `deduct`.
    pub fn parse(s: &str) -> Result<Workload, String> {
        match s {
            "order" => return Ok(Workload::Order),
            "wide" => return Ok(Workload::Wide),
            "deduct" => return Ok(Workload::Deduct),
            _ => {}
        }
        let Some(size) = s.strip_prefix("blob:") else {
            return Err(format!(
                "unknown workload \"{s}\" (use order, blob:SIZE, wide or deduct)"
            ));
        };
        let size = crate::units::parse_size(size)? as usize;
        if !(MIN_BLOB..=MAX_BLOB).contains(&size) {
            return Err(format!("blob size {size} B is outside 128B..=16MiB"));
        }
        Ok(Workload::Blob(size))
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Workload::Order => write!(f, "order"),
            Workload::Wide => write!(f, "wide"),
            Workload::Deduct => write!(f, "deduct"),
            Workload::Blob(n) if n % (1 << 20) == 0 => write!(f, "blob:{}MiB", n >> 20),
            Workload::Blob(n) if n % (1 << 10) == 0 => write!(f, "blob:{}KiB", n >> 10),
            Workload::Blob(n) => write!(f, "blob:{n}B"),
        }
    }
}

/// Makes the calls of one cell and checks their replies.
#[derive(Clone, Debug)]
pub struct Generator {
    workload: Workload,
    seed: u64,
    /// Random payload, made once (blob workload).
    blob: Bytes,
    /// The wide record, made once; each call stamps its index into it.
    wide: Option<Box<pb::Wide>>,
}

impl Generator {
    pub fn new(workload: Workload, seed: u64) -> Generator {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let blob = match workload {
            Workload::Blob(n) => {
                let mut b = vec![0u8; n];
                rng.fill_bytes(&mut b);
                Bytes::from(b)
            }
            _ => Bytes::new(),
        };
        let wide = (workload == Workload::Wide).then(|| Box::new(wide_record(&mut rng)));
        Generator {
            workload,
            seed,
            blob,
            wide,
        }
    }

    /// The request of call number `index`.
    pub fn call(&self, index: u64) -> Call {
        match self.workload {
            Workload::Order => Call::EchoOrder(order(self.seed, index)),
            Workload::Blob(n) if n <= STAMPED_BLOB => {
                let mut b = BytesMut::with_capacity(n);
                b.put_u64(index);
                b.put_slice(&self.blob[8..]);
                Call::EchoBlob(pb::Blob { data: b.freeze() })
            }
            Workload::Blob(_) => Call::EchoBlob(pb::Blob {
                data: self.blob.clone(),
            }),
            Workload::Wide => {
                let mut w = self.wide.clone().expect("made for the wide workload");
                w.id_001 = index as i64;
                Call::EchoWide(w)
            }
            Workload::Deduct => Call::Deduct(pb::DeductRequest {
                sku: format!("sku-{}", index % SKUS),
                quantity: 1,
            }),
        }
    }

    /// Protobuf size of one request: the payload, whatever the flavour wraps it in.
    pub fn payload_bytes(&self) -> usize {
        self.call(0).protobuf_len()
    }
}

const NAMES: [&str; 8] = [
    "Ada Lovelace",
    "Grace Hopper",
    "Alan Turing",
    "Edsger Dijkstra",
    "Barbara Liskov",
    "Ken Thompson",
    "Frances Allen",
    "Donald Knuth",
];

// Built digit by digit rather than with `format!`: a load driver makes one per call, and the
// formatting machinery was half of the 217 ns a call took to make (now about 70 ns).
fn order(seed: u64, index: u64) -> pb::Order {
    let mix = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ index;
    let mut phone = String::with_capacity(16);
    phone.push_str("+86 138");
    push_decimal(&mut phone, mix % 100_000_000, 8);
    let mut order_num = String::with_capacity(36);
    order_num.push_str("ORD-");
    push_hex(&mut order_num, seed);
    order_num.push('-');
    push_decimal(&mut order_num, index, 10);
    let mut order_date = String::with_capacity(10);
    order_date.push_str("2026-");
    push_decimal(&mut order_date, 1 + index % 12, 2);
    order_date.push('-');
    push_decimal(&mut order_date, 1 + index % 28, 2);
    pb::Order {
        order_id: index as i64,
        phone,
        name: NAMES[(mix % NAMES.len() as u64) as usize].to_string(),
        order_num,
        order_date,
        ticket_type: (index % 4) as i32,
        amount: 10.0 + (mix % 100_000) as f64 / 100.0,
        order_status: (index % 3) as i32,
    }
}

/// Appends `n` in decimal, zero-padded to `width` digits (as `{n:0width$}` does).
fn push_decimal(s: &mut String, mut n: u64, width: usize) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let written = digits.len() - start;
    s.extend(std::iter::repeat_n('0', width.saturating_sub(written)));
    s.extend(digits[start..].iter().map(|&d| d as char));
}

/// Appends `n` in lower-case hexadecimal (as `{n:x}` does).
fn push_hex(s: &mut String, n: u64) {
    let digits = if n == 0 {
        1
    } else {
        16 - n.leading_zeros() as usize / 4
    };
    for i in (0..digits).rev() {
        s.push(char::from_digit(((n >> (4 * i)) & 0xf) as u32, 16).expect("a nibble"));
    }
}

/// Field shapes of `Wide`, in field-number order, cycling. Must match
/// `scripts/gen-wide-proto.py` (a test checks every field decodes into a known field).
#[derive(Clone, Copy)]
enum Shape {
    Int64,
    Text,
    Double,
    Int32,
    Flag,
    Code,
    Item,
    Ids,
    Tags,
    Version,
}

const SHAPES: [Shape; 10] = [
    Shape::Int64,
    Shape::Text,
    Shape::Double,
    Shape::Int32,
    Shape::Flag,
    Shape::Code,
    Shape::Item,
    Shape::Ids,
    Shape::Tags,
    Shape::Version,
];
const WIDE_FIELDS: u32 = 500;

/// A `Wide` with every one of its 500 fields set, built by encoding each field number with the
/// shape the generator script gave it and decoding the result: no 500-line constructor.
fn wide_record(rng: &mut ChaCha8Rng) -> pb::Wide {
    use prost::encoding as enc;
    let mut buf = Vec::new();
    for tag in 1..=WIDE_FIELDS {
        let word = |rng: &mut ChaCha8Rng| format!("v{:x}", rng.random::<u32>());
        match SHAPES[((tag - 1) % SHAPES.len() as u32) as usize] {
            Shape::Int64 => enc::int64::encode(tag, &rng.random_range(1..i64::MAX), &mut buf),
            Shape::Text | Shape::Code => enc::string::encode(tag, &word(rng), &mut buf),
            Shape::Double => enc::double::encode(tag, &rng.random_range(0.5..1e6), &mut buf),
            Shape::Int32 => enc::int32::encode(tag, &rng.random_range(1..i32::MAX), &mut buf),
            Shape::Flag => enc::bool::encode(tag, &true, &mut buf),
            Shape::Item => {
                let item = pb::WideItem {
                    id: rng.random_range(1..i64::MAX),
                    label: word(rng),
                    value: rng.random_range(0.5..1e3),
                };
                enc::message::encode(tag, &item, &mut buf);
            }
            Shape::Ids => {
                let ids: Vec<i64> = (0..4).map(|_| rng.random_range(1..i64::MAX)).collect();
                enc::int64::encode_packed(tag, &ids, &mut buf);
            }
            Shape::Tags => {
                let tags: Vec<String> = (0..3).map(|_| word(rng)).collect();
                enc::string::encode_repeated(tag, &tags, &mut buf);
            }
            Shape::Version => enc::uint32::encode(tag, &rng.random_range(1..u32::MAX), &mut buf),
        }
    }
    let wide = pb::Wide::decode(buf.as_slice()).expect("encoded from the schema's own shapes");
    debug_assert_eq!(wide.encoded_len(), buf.len());
    wide
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rig::Reply;

    /// The digit helpers write what `format!` would, so a run's calls are the ones every earlier
    /// version sent for the same seed.
    #[test]
    fn orders_are_spelled_as_format_spells_them() {
        for n in [0, 1, 9, 10, 255, 99_999_999, 1 << 40, u64::MAX] {
            for width in [0, 2, 8, 10, 25] {
                let mut s = String::new();
                push_decimal(&mut s, n, width);
                assert_eq!(s, format!("{n:0width$}"));
            }
            let mut s = String::new();
            push_hex(&mut s, n);
            assert_eq!(s, format!("{n:x}"));
        }
        for seed in [0, 3, 0xdead_beef, u64::MAX] {
            for index in [0, 1, 11, 27, 12_345_678_901] {
                let o = order(seed, index);
                let mix = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ index;
                assert_eq!(o.phone, format!("+86 138{:08}", mix % 100_000_000));
                assert_eq!(o.order_num, format!("ORD-{seed:x}-{index:010}"));
                let date = format!("2026-{:02}-{:02}", 1 + index % 12, 1 + index % 28);
                assert_eq!(o.order_date, date);
            }
        }
    }

    #[test]
    fn parse_and_display_round_trip() {
        for s in [
            "order",
            "wide",
            "deduct",
            "blob:128B",
            "blob:1KiB",
            "blob:16KiB",
            "blob:1MiB",
            "blob:16MiB",
        ] {
            assert_eq!(Workload::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(Workload::parse("blob:1024").unwrap(), Workload::Blob(1024));
        assert!(Workload::parse("blob:64B").unwrap_err().contains("outside"));
        assert!(Workload::parse("blob:32MiB").is_err());
        assert!(Workload::parse("orders")
            .unwrap_err()
            .contains("unknown workload"));
    }

    #[test]
    fn every_wide_field_is_set_with_its_schema_type() {
        let g = Generator::new(Workload::Wide, 1);
        let Call::EchoWide(w) = g.call(7) else {
            panic!()
        };
        // Re-encoding loses nothing: every generated field landed in a known field.
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut buf = Vec::new();
        wide_record(&mut rng).encode(&mut buf).unwrap();
        assert_eq!(
            pb::Wide::decode(buf.as_slice()).unwrap().encoded_len(),
            buf.len()
        );
        assert_eq!(w.id_001, 7);
        assert!(!w.text_002.is_empty() && w.flag_005 && w.item_007.is_some());
        assert_eq!(w.tags_499.len(), 3);
        assert!(w.version_500 > 0);
        assert!(g.payload_bytes() > 5000, "{}", g.payload_bytes());
    }

    #[test]
    fn calls_are_deterministic_and_distinct() {
        for w in [
            Workload::Order,
            Workload::Blob(1024),
            Workload::Blob(1 << 20),
            Workload::Wide,
            Workload::Deduct,
        ] {
            let a = Generator::new(w, 5);
            let b = Generator::new(w, 5);
            assert_eq!(a.call(3), b.call(3), "{w}");
            if w != Workload::Deduct {
                // (deduct spreads calls over SKUs by index alone)
                assert_ne!(Generator::new(w, 6).call(3), a.call(3), "{w}: seed matters");
            }
        }
        let g = Generator::new(Workload::Blob(1024), 5);
        assert_ne!(g.call(1), g.call(2), "small blobs carry their index");
        assert_eq!(g.payload_bytes(), 1024 + 3);
    }

    #[test]
    fn check_catches_wrong_echoes_and_inconsistent_deducts() {
        let g = Generator::new(Workload::Order, 1);
        let (call, other) = (g.call(1), g.call(2));
        let Call::EchoOrder(o) = other else { panic!() };
        assert!(crate::flavour::check(&call, &Reply::EchoOrder(o)).is_err());
        let Call::EchoOrder(same) = call.clone() else {
            panic!()
        };
        assert!(crate::flavour::check(&call, &Reply::EchoOrder(same)).is_ok());
        let d = Generator::new(Workload::Deduct, 1).call(0);
        let reply = |remaining, ok| Reply::Deduct(pb::DeductReply { remaining, ok });
        assert!(crate::flavour::check(&d, &reply(5, true)).is_ok());
        assert!(crate::flavour::check(&d, &reply(0, false)).is_ok());
        assert!(crate::flavour::check(&d, &reply(5, false)).is_err());
        assert!(crate::flavour::check(&d, &reply(-1, true)).is_err());
    }
}
