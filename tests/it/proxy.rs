//! The real proxy on loopback: byte-exact transfers, half-close, resets, unreachable and dying
//! upstreams, back-pressure and counters.

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use faultrig::link::Engine;
use faultrig::proxy::ProxyOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::util::*;

const BULK: usize = 64 << 20;

/// 64 MiB of random bytes each way at once, hashed at both ends. The client half-closes after
/// sending while still receiving, so this also checks that FIN follows all the data.
pub(crate) async fn bulk_both_ways(profile: &str, engine: Engine) {
    let (l, server_addr) = listener().await;
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let (r, w) = s.into_split();
        let (received, sent) = tokio::join!(hash_to_eof(r), send_random(w, 2, BULK));
        (received, sent)
    });
    let proxy = TestProxy::start_engine(server_addr, profile, engine).await;
    let client = async {
        let s = TcpStream::connect(proxy.addr).await.unwrap();
        let (r, w) = s.into_split();
        tokio::join!(send_random(w, 1, BULK), hash_to_eof(r))
    };
    let ((sent_up, received_down), server) = timeout(Duration::from_secs(180), async {
        let c = client.await;
        (c, server.await.unwrap())
    })
    .await
    .unwrap_or_else(|_| panic!("{profile}: 64 MiB each way did not finish in 180 s"));
    let (received_up, sent_down) = server;
    assert_eq!(
        received_up,
        (BULK, sent_up),
        "{profile}: upstream bytes differ"
    );
    assert_eq!(
        received_down,
        (BULK, sent_down),
        "{profile}: downstream bytes differ"
    );
    let s = proxy.stats.snapshot();
    assert_eq!(
        (s.bytes_up, s.bytes_down),
        (BULK as u64, BULK as u64),
        "{profile}"
    );
    assert_eq!(s.connections, 1);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_64mib_each_way_local() {
    bulk_both_ways("local", Engine::Model).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_64mib_each_way_lan() {
    bulk_both_ways("lan", Engine::Model).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_64mib_each_way_lossy() {
    bulk_both_ways("lossy-10ms-1pct", Engine::Model).await;
}

/// Request, FIN, then the server answers on the half-closed connection and closes.
pub(crate) async fn half_close(profile: &str, engine: Engine) {
    let (l, addr) = listener().await;
    let reply = vec![7u8; 1 << 20];
    let expected = reply.clone();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        s.write_all(&reply).await.unwrap();
        s.shutdown().await.unwrap();
        got
    });
    let proxy = TestProxy::start_engine(addr, profile, engine).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    let request: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    c.write_all(&request).await.unwrap();
    c.shutdown().await.unwrap();
    let mut got = Vec::new();
    timeout(PROMPT, c.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, expected, "{profile}: reply after half-close");
    assert_eq!(
        server.await.unwrap(),
        request,
        "{profile}: FIN came before the data"
    );
}

#[tokio::test]
async fn fin_propagates_after_all_data() {
    for profile in ["local", "lan", "lossy-10ms-1pct"] {
        half_close(profile, Engine::Model).await;
    }
}

#[tokio::test]
async fn refused_upstream_resets_the_client_and_the_proxy_serves_the_next_one() {
    for profile in ["local", "lossy-10ms-1pct"] {
        let held = dead_addr();
        let addr = held.addr;
        let proxy = TestProxy::start(addr, profile).await;
        let started = Instant::now();
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        let mut buf = [0u8; 1];
        let r = timeout(PROMPT, c.read(&mut buf))
            .await
            .expect("prompt close");
        assert!(
            matches!(&r, Err(e) if e.kind() == ErrorKind::ConnectionReset),
            "{profile}: expected a reset, got {r:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(proxy.stats.snapshot().connect_failures, 1);

        // The upstream comes up; the same proxy serves the next connection.
        drop(held);
        let l = tokio::net::TcpListener::bind(addr).await.unwrap();
        let _echo = spawn_echo(l);
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        timeout(PROMPT, c.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"ping", "{profile}");
        proxy.stop().await;
    }
}

#[tokio::test]
async fn upstream_dying_mid_stream_ends_the_client_and_the_proxy_survives() {
    for profile in ["local", "lossy-10ms-1pct"] {
        let (l, addr) = listener().await;
        let server = tokio::spawn(async move {
            // First connection: read a little, then die with data unread (kernel sends RST).
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 1000];
            s.read_exact(&mut buf).await.unwrap();
            drop(s);
            // Second connection: echo.
            let (s, _) = l.accept().await.unwrap();
            let (mut r, mut w) = s.into_split();
            tokio::io::copy(&mut r, &mut w).await.unwrap();
        });
        let proxy = TestProxy::start(addr, profile).await;
        let c = TcpStream::connect(proxy.addr).await.unwrap();
        let (mut r, mut w) = c.into_split();
        // Keep writing until the proxy ends the connection; writes may fail once it does.
        let writer = tokio::spawn(async move {
            let chunk = vec![1u8; 64 * 1024];
            for _ in 0..1000 {
                if w.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        });
        let mut buf = vec![0u8; 4096];
        let ended = timeout(PROMPT, async {
            loop {
                match r.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(
            ended.is_ok(),
            "{profile}: client still open after the upstream died"
        );
        writer.abort();

        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        c.write_all(b"still here").await.unwrap();
        c.shutdown().await.unwrap();
        let mut got = Vec::new();
        timeout(PROMPT, c.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, b"still here", "{profile}");
        server.await.unwrap();
        proxy.stop().await;
    }
}

/// A client that resets mid-stream: the server must see a reset, not a clean end of stream.
#[tokio::test]
async fn client_reset_propagates_to_the_server() {
    for profile in ["local", "lossy-10ms-1pct"] {
        let (l, addr) = listener().await;
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) => return "eof",
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::ConnectionReset => return "reset",
                    Err(e) => panic!("{e}"),
                }
            }
        });
        let proxy = TestProxy::start(addr, profile).await;
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        c.write_all(&[5u8; 10_000]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        socket2::SockRef::from(&c)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(c);
        let seen = timeout(PROMPT, server)
            .await
            .expect("server saw the end")
            .unwrap();
        assert_eq!(seen, "reset", "{profile}");
        proxy.stop().await;
    }
}

/// Queued bytes of the IPv4 TCP socket from `local` to `remote` (/proc/net/tcp): what it has
/// not yet had acknowledged (`tx`) and what it received but its program has not read (`rx`).
fn queues(local: std::net::SocketAddr, remote: std::net::SocketAddr) -> (u64, u64) {
    let hex = |a: std::net::SocketAddr| match a {
        std::net::SocketAddr::V4(v4) => format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(v4.ip().octets()),
            v4.port()
        ),
        _ => unreachable!("the tests use IPv4 loopback"),
    };
    let (l, r) = (hex(local), hex(remote));
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let line = table
        .lines()
        .find(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            f.len() > 4 && f[1] == l && f[2] == r
        })
        .unwrap_or_else(|| panic!("no socket {local} -> {remote}"));
    let (tx, rx) = line
        .split_whitespace()
        .nth(4)
        .unwrap()
        .split_once(':')
        .unwrap();
    (
        u64::from_str_radix(tx, 16).unwrap(),
        u64::from_str_radix(rx, 16).unwrap(),
    )
}

/// A server that never reads: the proxy buffers at most its window and then stops reading, so
/// the client's writes block instead of the proxy's memory growing. What the proxy holds is
/// measured, not guessed from kernel buffer sizes: every byte the client wrote is in its send
/// queue, in the proxy's receive queue, inside the proxy, or written on by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_window_pushes_back_on_the_sender() {
    let (l, addr) = listener().await;
    let _server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(s);
    });
    let window = 256 << 10;
    let options = ProxyOptions {
        window,
        ..ProxyOptions::default()
    };
    let proxy = TestProxy::start_with(addr, "lan", options).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    let chunk = vec![9u8; 64 << 10];
    let mut written = 0u64;
    // Write until a write makes no progress for a second: the sender feels the back-pressure.
    let blocked = timeout(Duration::from_secs(60), async {
        while let Ok(n) = timeout(Duration::from_secs(1), c.write(&chunk)).await {
            written += n.unwrap() as u64;
        }
    })
    .await;
    assert!(
        blocked.is_ok(),
        "wrote {written} bytes without ever blocking"
    );
    let (client_tx, _) = queues(c.local_addr().unwrap(), proxy.addr);
    let (_, proxy_rx) = queues(proxy.addr, c.local_addr().unwrap());
    let carried = proxy.stats.snapshot().bytes_up;
    let held = written.saturating_sub(client_tx + proxy_rx + carried);
    // The window, plus the one read it reserves room for.
    assert!(
        held <= window as u64 + (128 << 10),
        "the proxy holds {held} bytes with a {window}-byte window"
    );
    proxy.stop().await;
}

/// Stalls are counted per direction, and the same seed replays the same stalls.
#[tokio::test]
async fn stalls_are_counted_and_reproducible() {
    let mut counts = Vec::new();
    for _ in 0..2 {
        let (l, addr) = listener().await;
        let _echo = spawn_echo(l);
        let options = ProxyOptions {
            seed: 99,
            ..ProxyOptions::default()
        };
        let profile = tempdir();
        let path = profile.path().join("heavy.toml");
        std::fs::write(
            &path,
            "[link]\ndelay = \"1ms\"\nloss = 0.2\nrto_min = \"5ms\"\n",
        )
        .unwrap();
        let proxy = TestProxy::start_with(addr, path.to_str().unwrap(), options).await;
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        for i in 0..30u8 {
            c.write_all(&[i; 100]).await.unwrap();
            let mut got = [0u8; 100];
            timeout(PROMPT, c.read_exact(&mut got))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got, [i; 100]);
        }
        drop(c);
        let s = proxy.stats.snapshot();
        assert!(s.stalls_up > 0 && s.stalls_down > 0, "{s:?}");
        counts.push((s.stalls_up, s.stalls_down));
        proxy.stop().await;
    }
    assert_eq!(counts[0], counts[1], "same seed, same traffic, same stalls");
}
