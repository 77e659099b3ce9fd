//! Property tests ("fuzzing" on stable Rust) of every decoder a peer or a file can reach: the
//! shared helpers, and the tests of the public decoders. The flavours' private frame decoders
//! are fuzzed in their own modules with these helpers.
//!
//! Inputs are arbitrary bytes and, since random bytes rarely get past a header, valid
//! encodings mutated: bytes flipped, removed or inserted, the input cut short, and lengths that
//! lie. The property is always the same: no panic, and a value or a clean error; where a memory
//! budget applies, the test asserts it.
//!
//! Cases per decoder: `FAULTRIG_FUZZ_CASES` (default 10 000); every run draws new seeds.
//! `scripts/fuzz.sh DURATION` repeats the runs until the time is up.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::Config;

use crate::rig::{Call, Operation};
use crate::workload::{Generator, Workload};

/// Cases each decoder's test runs.
pub fn cases() -> u32 {
    std::env::var("FAULTRIG_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// The runner's configuration: [`cases`] cases, no regression files written into the source
/// tree (a failure found is kept as a named regression test instead).
pub fn config() -> Config {
    Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    }
}

/// One change to a valid encoding.
#[derive(Clone, Debug)]
pub(crate) enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
    /// A big-endian u32 written over four bytes: a length or count that lies.
    Lie(usize, u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let lie = prop_oneof![
        Just(0u32),
        Just(u32::MAX),
        Just(0x7fff_ffff),
        Just(0x8000_0000),
        Just(64 << 20),
        0..300u32,
        any::<u32>(),
    ];
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(i, x)| Mutation::Flip(i, x)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), vec(any::<u8>(), 1..8)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), 1..16usize).prop_map(|(i, n)| Mutation::Remove(i, n)),
        (any::<usize>(), lie).prop_map(|(i, v)| Mutation::Lie(i, v)),
    ]
}

/// Applies `m` to `bytes`; positions wrap around the input's length.
pub(crate) fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
    match m {
        Mutation::Flip(i, x) if !bytes.is_empty() => {
            let i = at(*i, bytes.len());
            bytes[i] ^= x;
        }
        Mutation::Truncate(i) => bytes.truncate(at(*i, bytes.len() + 1)),
        Mutation::Insert(i, b) => {
            let i = at(*i, bytes.len() + 1);
            bytes.splice(i..i, b.iter().copied());
        }
        Mutation::Remove(i, n) if !bytes.is_empty() => {
            let i = at(*i, bytes.len());
            let end = (i + n).min(bytes.len());
            bytes.drain(i..end);
        }
        Mutation::Lie(i, v) if bytes.len() >= 4 => {
            let i = at(*i, bytes.len() - 3);
            bytes[i..i + 4].copy_from_slice(&v.to_be_bytes());
        }
        _ => {}
    }
}

/// A valid input with up to four mutations.
pub(crate) fn mutated(valid: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (valid, vec(mutation(), 0..5)).prop_map(|(mut bytes, ms)| {
        for m in &ms {
            apply(&mut bytes, m);
        }
        bytes
    })
}

/// Arbitrary bytes, or (three times as often) a mutated valid input.
pub(crate) fn hostile(valid: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![1 => vec(any::<u8>(), 0..512), 3 => mutated(valid)]
}

/// Text that is mostly valid: mutated bytes read as UTF-8 (invalid sequences replaced).
pub(crate) fn hostile_text(valid: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    hostile(valid.prop_map(String::into_bytes))
        .prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// A valid call of any operation, as a workload generates it (`blob` 128 B to 4 KiB).
pub fn call() -> impl Strategy<Value = Call> {
    let workload = prop_oneof![
        Just("order".to_string()),
        (128..4096usize).prop_map(|n| format!("blob:{n}B")),
        Just("wide".to_string()),
        Just("deduct".to_string()),
    ];
    (workload, any::<u64>(), 0..64u64).prop_map(|(w, seed, index)| {
        let w = Workload::parse(&w).expect("valid workload");
        Generator::new(w, seed).call(index)
    })
}

/// An operation, for decoders told which one to expect.
pub fn operation() -> impl Strategy<Value = Operation> {
    proptest::sample::select(Operation::ALL.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ProxySpec;
    use crate::experiment::ExperimentFile;
    use crate::profile::Profile;
    use crate::results;
    use crate::rig::Reply;

    /// Bytes a decoder may hold per input byte, and a constant: where a test measures a
    /// decoded value's size, it must stay within `AMPLIFY · N + SLACK`.
    const AMPLIFY: usize = 4;
    const SLACK: usize = 64 << 10;

    /// What a decoded call holds on the heap, roughly: its strings and byte fields.
    fn heap_size(call: &Call) -> usize {
        match call {
            Call::EchoOrder(m) => {
                m.phone.capacity()
                    + m.name.capacity()
                    + m.order_num.capacity()
                    + m.order_date.capacity()
            }
            Call::EchoBlob(m) => m.data.len(),
            // 500 fields: their encoded size stands for their strings.
            Call::EchoWide(m) => std::mem::size_of_val(&**m) + call.protobuf_len(),
            Call::Deduct(m) => m.sku.capacity(),
        }
    }

    proptest! {
        #![proptest_config(config())]

        /// Both JSON flavours (http1-json, http2-json) decode bodies with these, on both sides.
        #[test]
        fn http_json_bodies(op in operation(), body in hostile(call().prop_map(|c| c.encode_json()))) {
            if let Ok(call) = Call::decode_json(op, &body) {
                prop_assert!(heap_size(&call) <= AMPLIFY * body.len() + SLACK);
            }
            let _ = Reply::decode_json(op, &body);
        }

        /// tcp-binary and grpc bodies.
        #[test]
        fn protobuf_bodies(op in operation(), body in hostile(call().prop_map(|c| c.encode_protobuf()))) {
            if let Ok(call) = Call::decode_protobuf(op, &body) {
                prop_assert!(heap_size(&call) <= AMPLIFY * body.len() + SLACK);
            }
            let _ = Reply::decode_protobuf(op, &body);
        }

        /// The control API's bodies: a proxy, a list of proxies (populate), a toxic.
        #[test]
        fn control_api_bodies(body in hostile_text(api_body())) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else {
                return Ok(());
            };
            let _ = ProxySpec::from_json(v.clone(), None);
            if let Some(list) = v.as_array() {
                for (i, p) in list.iter().enumerate() {
                    let _ = ProxySpec::from_json(p.clone(), Some(i));
                }
            }
            let _ = crate::api::parse_body::<crate::api::wire::ProxyUpdate>(v.clone());
            let request = crate::api::parse_body::<crate::api::wire::ToxicRequest>(v.clone());
            if let Ok(toxic) = request.and_then(|r| crate::api::toxics::ToxicEntry::create(&r, 1)) {
                if let Ok(update) = crate::api::parse_body(v) {
                    let _ = toxic.update(&update, 2);
                }
                let _ = toxic.to_wire();
            }
        }

        #[test]
        fn profile_toml(src in hostile_text(toml_file("profiles", &PROFILES))) {
            if let Ok(p) = Profile::parse(&src, "fuzz.toml", "fuzz") {
                let _ = p.check_model_engine("fuzz.toml");
            }
        }

        #[test]
        fn experiment_toml(src in hostile_text(toml_file("scripts", &EXPERIMENTS))) {
            if let Ok(file) = ExperimentFile::parse(&src, "fuzz.toml") {
                if let Ok(e) = file.validate("fuzz.toml") {
                    let _ = e.cells();
                }
            }
        }

        /// What an external flavour's client prints (any program's standard output), line by
        /// line into a tally, as the runner reads it; and its command lines.
        #[test]
        fn external_client_output(text in hostile_text(Just(
            "# warm\n12 ok\nbegin\n4000000 timeout\n99 reset\nconns 18446744073709551615\n".to_string()
        ))) {
            let mut tally = crate::external::Tally::default();
            for line in text.lines() {
                if let Ok(l) = crate::external::Line::parse(line) {
                    tally.add(l);
                }
            }
            let _ = tally.calls();
            if let Ok(t) = crate::external::CommandLine::parse(&text, &crate::external::Placeholder::ALL) {
                let _ = t.fill(|p| p.name().to_string());
            }
        }

        /// `report`'s input: rows of a results CSV, their `hdr` fields included.
        #[test]
        fn results_csv(text in hostile_text(results_csv_text())) {
            if let Ok(rows) = results::read_from(text.as_bytes(), "fuzz.csv") {
                for row in rows {
                    let _ = row.histogram();
                }
            }
        }

        /// The `hdr` field alone, mutated below its base64 (the deflated bytes and the
        /// histogram's header, where the sizes are).
        #[test]
        fn hdr_fields(bytes in hostile(histogram_bytes())) {
            use base64::Engine;
            let text = base64::engine::general_purpose::STANDARD.encode(&bytes);
            if let Ok(h) = results::decode_histogram(&text) {
                // Bounded by the header checks, whatever the input claimed.
                prop_assert!(h.distinct_values() <= results::HDR_MAX_COUNTS);
            }
        }
    }

    fn api_body() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(r#"{"name":"a","listen":"127.0.0.1:0","upstream":"127.0.0.1:9","enabled":true}"#.to_string()),
            Just(r#"[{"name":"a","listen":"127.0.0.1:0","upstream":"127.0.0.1:9"},{"name":"b","listen":"127.0.0.1:0","upstream":"127.0.0.1:9","profile":"lan"}]"#.to_string()),
            Just(r#"{"name":"l","type":"latency","stream":"downstream","toxicity":0.5,"attributes":{"latency":100,"jitter":10}}"#.to_string()),
            Just(r#"{"type":"slicer","attributes":{"average_size":1,"size_variation":0,"delay":10}}"#.to_string()),
            Just(r#"{"type":"bandwidth","stream":"upstream","attributes":{"rate":100}}"#.to_string()),
            Just(r#"{"type":"limit_data","attributes":{"bytes":1000}}"#.to_string()),
            Just(r#"{"type":"profile","attributes":{"profile":"wan"}}"#.to_string()),
        ]
    }

    const PROFILES: [&str; 6] = [
        "lan",
        "wan",
        "bursty",
        "lossy-10ms-1pct",
        "longhaul",
        "lan-wifi",
    ];
    const EXPERIMENTS: [&str; 6] = [
        "lan-compare",
        "concurrency-sweep",
        "payload-sweep",
        "backend",
        "nagle",
        "external-echo",
    ];

    /// One of the repository's own TOML files, `dir/NAME.toml`.
    fn toml_file(dir: &'static str, names: &[&'static str]) -> impl Strategy<Value = String> {
        proptest::sample::select(names.to_vec()).prop_map(move |name| {
            let path = format!("{}/{dir}/{name}.toml", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        })
    }

    fn histogram_bytes() -> impl Strategy<Value = Vec<u8>> {
        vec(1..10_000_000u64, 0..50).prop_map(|values| {
            use base64::Engine;
            let mut h = results::new_histogram();
            for v in values {
                h.record(v).expect("in range");
            }
            base64::engine::general_purpose::STANDARD
                .decode(results::encode_histogram(&h))
                .expect("base64")
        })
    }

    fn results_csv_text() -> impl Strategy<Value = String> {
        histogram_bytes().prop_map(|bytes| {
            use base64::Engine;
            let mut row = results::Row {
                flavour: "grpc".into(),
                ..results::Row::default()
            };
            row.hdr = base64::engine::general_purpose::STANDARD.encode(bytes);
            let mut text = Vec::new();
            {
                let mut w = csv::Writer::from_writer(&mut text);
                w.write_record(results::COLUMNS).expect("to memory");
                w.serialize(&row).expect("to memory");
            }
            String::from_utf8(text).expect("CSV of UTF-8")
        })
    }
}
