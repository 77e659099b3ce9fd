//! The control API: driven by the published Toxiproxy clients (the Rust crate here, the Python
//! package through `tests/python/`), every endpoint's error paths, toxics on live connections,
//! and the metrics.

use std::io::{Read, Write};
use std::net::{TcpListener as StdListener, TcpStream as StdStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use faultrig::api::client::{self, request, ClientError};
use faultrig::api::wire::{ProxyJson, ToxicJson, ToxicUpdate};
use faultrig::api::{Registry, RegistryOptions};
use faultrig::fault::Direction;
use faultrig::toxic::{LossAttributes, Rate, ToxicKind};
use http::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::util::*;

/// A blocking echo server on a free loopback port, for the blocking clients.
fn echo_thread() -> String {
    let l = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 65536];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// One 64-byte ping-pong on `s`; its round trip.
fn ping(s: &mut StdStream) -> Duration {
    let start = Instant::now();
    s.write_all(&[7u8; 64]).unwrap();
    let mut buf = [0u8; 64];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(buf, [7u8; 64]);
    start.elapsed()
}

/// The published `toxiproxy_rust` client, unmodified, against `faultrig proxy --api`: the
/// delays it sets are felt on a connection that stays open throughout.
#[test]
fn the_toxiproxy_rust_client_drives_faultrig() {
    use toxiproxy_rust::client::Client;
    use toxiproxy_rust::proxy::ProxyPack;
    let api = Listening::start(&["proxy", "--api", "127.0.0.1:0"]);
    let echo = echo_thread();
    let client = Client::new(api.addr.as_str());
    assert!(client.is_running());
    assert!(client.version().unwrap().contains("faultrig"));
    let created = client
        .populate(vec![ProxyPack::new(
            "echo".into(),
            "127.0.0.1:0".into(),
            echo.clone(),
        )])
        .unwrap();
    assert_eq!(created.len(), 1);
    let proxy = client.find_proxy("echo").unwrap();
    let listen = proxy.proxy_pack.listen.clone();
    assert!(
        !listen.ends_with(":0"),
        "the bound port is reported: {listen}"
    );
    assert!(proxy.proxy_pack.enabled);

    let mut conn = StdStream::connect(&listen).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    assert!(ping(&mut conn) < Duration::from_millis(100));

    // A latency toxic reaches the open connection.
    proxy.with_latency("downstream".into(), 150, 0, 1.0);
    let toxics = proxy.toxics().unwrap();
    assert_eq!(toxics.len(), 1);
    assert_eq!(toxics[0].name, "latency_downstream");
    assert_eq!(toxics[0].attributes["latency"], 150);
    let rtt = ping(&mut conn);
    assert!(rtt >= Duration::from_millis(150), "{rtt:?}");
    assert!(rtt < Duration::from_secs(2), "{rtt:?}");

    // Updated: the crate has no update call, so through ours; same connection.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ours = client::Client::new(&api.addr);
    let latency = ToxicUpdate::of_attributes(json!({"latency": 400}).as_object().unwrap().clone());
    let updated = rt
        .block_on(ours.update_toxic("echo", "latency_downstream", &latency))
        .unwrap();
    assert_eq!(
        updated.kind(),
        Some(ToxicKind::Latency {
            latency_ms: 400,
            jitter_ms: 0
        })
    );
    let rtt = ping(&mut conn);
    assert!(rtt >= Duration::from_millis(400), "{rtt:?}");
    // And through the client: delete all, add a smaller one.
    proxy.delete_all_toxics().unwrap();
    proxy.with_latency("upstream".into(), 50, 0, 1.0);
    let rtt = ping(&mut conn);
    assert!(
        rtt >= Duration::from_millis(50) && rtt < Duration::from_millis(400),
        "{rtt:?}"
    );

    // Our loss toxic (the crate has no helper for it): stalls, counted.
    let loss = ToxicKind::Loss(LossAttributes {
        rate: Rate {
            percent: Some(30.0),
            probability: None,
        },
        ..LossAttributes::default()
    });
    let toxic = ToxicJson::new("loss_upstream", Direction::Upstream, &loss);
    rt.block_on(ours.add_toxic("echo", &toxic)).unwrap();
    for _ in 0..40 {
        ping(&mut conn);
    }
    let metrics = rt.block_on(ours.metrics_text()).unwrap();
    let stalls: u64 = metrics
        .lines()
        .find(|l| {
            l.starts_with("faultrig_proxy_stalls_total{proxy=\"echo\",direction=\"upstream\"}")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap();
    assert!(stalls > 0, "{metrics}");
    assert!(proxy.toxics().unwrap().iter().any(|t| t.r#type == "loss"));

    // Disabled: the listener and the connection close; enabled: served again, same port.
    proxy.disable().unwrap();
    assert!(!client.find_proxy("echo").unwrap().proxy_pack.enabled);
    assert!(StdStream::connect(&listen).is_err(), "listener closed");
    let mut buf = [0u8; 1];
    let _ = conn.write_all(&[1]);
    assert!(
        matches!(conn.read(&mut buf), Ok(0) | Err(_)),
        "open connection closed"
    );
    proxy.enable().unwrap();
    let mut conn = StdStream::connect(&listen).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    assert!(ping(&mut conn) >= Duration::from_millis(50), "toxics kept");

    // Reset: every toxic gone.
    client.reset().unwrap();
    assert!(proxy.toxics().unwrap().is_empty());
    assert!(ping(&mut conn) < Duration::from_millis(50));
    assert!(client.all().unwrap().contains_key("echo"));
    proxy.delete().unwrap();
    assert!(client.find_proxy("echo").is_err());
}

/// An API in this process on a free port; stopped on drop.
pub struct TestApi {
    pub addr: String,
    pub client: client::Client,
    _served: Served,
}

pub async fn start_api() -> TestApi {
    let (l, addr) = listener().await;
    let registry = Arc::new(Registry::new(RegistryOptions {
        seed: 5,
        ..RegistryOptions::default()
    }));
    TestApi {
        addr: addr.to_string(),
        client: client::Client::new(&addr.to_string()),
        _served: Served::spawn(l, |l, stop| faultrig::api::run(l, registry, stop)).unwrap(),
    }
}

impl TestApi {
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, (u16, String)> {
        request(&self.addr, method, path, body.as_ref())
            .await
            .map_err(|e| match e {
                ClientError::Api { status, message } => (status, message),
                other => panic!("{other}"),
            })
    }

    /// Creates proxy `name` in front of `upstream`; returns its bound address.
    pub async fn proxy(&self, name: &str, upstream: &str) -> String {
        let p = ProxyJson::new(name, "127.0.0.1:0", upstream);
        self.client.create(&p).await.unwrap().listen
    }

    /// Adds a toxic as Toxiproxy's clients send it, JSON as they write it.
    pub async fn toxic(&self, proxy: &str, body: Value) -> Value {
        self.call(
            Method::POST,
            &format!("/proxies/{proxy}/toxics"),
            Some(body),
        )
        .await
        .unwrap()
    }

    /// The bytes proxy `proxy` has carried in `direction`.
    async fn bytes(&self, proxy: &str, direction: &str) -> u64 {
        self.metric(&format!(
            "faultrig_proxy_bytes_total{{proxy=\"{proxy}\",direction=\"{direction}\"}}"
        ))
        .await
    }

    async fn metric(&self, line_prefix: &str) -> u64 {
        let text = self.client.metrics_text().await.unwrap();
        text.lines()
            .find(|l| l.starts_with(line_prefix))
            .unwrap_or_else(|| panic!("no {line_prefix} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }
}

#[tokio::test]
async fn every_endpoint_answers_errors_with_toxiproxy_codes() {
    let api = start_api().await;
    let echo = {
        let (l, a) = listener().await;
        spawn_echo(l);
        a.to_string()
    };
    api.proxy("p", &echo).await;
    let cases: Vec<(Method, &str, Option<Value>, u16, &str)> = vec![
        (Method::GET, "/proxies/nope", None, 404, "proxy not found"),
        (
            Method::POST,
            "/proxies/nope",
            Some(json!({})),
            404,
            "proxy not found",
        ),
        (
            Method::PATCH,
            "/proxies/nope",
            Some(json!({})),
            404,
            "proxy not found",
        ),
        (
            Method::DELETE,
            "/proxies/nope",
            None,
            404,
            "proxy not found",
        ),
        (
            Method::GET,
            "/proxies/nope/toxics",
            None,
            404,
            "proxy not found",
        ),
        (
            Method::POST,
            "/proxies/nope/toxics",
            Some(json!({"type": "latency"})),
            404,
            "proxy not found",
        ),
        (
            Method::GET,
            "/proxies/p/toxics/nope",
            None,
            404,
            "toxic not found",
        ),
        (
            Method::PATCH,
            "/proxies/p/toxics/nope",
            Some(json!({})),
            404,
            "toxic not found",
        ),
        (
            Method::DELETE,
            "/proxies/p/toxics/nope",
            None,
            404,
            "toxic not found",
        ),
        (
            Method::POST,
            "/proxies",
            Some(json!({"name": "p", "upstream": echo})),
            409,
            "proxy already exists",
        ),
        (
            Method::POST,
            "/proxies",
            Some(json!({"upstream": echo})),
            400,
            "missing required field: name",
        ),
        (
            Method::POST,
            "/proxies",
            Some(json!({"name": "q"})),
            400,
            "missing required field: upstream",
        ),
        (
            Method::POST,
            "/populate",
            Some(json!([{"name": "q", "upstream": echo}, {"name": "r"}])),
            400,
            "missing required field: upstream at proxy 2",
        ),
        (
            Method::POST,
            "/populate",
            Some(json!({"name": "q"})),
            400,
            "bad request body",
        ),
        (
            Method::POST,
            "/proxies/p/toxics",
            Some(json!({"type": "melt"})),
            400,
            "invalid toxic type",
        ),
        (
            Method::POST,
            "/proxies/p/toxics",
            Some(json!({"type": "latency", "stream": "sideways"})),
            400,
            "stream was invalid",
        ),
        (
            Method::POST,
            "/proxies/p/toxics",
            Some(json!({"type": "latency", "toxicity": 7})),
            400,
            "bad request body",
        ),
        (Method::GET, "/nowhere", None, 404, "no such endpoint"),
        (
            Method::PUT,
            "/proxies",
            Some(json!({})),
            405,
            "method not allowed",
        ),
    ];
    for (method, path, body, status, message) in cases {
        let what = format!("{method} {path}");
        let (s, m) = api.call(method, path, body).await.unwrap_err();
        assert_eq!(s, status, "{what}: {m}");
        assert!(m.starts_with(message), "{what}: {m}");
    }
    assert!(
        api.call(Method::GET, "/proxies", None)
            .await
            .unwrap()
            .get("q")
            .is_none(),
        "a failed populate created nothing"
    );
    // Malformed JSON, by hand: 400 and a JSON error body, never a crash.
    for raw in [
        "{bad",
        "[1,",
        "\u{0}",
        "{\"name\": 5, \"upstream\": \"x:1\"}",
    ] {
        let answer = raw_post(&api.addr, "/proxies", raw).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{raw}: {answer}");
        assert!(answer.contains("\"status\":400"), "{answer}");
    }
    // A body over the limit: 413.
    let big = json!({"name": "x".repeat(2 << 20), "upstream": echo});
    let (s, _) = api
        .call(Method::POST, "/proxies", Some(big))
        .await
        .unwrap_err();
    assert_eq!(s, 413);
    // Duplicate toxic: 409. Default names: TYPE_STREAM.
    let t = api
        .toxic(
            "p",
            json!({"type": "latency", "attributes": {"latency": 1}}),
        )
        .await;
    assert_eq!(t["name"], "latency_downstream");
    let (s, m) = api
        .call(
            Method::POST,
            "/proxies/p/toxics",
            Some(json!({"type": "latency"})),
        )
        .await
        .unwrap_err();
    assert_eq!((s, m.as_str()), (409, "toxic already exists"));
    // The API still answers.
    assert_eq!(
        api.call(Method::GET, "/version", None).await.unwrap()["version"],
        faultrig::api::VERSION
    );
}

/// Bytes under toxics that change mid-stream: none lost, none reordered; the counters and
/// metrics agree with what was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toxics_change_on_live_connections_without_losing_a_byte() {
    let api = start_api().await;
    let (l, echo) = listener().await;
    spawn_echo(l);
    let listen = api.proxy("live", &echo.to_string()).await;
    let conn = tokio::net::TcpStream::connect(&listen).await.unwrap();
    let (r, w) = conn.into_split();
    // The open connection is slowed first (20 MB/s), so the bytes flow for a while...
    api.toxic(
        "live",
        json!({"type": "bandwidth", "stream": "upstream", "attributes": {"rate": 20000}}),
    )
    .await;

    const LEN: usize = 8 << 20;
    let sender = tokio::spawn(send_random(w, 11, LEN));
    let receiver = tokio::spawn(hash_to_eof(r));
    // ...while toxics come, change and go.
    let toxics = [
        json!({"type": "latency", "name": "lat", "attributes": {"latency": 5, "jitter": 5}}),
        // Paced, this direction must keep reading while it writes, or the loss would only meet
        // bytes read after the whole 4 MiB window drained (it did, before the writer yielded).
        json!({"type": "loss", "stream": "upstream", "attributes": {"percent": 5}}),
        json!({"type": "slicer", "attributes": {"average_size": 500, "size_variation": 100, "delay": 10}}),
    ];
    for t in &toxics {
        api.toxic("live", t.clone()).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    api.call(
        Method::PATCH,
        "/proxies/live/toxics/lat",
        Some(json!({"attributes": {"latency": 1}})),
    )
    .await
    .unwrap();
    api.call(Method::POST, "/reset", None).await.unwrap();
    arrives_whole(sender, receiver, LEN).await;
    for direction in ["upstream", "downstream"] {
        assert_eq!(
            api.bytes("live", direction).await,
            LEN as u64,
            "{direction}"
        );
    }
    assert!(
        api.metric("faultrig_proxy_stalls_total{proxy=\"live\",direction=\"upstream\"}")
            .await
            > 0,
        "loss stalled segments"
    );
    assert_eq!(
        api.metric("faultrig_proxy_connections_total{proxy=\"live\"}")
            .await,
        1
    );
}

/// What `sender` wrote (`len` bytes) is what `receiver` read, in order.
async fn arrives_whole(
    sender: tokio::task::JoinHandle<[u8; 32]>,
    receiver: tokio::task::JoinHandle<(usize, [u8; 32])>,
    len: usize,
) {
    let sent = tokio::time::timeout(Duration::from_secs(120), sender)
        .await
        .unwrap()
        .unwrap();
    let (got_len, got) = tokio::time::timeout(Duration::from_secs(120), receiver)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((got_len, got), (len, sent), "every byte, in order");
}

/// A connection opened before any toxic is copied; the first toxic takes it over mid-stream
/// at a chunk boundary. Both directions stream throughout and one is half-closed before the
/// hand-over: every byte arrives, in order, and the FIN already passed stays passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_toxic_takes_over_streaming_connections_without_losing_a_byte() {
    let api = start_api().await;
    let (l, echo) = listener().await;
    spawn_echo(l);
    let listen = api.proxy("over", &echo.to_string()).await;

    // Streaming in both directions (the echo returns what is sent) when the toxics arrive, and
    // the replies not read until then: every buffer on the way is full, so both directions of
    // the proxy are in the middle of a write when the hand-over comes (loopback buffers hold
    // about 40 MiB on this path).
    const LEN: usize = 96 << 20;
    let (r, w) = tokio::net::TcpStream::connect(&listen)
        .await
        .unwrap()
        .into_split();
    let sender = tokio::spawn(send_random(w, 21, LEN));

    // Half-closed before the hand-over: the client is done sending, the reply still flows.
    let mut half = tokio::net::TcpStream::connect(&listen).await.unwrap();
    half.write_all(&[5u8; 1000]).await.unwrap();
    half.shutdown().await.unwrap();
    let mut first = [0u8; 500];
    half.read_exact(&mut first).await.unwrap();

    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !sender.is_finished(),
        "the stream is held up by the unread replies"
    );
    api.toxic(
        "over",
        json!({"type": "latency", "stream": "downstream", "attributes": {"latency": 30}}),
    )
    .await;
    api.toxic(
        "over",
        json!({"type": "slicer", "stream": "upstream", "attributes": {"average_size": 3000, "delay": 1}}),
    )
    .await;
    let receiver = tokio::spawn(hash_to_eof(r));

    arrives_whole(sender, receiver, LEN).await;

    let mut rest = Vec::new();
    tokio::time::timeout(PROMPT, half.read_to_end(&mut rest))
        .await
        .expect("the half-closed connection ends after its reply")
        .unwrap();
    assert_eq!(rest, [5u8; 500], "the reply's rest, then end of stream");
    let total = (LEN + 1000) as u64;
    for direction in ["upstream", "downstream"] {
        let counted = api.bytes("over", direction).await;
        assert_eq!(counted, total, "{direction}: counted once");
    }
}

/// Toxiproxy's toxics charge a new connection nothing: a 100 ms latency toxic on the replies
/// makes the first exchange of a new connection take 100 ms, as through Toxiproxy, not 100 ms
/// more for an emulated handshake. faultrig's own `handshake` toxic adds that round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_pays_the_round_trip_only_under_the_handshake_toxic() {
    let api = start_api().await;
    let (l, echo) = listener().await;
    spawn_echo(l);
    let listen = api.proxy("new", &echo.to_string()).await;
    api.toxic(
        "new",
        json!({"type": "latency", "stream": "downstream", "attributes": {"latency": 100}}),
    )
    .await;
    // The first exchange of a fresh connection, and the next one.
    async fn exchanges(listen: &str) -> (Duration, Duration) {
        async fn once(conn: &mut tokio::net::TcpStream) {
            conn.write_all(&[9u8; 64]).await.unwrap();
            let mut buf = [0u8; 64];
            conn.read_exact(&mut buf).await.unwrap();
        }
        let start = Instant::now();
        let mut conn = tokio::net::TcpStream::connect(listen).await.unwrap();
        once(&mut conn).await;
        let first = start.elapsed();
        let start = Instant::now();
        once(&mut conn).await;
        (first, start.elapsed())
    }
    // Above the delay, and well short of the 200 ms a charged handshake would make it.
    let toxiproxy_like = Duration::from_millis(100)..Duration::from_millis(170);
    let (first, later) = exchanges(&listen).await;
    assert!(toxiproxy_like.contains(&first), "first exchange: {first:?}");
    assert!(toxiproxy_like.contains(&later), "later exchange: {later:?}");

    api.toxic("new", json!({"type": "handshake"})).await;
    let (first, later) = exchanges(&listen).await;
    assert!(
        first >= Duration::from_millis(200),
        "first exchange behind the handshake: {first:?}"
    );
    assert!(toxiproxy_like.contains(&later), "later exchange: {later:?}");
}

/// The connection-level toxics: limit_data closes after its bytes, reset_peer resets, timeout
/// with our `hold` holds bytes (delivered when it goes) and with a limit resets, slow_close
/// delays the FIN. (Toxiproxy's own timeout: the next test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_toxics_break_connections_as_asked() {
    let api = start_api().await;
    let (l, echo) = listener().await;
    spawn_echo(l);
    let listen = api.proxy("c", &echo.to_string()).await;
    async fn connect(addr: &str) -> tokio::net::TcpStream {
        tokio::net::TcpStream::connect(addr).await.unwrap()
    }
    async fn read_all(s: &mut tokio::net::TcpStream) -> (Vec<u8>, bool) {
        let mut got = Vec::new();
        let reset = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
            .await
            .expect("ends")
            .is_err();
        (got, reset)
    }

    // limit_data: 100 bytes come back, then the connection closes.
    api.toxic(
        "c",
        json!({"type": "limit_data", "attributes": {"bytes": 100}}),
    )
    .await;
    let mut s = connect(&listen).await;
    s.write_all(&[1u8; 300]).await.unwrap();
    let (got, _) = read_all(&mut s).await;
    assert_eq!(got, vec![1u8; 100]);
    api.call(
        Method::DELETE,
        "/proxies/c/toxics/limit_data_downstream",
        None,
    )
    .await
    .unwrap();

    // reset_peer: after the first bytes and the timeout, a reset.
    api.toxic(
        "c",
        json!({"type": "reset_peer", "stream": "upstream", "attributes": {"timeout": 100}}),
    )
    .await;
    let mut s = connect(&listen).await;
    let start = Instant::now();
    s.write_all(b"hello").await.unwrap();
    let (_, reset) = read_all(&mut s).await;
    assert!(reset, "reset, not a clean close");
    assert!(start.elapsed() >= Duration::from_millis(100));
    api.call(
        Method::DELETE,
        "/proxies/c/toxics/reset_peer_upstream",
        None,
    )
    .await
    .unwrap();

    // timeout 0, held: bytes held while it lasts, delivered once it goes.
    api.toxic(
        "c",
        json!({"type": "timeout", "attributes": {"timeout": 0, "hold": true}}),
    )
    .await;
    let mut s = connect(&listen).await;
    s.write_all(b"held").await.unwrap();
    let mut buf = [0u8; 4];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut buf))
            .await
            .is_err(),
        "held"
    );
    api.call(Method::DELETE, "/proxies/c/toxics/timeout_downstream", None)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"held");

    // timeout with a limit, held: reset after it.
    api.toxic(
        "c",
        json!({"type": "timeout", "attributes": {"timeout": 200, "hold": true}}),
    )
    .await;
    let mut s = connect(&listen).await;
    let start = Instant::now();
    s.write_all(b"x").await.unwrap();
    let (got, reset) = read_all(&mut s).await;
    assert!(got.is_empty() && reset);
    assert!(start.elapsed() >= Duration::from_millis(200));
    api.call(Method::DELETE, "/proxies/c/toxics/timeout_downstream", None)
        .await
        .unwrap();

    // slow_close: the FIN after the echo arrives late.
    api.toxic(
        "c",
        json!({"type": "slow_close", "attributes": {"delay": 300}}),
    )
    .await;
    let mut s = connect(&listen).await;
    s.write_all(b"bye").await.unwrap();
    s.shutdown().await.unwrap();
    let start = Instant::now();
    let (got, reset) = read_all(&mut s).await;
    assert_eq!((got.as_slice(), reset), (&b"bye"[..], false));
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
}

/// Toxiproxy's `timeout` toxic, by default: what is sent under it is dropped, never to arrive;
/// after `timeout` ms the connection is closed (FIN, not a reset), with 0 it stays open; its
/// removal closes the connection (Toxiproxy's Cleanup closes the stub). Bytes sent before it
/// came arrive, and a connection opened after it went is served whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_toxic_drops_and_closes_as_toxiproxys() {
    let api = start_api().await;
    let (l, echo) = listener().await;
    spawn_echo(l);
    let listen = api.proxy("t", &echo.to_string()).await;
    async fn connect(addr: &str) -> tokio::net::TcpStream {
        tokio::net::TcpStream::connect(addr).await.unwrap()
    }
    /// Everything until the end of the stream; whether it ended with a reset.
    async fn read_all(s: &mut tokio::net::TcpStream) -> (Vec<u8>, bool) {
        let mut got = Vec::new();
        let reset = tokio::time::timeout(PROMPT, s.read_to_end(&mut got))
            .await
            .expect("ends")
            .is_err();
        (got, reset)
    }
    let remove = |stream: &'static str| {
        let api = &api;
        async move {
            let path = format!("/proxies/t/toxics/timeout_{stream}");
            api.call(Method::DELETE, &path, None).await.unwrap();
        }
    };

    for stream in ["downstream", "upstream"] {
        // timeout 0: an open connection, its earlier bytes delivered, later ones dropped; the
        // toxic's removal closes it.
        let mut s = connect(&listen).await;
        exchange(&mut s).await;
        api.toxic(
            "t",
            json!({"type": "timeout", "stream": stream, "attributes": {"timeout": 0}}),
        )
        .await;
        s.write_all(b"lost").await.unwrap();
        let mut buf = [0u8; 4];
        assert!(
            tokio::time::timeout(Duration::from_millis(400), s.read(&mut buf))
                .await
                .is_err(),
            "{stream}: timeout 0 keeps the connection open, and nothing comes through"
        );
        let removed = Instant::now();
        remove(stream).await;
        let (got, reset) = read_all(&mut s).await;
        assert_eq!(
            (got.as_slice(), reset),
            (&b""[..], false),
            "{stream}: the dropped bytes never arrive, and removal closes with FIN"
        );
        assert!(removed.elapsed() < Duration::from_secs(2), "{stream}");

        // timeout 300: closed (FIN) 300 ms after the toxic applied, nothing delivered.
        api.toxic(
            "t",
            json!({"type": "timeout", "stream": stream, "attributes": {"timeout": 300}}),
        )
        .await;
        let start = Instant::now();
        let mut s = connect(&listen).await;
        s.write_all(b"lost").await.unwrap();
        let (got, reset) = read_all(&mut s).await;
        let took = start.elapsed();
        assert_eq!((got.as_slice(), reset), (&b""[..], false), "{stream}");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "{stream}: closed after {took:?}"
        );
        remove(stream).await;

        // Gone: a new connection is served whole.
        let mut s = connect(&listen).await;
        exchange(&mut s).await;
    }

    // Held (ours): bytes sent under it arrive intact, in order, after its removal.
    let mut s = connect(&listen).await;
    api.toxic(
        "t",
        json!({"type": "timeout", "stream": "upstream", "attributes": {"timeout": 0, "hold": true}}),
    )
    .await;
    let toxics = api.client.toxics("t").await.unwrap();
    assert_eq!(
        toxics[0].kind(),
        Some(ToxicKind::Timeout {
            timeout_ms: 0,
            hold: true
        }),
        "{toxics:?}"
    );
    let sent: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let (mut r, mut w) = s.split();
    w.write_all(&sent).await.unwrap();
    let mut buf = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), r.read(&mut buf))
            .await
            .is_err(),
        "held"
    );
    remove("upstream").await;
    let mut back = vec![0u8; sent.len()];
    tokio::time::timeout(PROMPT, r.read_exact(&mut back))
        .await
        .expect("delivered after the removal")
        .unwrap();
    assert!(back == sent, "every held byte, in order");
}

/// The Python client `toxiproxy-python` (PyPI), installed by scripts/test.sh into a virtualenv,
/// runs tests/python/toxiproxy_client.py against `faultrig proxy --api`.
#[test]
fn the_toxiproxy_python_client_drives_faultrig() {
    let python = venv_python();
    let api = Listening::start(&["proxy", "--api", "127.0.0.1:0"]);
    let echo = echo_thread();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/toxiproxy_client.py"
    );
    let mut client = std::process::Command::new(python);
    client.args([script, &api.addr, &echo]);
    let o = output_within(client, COMMAND_DEADLINE);
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("python client: ok"));
}

/// A proxy created with `"engine": "kernel"` carries its connections over real kernel TCP, and
/// its path toxics retune the link under a connection that stays open; toxics that need one
/// connection's bytes, or a per-connection draw, are refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_engine_proxy_follows_its_path_toxics_live() {
    if !privileged("api::a_kernel_engine_proxy_follows_its_path_toxics_live") {
        return;
    }
    let api = start_api().await;
    let (l, echo) = listener().await;
    spawn_echo(l);
    let create = |engine: &str| json!({"name": "k", "upstream": echo.to_string(), "listen": "127.0.0.1:0", "engine": engine});
    let (status, message) = api
        .call(Method::POST, "/proxies", Some(create("link")))
        .await
        .unwrap_err();
    assert_eq!(status, 400);
    assert!(message.contains("engine"), "{message}");
    let p = api
        .call(Method::POST, "/proxies", Some(create("kernel")))
        .await
        .unwrap();
    assert_eq!(p["engine"], "kernel");
    let (status, message) = api
        .call(
            Method::PATCH,
            "/proxies/k",
            Some(json!({"engine": "model"})),
        )
        .await
        .unwrap_err();
    assert_eq!(status, 400);
    assert!(message.contains("cannot change"), "{message}");
    let mut conn = tokio::net::TcpStream::connect(p["listen"].as_str().unwrap())
        .await
        .unwrap();
    async fn median_rtt(conn: &mut tokio::net::TcpStream) -> Duration {
        let mut rtts = Vec::new();
        for _ in 0..5 {
            let start = Instant::now();
            conn.write_all(&[7u8; 64]).await.unwrap();
            let mut buf = [0u8; 64];
            conn.read_exact(&mut buf).await.unwrap();
            assert_eq!(buf, [7u8; 64]);
            rtts.push(start.elapsed());
        }
        rtts.sort();
        rtts[2]
    }
    let clean = median_rtt(&mut conn).await;
    assert!(clean < Duration::from_millis(30), "no toxic yet: {clean:?}");

    // 40 ms on the server's replies: the same connection feels it from the next packet on.
    api.toxic(
        "k",
        json!({"type": "latency", "stream": "downstream", "attributes": {"latency": 40}}),
    )
    .await;
    let slowed = median_rtt(&mut conn).await;
    assert!(
        slowed >= Duration::from_millis(40)
            && slowed < Duration::from_millis(40) + clean * 4 + Duration::from_millis(40),
        "latency 40 ms on the link: {slowed:?} (clean {clean:?})"
    );

    for (body, says) in [
        (
            json!({"type": "slicer", "attributes": {"average_size": 10}}),
            "slicer",
        ),
        (
            json!({"type": "latency", "name": "half", "toxicity": 0.5, "attributes": {"latency": 5}}),
            "toxicity",
        ),
    ] {
        let (status, message) = api
            .call(Method::POST, "/proxies/k/toxics", Some(body))
            .await
            .unwrap_err();
        assert_eq!(status, 400);
        assert!(
            message.contains(says) && message.contains("engine kernel"),
            "{message}"
        );
    }

    api.call(Method::DELETE, "/proxies/k/toxics/latency_downstream", None)
        .await
        .unwrap();
    let again = median_rtt(&mut conn).await;
    assert!(
        again < Duration::from_millis(30),
        "toxic removed: {again:?}"
    );
    api.call(Method::DELETE, "/proxies/k", None).await.unwrap();
}

/// A toxic with attribute `clients` slows only the connections from those addresses: two
/// clients, from 127.0.0.1 and 127.0.0.2, on one proxy; an update moves it live; a bad block
/// is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_toxic_limited_to_some_clients_slows_only_them() {
    let api = start_api().await;
    let (l, echo) = listener().await;
    spawn_echo(l);
    let listen: std::net::SocketAddr = api.proxy("cl", &echo.to_string()).await.parse().unwrap();
    let from = |ip: [u8; 4]| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((ip, 0).into()).unwrap();
        socket.connect(listen).await.unwrap()
    };
    let t = api
        .toxic(
            "cl",
            json!({"type": "latency", "attributes": {"latency": 300, "clients": ["127.0.0.2/32"]}}),
        )
        .await;
    assert_eq!(t["attributes"]["clients"], json!(["127.0.0.2/32"]), "{t}");
    let mut one = from([127, 0, 0, 1]).await;
    let mut two = from([127, 0, 0, 2]).await;
    let slow = Duration::from_millis(300);
    assert!(exchange(&mut one).await < slow / 2, "127.0.0.1 spared");
    assert!(exchange(&mut two).await >= slow, "127.0.0.2 slowed");

    // Moved to 127.0.0.1's block: the same connections swap roles.
    api.call(
        Method::PATCH,
        "/proxies/cl/toxics/latency_downstream",
        Some(json!({"attributes": {"clients": ["127.0.0.0/31"]}})),
    )
    .await
    .unwrap();
    assert!(exchange(&mut one).await >= slow, "127.0.0.1 slowed");
    assert!(exchange(&mut two).await < slow / 2, "127.0.0.2 spared");

    for clients in [
        json!("127.0.0.2/32"),
        json!(["127.0.0.1/8"]),
        json!(["127.0.0.2/33"]),
        json!([7]),
        json!(vec!["::1"; 257]),
    ] {
        let (s, m) = api
            .call(
                Method::POST,
                "/proxies/cl/toxics",
                Some(json!({"type": "noop", "attributes": {"clients": clients}})),
            )
            .await
            .unwrap_err();
        assert_eq!(s, 400, "{clients}");
        assert!(
            m.starts_with("bad request body: attribute clients of a noop toxic"),
            "{m}"
        );
    }
}
