//! Every toxic attribute a client can send is bounded: a value out of bounds is refused with
//! 400 in Toxiproxy's error shape naming the attribute and its range, on create and update
//! alike; and the largest accepted values run traffic without panicking a connection task or
//! cutting a stream short.

use std::time::Duration;

use faultrig::api::client::{request, Client, ClientError};
use http::Method;
use serde_json::{json, Value};
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::util::*;

/// `METHOD path body` against the API at `addr`: the answer, or the error's status and message.
async fn call(addr: &str, method: Method, path: &str, body: Value) -> Result<Value, (u16, String)> {
    request(addr, method, path, Some(&body))
        .await
        .map_err(|e| match e {
            ClientError::Api { status, message } => (status, message),
            other => panic!("{other}"),
        })
}

/// A valid toxic of each type, to update with bad values.
fn valid(kind: &str) -> Value {
    match kind {
        "latency" => json!({"latency": 100, "jitter": 10}),
        "bandwidth" => json!({"rate": 100}),
        "slow_close" => json!({"delay": 10}),
        "timeout" | "reset_peer" => json!({"timeout": 10}),
        "slicer" => json!({"average_size": 100, "size_variation": 10, "delay": 10}),
        "limit_data" => json!({"bytes": 100}),
        "loss" | "syn_loss" => json!({"percent": 1}),
        other => panic!("no valid {other}"),
    }
}

/// Bad attribute values: (type, attributes, the attribute named, the range the message gives).
fn bad_attributes() -> Vec<(&'static str, Value, &'static str, &'static str)> {
    let two_to_63 = 1u64 << 63;
    vec![
        // The slicer: the average a 2^63 (once a negative i64 and a panic), 0 (Toxiproxy
        // recurses without end), missing; a variation above the average (Toxiproxy cuts out
        // of bounds); a delay past a minute.
        (
            "slicer",
            json!({"average_size": two_to_63}),
            "average_size",
            "from 1 to 16777216",
        ),
        (
            "slicer",
            json!({"average_size": 0}),
            "average_size",
            "from 1 to 16777216",
        ),
        ("slicer", json!({"delay": 5}), "average_size", "got null"),
        (
            "slicer",
            json!({"average_size": 10, "size_variation": 11}),
            "size_variation",
            "at most average_size",
        ),
        (
            "slicer",
            json!({"average_size": 10, "delay": 60_000_001}),
            "delay",
            "from 0 to 60000000 (µs)",
        ),
        // Bandwidth: past 800 Gbit/s, negative (Toxiproxy slices out of bounds: a panic). Rate
        // 0 is taken, as Toxiproxy takes it (nothing passes while it is there).
        (
            "bandwidth",
            json!({"rate": 1_000_000_000_000u64}),
            "rate",
            "from 0 to 100000000 (KB/s)",
        ),
        (
            "bandwidth",
            json!({"rate": -1}),
            "rate",
            "from 0 to 100000000",
        ),
        // timeout's hold (ours) is a flag.
        ("timeout", json!({"hold": "yes"}), "hold", "true or false"),
        ("timeout", json!({"hold": 1}), "hold", "true or false"),
        // Latency: a year, negative, a float, a string.
        (
            "latency",
            json!({"latency": 31_536_000_000u64}),
            "latency",
            "from 0 to 3600000 (ms)",
        ),
        (
            "latency",
            json!({"latency": -1}),
            "latency",
            "from 0 to 3600000",
        ),
        ("latency", json!({"latency": 1.5}), "latency", "an integer"),
        (
            "latency",
            json!({"latency": 100.0}),
            "latency",
            "an integer",
        ),
        (
            "latency",
            json!({"latency": "100"}),
            "latency",
            "an integer",
        ),
        (
            "latency",
            json!({"jitter": u64::MAX}),
            "jitter",
            "from 0 to 3600000",
        ),
        // Timers: past a day, past u64 (JSON gives a float), past i64.
        (
            "timeout",
            json!({"timeout": 86_400_001}),
            "timeout",
            "from 0 to 86400000 (ms)",
        ),
        (
            "timeout",
            json!({"timeout": 18_446_744_073_709_551_616f64}),
            "timeout",
            "from 0 to 86400000",
        ),
        (
            "reset_peer",
            json!({"timeout": u64::MAX}),
            "timeout",
            "from 0 to 86400000",
        ),
        (
            "reset_peer",
            json!({"timeout": -5}),
            "timeout",
            "from 0 to 86400000",
        ),
        (
            "slow_close",
            json!({"delay": i64::MAX}),
            "delay",
            "from 0 to 86400000",
        ),
        // limit_data: Toxiproxy's int64 at most, never negative.
        (
            "limit_data",
            json!({"bytes": two_to_63}),
            "bytes",
            "from 0 to 9223372036854775807",
        ),
        (
            "limit_data",
            json!({"bytes": -5}),
            "bytes",
            "from 0 to 9223372036854775807",
        ),
        // Ours: rates out of [0, 100] % or [0, 1].
        ("loss", json!({"percent": 101}), "percent", "from 0 to 100"),
        ("loss", json!({"percent": -1}), "percent", "from 0 to 100"),
        (
            "loss",
            json!({"probability": 1.5}),
            "probability",
            "from 0 to 1",
        ),
        ("loss", json!({"p": 2, "r": 0.5}), "p", "from 0 to 1"),
        (
            "loss",
            json!({"p": 0.1, "r": 0.5, "k": -0.5}),
            "k",
            "from 0 to 1",
        ),
        (
            "syn_loss",
            json!({"percent": 150}),
            "percent",
            "from 0 to 100",
        ),
        (
            "syn_loss",
            json!({"probability": "half"}),
            "probability",
            "from 0 to 1",
        ),
    ]
}

#[tokio::test]
async fn every_out_of_bounds_attribute_is_refused_on_create_and_update() {
    let api = Listening::start(&["proxy", "--api", "127.0.0.1:0"]);
    let a = api.addr.as_str();
    let echo = {
        let (l, addr) = listener().await;
        spawn_echo(l);
        addr.to_string()
    };
    call(
        a,
        Method::POST,
        "/proxies",
        json!({"name": "b", "upstream": echo}),
    )
    .await
    .unwrap();
    for (i, (kind, attributes, attr, range)) in bad_attributes().into_iter().enumerate() {
        let what = format!("{kind} {attributes}");
        let body = json!({"name": format!("bad{i}"), "type": kind, "attributes": attributes});
        let (status, message) = call(a, Method::POST, "/proxies/b/toxics", body)
            .await
            .unwrap_err();
        assert_eq!(status, 400, "create {what}: {message}");
        let names = format!("bad request body: attribute {attr} of a {kind} toxic must be");
        assert!(message.starts_with(&names), "create {what}: {message}");
        assert!(message.contains(range), "create {what}: {message}");

        // A missing attribute is bad only on create: an update keeps the toxic's own.
        if range == "got null" {
            continue;
        }
        // The same values as an update of a valid toxic: refused, and the toxic unchanged.
        let name = format!("good{i}");
        let toxic = json!({"name": name, "type": kind, "attributes": valid(kind)});
        let before = call(a, Method::POST, "/proxies/b/toxics", toxic)
            .await
            .unwrap();
        let path = format!("/proxies/b/toxics/{name}");
        let update = json!({"attributes": attributes});
        let (status, message) = call(a, Method::PATCH, &path, update).await.unwrap_err();
        assert_eq!(status, 400, "update {what}: {message}");
        assert!(
            message.contains(&format!("attribute {attr} ")),
            "update {what}: {message}"
        );
        let after = request(a, Method::GET, &path, None).await.unwrap();
        assert_eq!(after, before, "update {what} changed nothing");
        call(a, Method::DELETE, &path, json!({})).await.unwrap();
    }
    // A partial update is checked against what it merges with: a slicer's size variation over
    // the kept average size.
    call(
        a,
        Method::POST,
        "/proxies/b/toxics",
        json!({"type": "slicer", "attributes": {"average_size": 10}}),
    )
    .await
    .unwrap();
    let (status, message) = call(
        a,
        Method::PATCH,
        "/proxies/b/toxics/slicer_downstream",
        json!({"attributes": {"size_variation": 20}}),
    )
    .await
    .unwrap_err();
    assert_eq!(status, 400);
    assert!(
        message.contains("size_variation") && message.contains("at most average_size"),
        "{message}"
    );

    // Toxicity outside [0, 1] or not a number, on create and update.
    for toxicity in [json!(1.5), json!(-0.1), json!("0.5"), json!(1e300)] {
        for (method, path, body) in [
            (
                Method::POST,
                "/proxies/b/toxics",
                json!({"name": "t", "type": "noop", "toxicity": toxicity}),
            ),
            (
                Method::PATCH,
                "/proxies/b/toxics/slicer_downstream",
                json!({"toxicity": toxicity}),
            ),
        ] {
            let (status, message) = call(a, method.clone(), path, body).await.unwrap_err();
            assert_eq!(status, 400, "{method} toxicity {toxicity}");
            assert!(
                message.starts_with("bad request body: toxicity must be a number in [0, 1]"),
                "{message}"
            );
        }
    }
    // NaN and numbers past f64 are not JSON: refused by the parser, in the same shape.
    for raw in [
        r#"{"type": "noop", "toxicity": NaN}"#,
        r#"{"type": "latency", "attributes": {"latency": 1e400}}"#,
    ] {
        let answer = raw_post(a, "/proxies/b/toxics", raw).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{raw}: {answer}");
        assert!(
            answer.contains(r#""error":"bad request body"#),
            "{raw}: {answer}"
        );
        assert!(answer.contains(r#""status":400"#), "{raw}: {answer}");
    }
    // A profile toxic asking what a byte-stream proxy cannot do (packet-only keys, BBR) is
    // refused by name, not run without it.
    for (toml, key) in [
        (
            "[upstream]\ndelay = \"5ms\"\nreorder = 0.01\n",
            "upstream.reorder",
        ),
        (
            "[downstream]\ncongestion_control = \"bbr\"\n",
            "downstream.congestion_control",
        ),
    ] {
        let body = json!({"type": "profile", "attributes": {"toml": toml}});
        let (status, message) = call(a, Method::POST, "/proxies/b/toxics", body)
            .await
            .unwrap_err();
        assert_eq!(status, 400, "{toml}: {message}");
        assert!(message.contains(key), "{toml}: {message}");
    }
    // Nothing bad was kept: only the one valid latency toxic.
    let toxics = Client::new(a).toxics("b").await.unwrap();
    assert_eq!(toxics.len(), 1, "{toxics:?}");
}

/// What a connection under the largest accepted values must do.
enum Expect {
    /// Every byte echoed back, in order, then the end of the stream.
    Whole,
    /// Every byte echoed back, in order; the end held back (slow_close).
    WholeThenOpen,
    /// Nothing yet, and the connection still open (not reset, not ended): the bytes are held
    /// or delayed, by design, for longer than a test waits.
    Held,
    /// Nothing arrives, and the stream then ends cleanly (no reset): Toxiproxy's timeout
    /// drops the bytes and closes once the other end's FIN reaches it.
    Dropped,
}

/// The largest (and smallest non-trivial) values each bound accepts, on live connections of
/// the real binary: bytes in = bytes out where the toxic does not hold them by design, held
/// connections stay open, and the binary never reports a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extreme_accepted_values_run_traffic_without_a_panic() {
    let dir = tempdir();
    let log_path = dir.path().join("api.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_faultrig"));
    command.args(["proxy", "--api", "127.0.0.1:0"]);
    let api = Listening::spawn_logging(command, std::process::Stdio::from(log));
    let a = api.addr.as_str();
    let (l, echo) = listener().await;
    spawn_echo(l);
    let i64_max = i64::MAX as u64;
    let cases: Vec<(&str, Vec<Value>, Expect)> = vec![
        (
            "fastest bandwidth",
            vec![json!({"type": "bandwidth", "attributes": {"rate": 100_000_000}})],
            Expect::Whole,
        ),
        (
            "slowest useful bandwidth",
            vec![json!({"type": "bandwidth", "stream": "upstream", "attributes": {"rate": 1}})],
            Expect::Held,
        ),
        (
            "largest slices",
            vec![
                json!({"type": "slicer", "attributes": {"average_size": 16 << 20, "size_variation": 16 << 20}}),
            ],
            Expect::Whole,
        ),
        (
            "byte slices, widest variation",
            vec![
                json!({"type": "slicer", "stream": "upstream", "attributes": {"average_size": 1, "size_variation": 1}}),
            ],
            Expect::Whole,
        ),
        (
            "longest slicer delay",
            vec![json!({"type": "slicer", "attributes": {"average_size": 1, "delay": 60_000_000}})],
            Expect::Held,
        ),
        (
            "largest limit",
            vec![json!({"type": "limit_data", "attributes": {"bytes": i64_max}})],
            Expect::Whole,
        ),
        (
            "longest reset_peer",
            vec![json!({"type": "reset_peer", "attributes": {"timeout": 86_400_000}})],
            Expect::Whole,
        ),
        (
            "longest slow_close",
            vec![json!({"type": "slow_close", "attributes": {"delay": 86_400_000}})],
            Expect::WholeThenOpen,
        ),
        (
            "longest timeout",
            vec![json!({"type": "timeout", "attributes": {"timeout": 86_400_000}})],
            Expect::Dropped,
        ),
        (
            "longest held timeout",
            vec![json!({"type": "timeout", "attributes": {"timeout": 86_400_000, "hold": true}})],
            Expect::Held,
        ),
        (
            "bandwidth 0",
            vec![json!({"type": "bandwidth", "attributes": {"rate": 0}})],
            Expect::Held,
        ),
        (
            "longest latency and jitter, stacked",
            vec![
                json!({"type": "latency", "name": "l1", "attributes": {"latency": 3_600_000, "jitter": 3_600_000}}),
                json!({"type": "latency", "name": "l2", "attributes": {"latency": 3_600_000, "jitter": 3_600_000}}),
            ],
            Expect::Held,
        ),
        (
            "every segment lost",
            vec![json!({"type": "loss", "attributes": {"percent": 100}})],
            Expect::Held,
        ),
        (
            "every SYN lost",
            vec![
                json!({"type": "syn_loss", "stream": "upstream", "attributes": {"probability": 1}}),
            ],
            Expect::Held,
        ),
    ];
    const LEN: usize = 256 << 10;
    for (i, (what, toxics, expect)) in cases.into_iter().enumerate() {
        let name = format!("x{i}");
        let p = call(
            a,
            Method::POST,
            "/proxies",
            json!({"name": name, "upstream": echo.to_string()}),
        )
        .await
        .unwrap();
        for t in toxics {
            call(a, Method::POST, &format!("/proxies/{name}/toxics"), t)
                .await
                .unwrap_or_else(|e| panic!("{what}: accepted values refused: {e:?}"));
        }
        let conn = TcpStream::connect(p["listen"].as_str().unwrap())
            .await
            .unwrap();
        let (mut r, w) = conn.into_split();
        let sender = tokio::spawn(send_random(w, i as u64, LEN));
        match expect {
            Expect::Whole => {
                let (got, hash) = tokio::time::timeout(PROMPT, hash_to_eof(r))
                    .await
                    .unwrap_or_else(|_| panic!("{what}: not echoed in time"));
                assert_eq!(
                    (got, hash),
                    (LEN, sender.await.unwrap()),
                    "{what}: every byte, in order"
                );
            }
            Expect::WholeThenOpen => {
                let mut back = vec![0u8; LEN];
                tokio::time::timeout(PROMPT, r.read_exact(&mut back))
                    .await
                    .unwrap_or_else(|_| panic!("{what}: not echoed in time"))
                    .unwrap();
                let sent = sender.await.unwrap();
                let hash: [u8; 32] = sha2::Sha256::digest(&back).into();
                assert_eq!(hash, sent, "{what}: every byte, in order");
                still_open(&mut r, what).await;
            }
            Expect::Held => still_open(&mut r, what).await,
            Expect::Dropped => {
                let (got, _) = tokio::time::timeout(PROMPT, hash_to_eof(r))
                    .await
                    .unwrap_or_else(|_| panic!("{what}: not closed in time"));
                assert_eq!(got, 0, "{what}: nothing comes through");
                sender.await.unwrap();
            }
        }
        // The proxy still serves a connection without toxics.
        call(a, Method::POST, "/reset", json!({})).await.unwrap();
        let mut fresh = TcpStream::connect(p["listen"].as_str().unwrap())
            .await
            .unwrap();
        fresh.write_all(b"ok?").await.unwrap();
        let mut buf = [0u8; 3];
        tokio::time::timeout(PROMPT, fresh.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf, b"ok?", "{what}: the proxy serves on");
    }
    // Every connection task is still alive, and none of them (nor anything else) panicked.
    let metrics = faultrig::api::client::Client::new(a)
        .metrics_text()
        .await
        .unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        metrics.contains("faultrig_proxy_connections_total{proxy=\"x0\"}"),
        "{metrics}"
    );
}

/// Nothing (more) arrives on `r` for a while, and it is neither ended nor reset.
async fn still_open(r: &mut tokio::net::tcp::OwnedReadHalf, what: &str) {
    let mut buf = [0u8; 1];
    match tokio::time::timeout(Duration::from_millis(400), r.read(&mut buf)).await {
        Err(_) => {}
        Ok(Ok(0)) => panic!("{what}: the connection ended"),
        Ok(Ok(_)) => {
            // Held toxics may let a first piece through (a slicer's first slice, a first
            // burst): the connection must still be open after it.
            let mut rest = vec![0u8; 1 << 20];
            match tokio::time::timeout(Duration::from_millis(400), r.read(&mut rest)).await {
                Err(_) | Ok(Ok(1..)) => {}
                Ok(Ok(0)) => panic!("{what}: the connection ended"),
                Ok(Err(e)) => panic!("{what}: {e}"),
            }
        }
        Ok(Err(e)) => panic!("{what}: {e}"),
    }
}
