//! The toxic matrix (`tests/toxiproxy/matrix.json`, which says what each check means) through
//! the published `toxiproxy_rust` client, unmodified: each case on its own proxy, all at once,
//! each toxic added with the crate's helper for its type. The crate has none for `reset_peer`
//! and `noop`, nor an update call: those go through our typed client, as the JSON a Toxiproxy
//! client sends. The Python and Node clients check the same cases (tests/python, tests/node).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use faultrig::api::client::Client as Ours;
use faultrig::api::wire::{ToxicJson, ToxicUpdate};
use serde::Deserialize;
use toxiproxy_rust::client::Client;
use toxiproxy_rust::proxy::{Proxy, ProxyPack};

use crate::util::*;

#[derive(Deserialize)]
struct Matrix {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    toxic: ToxicJson,
    expect: Check,
    update: Option<ToxicUpdate>,
    after_update: Option<Check>,
    after_removal: Option<Check>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(tag = "check", rename_all = "snake_case")]
enum Check {
    Exchange {
        min_ms: u64,
        max_ms: u64,
    },
    Transfer {
        bytes: usize,
        min_ms: u64,
        max_ms: u64,
    },
    Limited {
        bytes: usize,
    },
    Reset {
        min_ms: u64,
    },
    Closed {
        min_ms: u64,
        max_ms: u64,
    },
    Ends {
        max_ms: u64,
    },
    Dropped {
        ms: u64,
    },
    SlowClose {
        min_ms: u64,
        max_ms: u64,
    },
}

impl Check {
    /// Whether the connection is gone after it.
    fn ends(self) -> bool {
        matches!(
            self,
            Check::Limited { .. }
                | Check::Reset { .. }
                | Check::Closed { .. }
                | Check::Ends { .. }
                | Check::SlowClose { .. }
        )
    }
}

/// A connection and when its connect began (a toxic's timer starts when the proxy takes it).
struct Conn {
    s: TcpStream,
    opened: Instant,
}

fn open(addr: &str) -> Conn {
    let opened = Instant::now();
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(PROMPT)).unwrap();
    Conn { s, opened }
}

/// Everything until the end of the stream; whether it ended with a reset.
fn read_to_end(s: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, false),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return (got, true),
            Err(e) => panic!("{e}: the stream did not end in time"),
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
}

fn within(what: &str, took: Duration, min_ms: u64, max_ms: u64) {
    let ms = took.as_secs_f64() * 1e3;
    assert!(
        (min_ms as f64..max_ms as f64).contains(&ms),
        "{what}: {ms:.1} ms, expected [{min_ms}, {max_ms})"
    );
}

fn check(c: &mut Conn, want: Check, what: &str) {
    let s = &mut c.s;
    match want {
        Check::Exchange { min_ms, max_ms } => {
            for (round, label) in ["first exchange", "later exchange"].into_iter().enumerate() {
                let sent = pattern(64, round as u8 + 1);
                let start = Instant::now();
                s.write_all(&sent).unwrap();
                let mut back = [0u8; 64];
                s.read_exact(&mut back).unwrap();
                within(&format!("{what}: {label}"), start.elapsed(), min_ms, max_ms);
                assert_eq!(back[..], sent[..], "{what}: the echo came back changed");
            }
        }
        Check::Transfer {
            bytes,
            min_ms,
            max_ms,
        } => {
            let sent = pattern(bytes, 7);
            let start = Instant::now();
            let mut w = s.try_clone().unwrap();
            let writer = {
                let sent = sent.clone();
                std::thread::spawn(move || w.write_all(&sent).unwrap())
            };
            let mut back = vec![0u8; bytes];
            s.read_exact(&mut back)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            within(
                &format!("{what}: transfer"),
                start.elapsed(),
                min_ms,
                max_ms,
            );
            writer.join().unwrap();
            assert!(back == sent, "{what}: bytes lost or changed");
        }
        Check::Limited { bytes } => {
            let sent = pattern(2 * bytes, 3);
            s.write_all(&sent).unwrap();
            let (got, reset) = read_to_end(s);
            assert!(
                got[..] == sent[..bytes],
                "{what}: {} bytes came back",
                got.len()
            );
            assert!(!reset, "{what}: reset, not closed");
        }
        Check::Reset { min_ms } => {
            let start = Instant::now();
            s.write_all(b"hello").unwrap();
            let (_, reset) = read_to_end(s);
            assert!(reset, "{what}: closed, not reset");
            within(&format!("{what}: reset"), start.elapsed(), min_ms, u64::MAX);
        }
        Check::Closed { min_ms, max_ms } => {
            s.write_all(b"lost").unwrap();
            let (got, reset) = read_to_end(s);
            assert_eq!((got.as_slice(), reset), (&b""[..], false), "{what}");
            within(
                &format!("{what}: closed"),
                c.opened.elapsed(),
                min_ms,
                max_ms,
            );
        }
        Check::Ends { max_ms } => {
            s.set_read_timeout(Some(Duration::from_millis(max_ms)))
                .unwrap();
            let (got, reset) = read_to_end(s);
            assert_eq!((got.as_slice(), reset), (&b""[..], false), "{what}");
        }
        Check::Dropped { ms } => {
            s.write_all(b"lost").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(ms))).unwrap();
            let mut buf = [0u8; 64];
            match s.read(&mut buf) {
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                other => panic!("{what}: {other:?}, expected nothing for {ms} ms"),
            }
            s.set_read_timeout(Some(PROMPT)).unwrap();
        }
        Check::SlowClose { min_ms, max_ms } => {
            s.write_all(b"bye").unwrap();
            let start = Instant::now();
            s.shutdown(Shutdown::Write).unwrap();
            let (got, reset) = read_to_end(s);
            assert_eq!((got.as_slice(), reset), (&b"bye"[..], false), "{what}");
            within(&format!("{what}: end"), start.elapsed(), min_ms, max_ms);
        }
    }
}

/// Adds `toxic` with the crate's helper for its type (ours for the two it lacks); its name is
/// the crate's, `TYPE_STREAM`.
fn add(proxy: &Proxy, ours: &Ours, rt: &tokio::runtime::Runtime, toxic: &ToxicJson) -> String {
    let int = |name: &str| {
        toxic
            .attributes
            .get(name)
            .and_then(serde_json::Value::as_u64)
            .map_or(0, |v| u32::try_from(v).unwrap())
    };
    let stream = toxic.stream.clone();
    let p = toxic.toxicity;
    match toxic.kind.as_str() {
        "latency" => drop(proxy.with_latency(stream, int("latency"), int("jitter"), p)),
        "bandwidth" => drop(proxy.with_bandwidth(stream, int("rate"), p)),
        "slow_close" => drop(proxy.with_slow_close(stream, int("delay"), p)),
        "timeout" => drop(proxy.with_timeout(stream, int("timeout"), p)),
        "slicer" => drop(proxy.with_slicer(
            stream,
            int("average_size"),
            int("size_variation"),
            int("delay"),
            p,
        )),
        "limit_data" => drop(proxy.with_limit_data(stream, int("bytes"), p)),
        _ => {
            let mut toxic = toxic.clone();
            toxic.name = format!("{}_{}", toxic.kind, toxic.stream);
            rt.block_on(ours.add_toxic(&proxy.proxy_pack.name, &toxic))
                .unwrap();
        }
    }
    format!("{}_{}", toxic.kind, toxic.stream)
}

fn run(client: &Client, ours: &Ours, echo: &str, case: &Case) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let name = format!("rs-{}", case.name);
    client
        .populate(vec![ProxyPack::new(
            name.clone(),
            "127.0.0.1:0".into(),
            echo.into(),
        )])
        .unwrap();
    let proxy = client.find_proxy(&name).unwrap();
    let listen = proxy.proxy_pack.listen.clone();
    let toxic = add(&proxy, ours, &rt, &case.toxic);
    let mut c = open(&listen);
    check(&mut c, case.expect, &case.name);
    if let (Some(update), Some(after)) = (&case.update, case.after_update) {
        rt.block_on(ours.update_toxic(&name, &toxic, update))
            .unwrap();
        check(&mut c, after, &format!("{} after the update", case.name));
    }
    if let Some(after) = case.after_removal {
        proxy.delete_all_toxics().unwrap();
        if case.expect.ends() {
            c = open(&listen);
        }
        check(&mut c, after, &format!("{} after the removal", case.name));
    }
    drop(c);
    proxy.delete().unwrap();
}

#[test]
fn the_toxic_matrix_holds_through_the_toxiproxy_rust_client() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/toxiproxy/matrix.json"
    ))
    .unwrap();
    let matrix: Matrix = serde_json::from_str(&text).unwrap();
    assert!(matrix.cases.len() >= 8, "every Toxiproxy type has a case");
    let api = Listening::start(&["proxy", "--api", "127.0.0.1:0"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let echo = rt
        .block_on(async {
            let (l, addr) = listener().await;
            spawn_echo(l);
            addr
        })
        .to_string();
    let client = Client::new(api.addr.as_str());
    let ours = Ours::new(&api.addr);
    let start = Instant::now();
    let failures: Vec<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = (matrix.cases.iter())
            .map(|case| {
                let (client, ours, echo) = (&client, &ours, echo.as_str());
                (case, scope.spawn(move || run(client, ours, echo, case)))
            })
            .collect();
        runs.into_iter()
            .filter_map(|(case, run)| {
                run.join().err().map(|e| {
                    let why = (e.downcast_ref::<String>().cloned())
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
                    format!("{}: {}", case.name, why.unwrap_or_default())
                })
            })
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!("{} cases in {:?}", matrix.cases.len(), start.elapsed());
}
