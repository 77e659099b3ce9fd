//! Hardening: servers and the proxy under a small descriptor limit and a flood of connections,
//! slowloris clients against the HTTP/1.1 servers, and the control-API client's own limits.

use std::net::{SocketAddr, TcpStream as StdStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use faultrig::api::client::{request_with, ClientError, Limits};
use faultrig::bench::{self, Mode, Stop};
use faultrig::flavour::{self, Flavour};
use faultrig::service::RigService;
use faultrig::workload::Workload;
use http::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::util::*;

/// The descriptor limit the servers run under, and the connections thrown at them.
const FDS: u32 = 256;
const ATTEMPTS: usize = 1000;

/// `faultrig ARGS` under `ulimit -n 256`, its log in `log`.
fn start_limited(args: &[&str], log: &std::path::Path) -> Listening {
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(format!("ulimit -n {FDS} && exec \"$@\""))
        .arg("bash")
        .arg(env!("CARGO_BIN_EXE_faultrig"))
        .args(args);
    let log = std::fs::File::create(log).unwrap();
    let server = Listening::spawn_logging(command, Stdio::from(log));
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", server.child.id())).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files"));
    assert!(
        line.is_some_and(|l| l.split_whitespace().nth(3) == Some(&FDS.to_string())),
        "the child runs under its own limit: {line:?}"
    );
    server
}

/// Opens [`ATTEMPTS`] connections to `addr` at once and holds them for a second and a half
/// (long enough for the throttled log lines to come out); returns how many the server still
/// held at the end (the others it reset or closed).
fn flood(addr: &str) -> usize {
    let mut held = Vec::new();
    for _ in 0..ATTEMPTS {
        // The kernel completes the handshake before the server accepts, so every connect
        // succeeds; refusals show as resets. A connect that fails counts as refused too.
        if let Ok(s) = StdStream::connect(addr) {
            held.push(s);
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    held.iter()
        .filter(|s| {
            s.set_nonblocking(true).unwrap();
            // Still open: nothing to read yet, or the server's greeting (an HTTP/2 SETTINGS
            // frame). Reset or closed: an error or end of stream.
            match s.peek(&mut [0u8; 1]) {
                Ok(n) => n > 0,
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            }
        })
        .count()
}

/// `faultrig ARGS` under `ulimit -n 256`, flooded with [`ATTEMPTS`] connections: it must stay
/// up, hold some but no more than its descriptors allow, log lines with `logged` at most once a
/// second of the flood (one more for the edges) and at least once, and never panic. Returns the
/// process (killed on drop) and the scratch directory holding its log.
async fn flooded(args: &[&str], logged: &str) -> (Listening, tempfile::TempDir) {
    let scratch = tempdir();
    let log = scratch.path().join("stderr.log");
    let mut child = start_limited(args, &log);
    let started = Instant::now();
    let addr = child.addr.clone();
    let held = tokio::task::spawn_blocking(move || flood(&addr))
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert!(child.child.try_wait().unwrap().is_none(), "{args:?} died");
    assert!(
        0 < held && held < FDS as usize,
        "{args:?}: held {held} of {ATTEMPTS}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("panicked"), "{text}");
    let lines = text.lines().filter(|l| l.contains(logged)).count();
    let bound = elapsed.as_secs() as usize + 2;
    assert!(
        (1..=bound).contains(&lines),
        "{args:?}: {lines} lines with \"{logged}\" in {elapsed:?}:\n{text}"
    );
    (child, scratch)
}

/// A few calls of `flavour` to `addr` on one connection, retried for a while: the server
/// notices the flood's connections closing as its tasks run.
async fn serves_normally(flavour: &'static dyn Flavour, addr: SocketAddr) {
    let spec = crate::flavours::spec(flavour, addr, Mode::Single, Workload::Order);
    let spec = bench::BenchSpec {
        stop: Stop::Calls(5),
        ..spec
    };
    let deadline = Instant::now() + PROMPT;
    loop {
        let out = bench::run(&spec).await;
        if out.ok == 5 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: not serving after the flood: {}",
            flavour.name(),
            out.summary(&spec)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each flavour's server under 256 descriptors and 1000 connections: it holds what its cap
/// allows, resets the rest, logs that at most once a second, stays up and then serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_refuse_what_they_cannot_hold_and_recover() {
    for &flavour in flavour::ALL {
        let (server, _log) = flooded(&["serve", "--flavour", flavour.name()], "refused").await;
        serves_normally(flavour, server.addr.parse().unwrap()).await;
    }
}

/// With a cap above what the descriptors allow, the server runs out of them: it still refuses
/// (with its reserve descriptor), logs that once a second, and recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_out_of_descriptors_refuses_and_recovers() {
    let args = [
        "serve",
        "--flavour",
        "tcp-binary",
        "--max-connections",
        "5000",
    ];
    let (server, _log) = flooded(&args, "out of file descriptors").await;
    let tcp_binary = &flavour::tcp_binary::TcpBinary;
    serves_normally(tcp_binary, server.addr.parse().unwrap()).await;
}

/// The proxy under 256 descriptors (two per connection) and 1000 connections; then a stream
/// through it arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_refuses_what_it_cannot_hold_and_recovers() {
    let (l, upstream) = listener().await;
    let _echo = spawn_echo(l);
    let upstream = upstream.to_string();
    let (proxy, _log) = flooded(&["proxy", "--upstream", &upstream], "refused").await;
    let deadline = Instant::now() + PROMPT;
    loop {
        let through = async {
            let s = tokio::net::TcpStream::connect(&proxy.addr).await?;
            let (r, w) = s.into_split();
            let (sent, received) = tokio::join!(send_random(w, 7, 1 << 20), hash_to_eof(r));
            Ok::<_, std::io::Error>(received == (1 << 20, sent))
        };
        if let Ok(Ok(true)) = tokio::time::timeout(PROMPT, through).await {
            break;
        }
        assert!(Instant::now() < deadline, "no stream through the proxy");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends `GET / HTTP/1.1` one byte a second and returns how long the server kept listening.
async fn slowloris(addr: SocketAddr) -> Duration {
    let started = Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let header = b"GET / HTTP/1.1\r\nHost: slow\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    for &byte in header.iter().cycle() {
        if s.write_all(&[byte]).await.is_err() {
            break;
        }
        let mut buf = [0u8; 512];
        match tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            // An answer (a 408): the server is about to close.
            Ok(Ok(_)) => {}
            Err(_) => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "a slowloris client is still connected after 40 s"
        );
    }
    started.elapsed()
}

/// A client sending its request header one byte a second is cut off after the header-read
/// timeout, by http1-json and by the control API, while a normal client is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_clients_are_cut_off_while_others_are_served() {
    let (l, server) = listener().await;
    let _server = flavour::spawn(
        &flavour::http1_json::Http1Json,
        l,
        Arc::new(RigService::default()),
    )
    .unwrap();
    let (l, api) = listener().await;
    let registry = Arc::new(faultrig::api::Registry::new(Default::default()));
    let _api = Served::spawn(l, |l, stop| faultrig::api::run(l, registry, stop)).unwrap();

    let normal = async {
        let spec = crate::flavours::spec(
            &flavour::http1_json::Http1Json,
            server,
            Mode::PerCall,
            Workload::Order,
        );
        // Calls for as long as the slow clients last.
        let spec = bench::BenchSpec {
            stop: Stop::Duration(faultrig::net::HEADER_READ_TIMEOUT),
            ..spec
        };
        let out = bench::run(&spec).await;
        assert!(
            out.calls > 0 && out.ok == out.calls,
            "{}",
            out.summary(&spec)
        );
    };
    let (to_server, to_api, ()) = tokio::join!(slowloris(server), slowloris(api), normal);
    let timeout = faultrig::net::HEADER_READ_TIMEOUT;
    for (who, lasted) in [("http1-json", to_server), ("control API", to_api)] {
        // Not before the timeout (minus a second of our own polling), and not long after.
        assert!(
            lasted + Duration::from_secs(1) >= timeout && lasted <= timeout * 2,
            "{who}: a slowloris client lasted {lasted:?} (timeout {timeout:?})"
        );
    }
}

/// How a stub API goes on after its first bytes.
#[derive(Clone, Copy)]
enum Tail {
    /// Says nothing more, for 30 s.
    Silence,
    /// A byte a second, for 30 s.
    Trickle,
    /// 64 KiB chunks without end.
    Endless,
}

/// A loopback server that reads each request head, writes `first`, then goes on as `tail`
/// says. Its tasks end with the test's runtime, closing every socket.
async fn stub_api(first: &'static [u8], tail: Tail) -> String {
    let (l, addr) = listener().await;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while !seen.ends_with(b"\r\n\r\n") {
                    match s.read_u8().await {
                        Ok(byte) => seen.push(byte),
                        Err(_) => return,
                    }
                }
                let _ = s.write_all(first).await;
                match tail {
                    Tail::Endless => {
                        let chunk = format!("{:x}\r\n{}\r\n", 64 << 10, " ".repeat(64 << 10));
                        while s.write_all(chunk.as_bytes()).await.is_ok() {}
                    }
                    Tail::Silence | Tail::Trickle => {
                        for _ in 0..30 {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            let trickle = matches!(tail, Tail::Trickle);
                            if trickle && s.write_all(b" ").await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr.to_string()
}

fn short_limits() -> Limits {
    Limits {
        connect: Duration::from_secs(5),
        response: Duration::from_secs(1),
        body: Duration::from_secs(2),
        max_body: 1 << 20,
    }
}

/// The control-API client gives up on an API that never answers, that trickles its answer
/// forever, or whose answer has no end, each within its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_client_gives_up_on_a_stalled_or_endless_answer() {
    let silent = stub_api(b"", Tail::Silence).await;
    let trickle = stub_api(
        b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n{",
        Tail::Trickle,
    )
    .await;
    let endless = stub_api(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        Tail::Endless,
    )
    .await;
    let limits = short_limits();
    let ask = |addr: String| async move {
        let started = Instant::now();
        let result = request_with(&addr, Method::GET, "/proxies", None, &limits).await;
        (result, started.elapsed())
    };
    let (result, took) = ask(silent).await;
    assert!(
        matches!(result, Err(ClientError::TimedOut { what: "answer", .. })),
        "{result:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    let (result, took) = ask(trickle).await;
    assert!(
        matches!(
            result,
            Err(ClientError::TimedOut {
                what: "complete answer",
                ..
            })
        ),
        "{result:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    let (result, took) = ask(endless).await;
    assert!(
        matches!(result, Err(ClientError::TooLarge { limit, .. }) if limit == 1 << 20),
        "{result:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}
