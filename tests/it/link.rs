//! The link engine with real kernel TCP and UDP: `faultrig shell`, the proxy's kernel engine,
//! the packet-only faults, cleanup and the privilege error.
//!
//! Everything but the privilege test needs CAP_NET_ADMIN; CI runs the tests as root. Elsewhere
//! each test prints `SKIPPED` with the reason (visible with `--nocapture`, and counted by
//! scripts/test.sh) and returns.

use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use faultrig::link::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::util::*;

/// True when the test can create namespaces; otherwise reports it skipped ([`privileged`]).
fn privileged_here(test: &str) -> bool {
    privileged(&format!("link::{test}"))
}

/// A UDP echo server for shells: it listens on every interface, since the shell's host address
/// is only known once the shell runs, but answers only the benchmarking range the link engine
/// uses (198.18.0.0/15), so nothing else can use it. Stops on drop.
struct UdpEcho {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl UdpEcho {
    fn start() -> UdpEcho {
        let socket = UdpSocket::bind("0.0.0.0:0").unwrap();
        // Room for a whole flood (rmem_max would cap a plain SO_RCVBUF), so a busy machine
        // delays the echo but never makes its socket drop what the link delivered.
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBufForce, &(32 << 20))
            .unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let port = socket.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stopped.load(Ordering::Relaxed) {
                if let Ok((n, from)) = socket.recv_from(&mut buf) {
                    if let SocketAddr::V4(v4) = from {
                        if v4.ip().octets()[..2] == [198, 18] || v4.ip().octets()[..2] == [198, 19]
                        {
                            let _ = socket.send_to(&buf[..n], from);
                        }
                    }
                }
            }
        });
        UdpEcho { port, stop }
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

const PROBE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/udp_probe.py");

/// Runs `faultrig shell ARGS -- python3 udp_probe.py PORT PROBE_ARGS` and returns its output
/// and the probe's JSON.
fn shell_probe(args: &[&str], port: u16, probe: &[&str]) -> (Output, serde_json::Value) {
    let port = port.to_string();
    let mut all: Vec<&str> = vec!["shell"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--", "python3", PROBE, &port]);
    all.extend_from_slice(probe);
    let out = faultrig(&all);
    let stdout = succeeded(&out);
    let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    (out, json)
}

/// The shell's summary line: `(up, down)` counters by name.
fn summary(out: &Output) -> [std::collections::HashMap<String, u64>; 2] {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("faultrig shell ("))
        .unwrap_or_else(|| panic!("no summary in {stderr}"));
    let sides: Vec<&str> = line
        .split(": up ")
        .nth(1)
        .unwrap()
        .split("; down ")
        .collect();
    [0, 1].map(|i| {
        sides[i]
            .split(", ")
            .map(|part| {
                let (n, name) = part.split_once(' ').unwrap();
                (name.to_string(), n.parse().unwrap())
            })
            .collect()
    })
}

fn profile_file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(format!("{name}.toml"));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn shell_udp_echo_shows_the_delay_and_the_seeded_loss() {
    if !privileged_here("shell_udp_echo_shows_the_delay_and_the_seeded_loss") {
        return;
    }
    let echo = UdpEcho::start();
    let run = |seed: &str| {
        let (out, json) = shell_probe(
            &["--profile", "lossy-10ms-1pct", "--seed", seed],
            echo.port,
            &["ping", "400"],
        );
        let rtts: Vec<Option<f64>> = json["rtt_ms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64())
            .collect();
        (out, rtts)
    };
    let (out, rtts) = run("7");
    let mut answered: Vec<f64> = rtts.iter().flatten().copied().collect();
    answered.sort_by(f64::total_cmp);
    let median = answered[answered.len() / 2];
    // 10 ms each way; the engine and Python add a little, never take away.
    assert!((20.0..25.0).contains(&median), "median RTT {median} ms");
    assert!(answered[0] >= 20.0, "faster than the link: {}", answered[0]);
    let lost: Vec<usize> = (0..rtts.len()).filter(|&i| rtts[i].is_none()).collect();
    // 1 % each way: about 8 of 400; the seed fixes which.
    assert!((1..=24).contains(&lost.len()), "lost {lost:?}");
    let [up, down] = summary(&out);
    assert_eq!(up["packets"], 400);
    assert_eq!(up["lost"] + down["lost"], lost.len() as u64);

    let (_, again) = run("7");
    let lost_again: Vec<usize> = (0..again.len()).filter(|&i| again[i].is_none()).collect();
    assert_eq!(lost, lost_again, "the same seed must lose the same packets");
    let (_, other) = run("8");
    let lost_other: Vec<usize> = (0..other.len()).filter(|&i| other[i].is_none()).collect();
    assert_ne!(lost, lost_other, "another seed, other losses");
}

/// Half-width of a 99.99 % binomial interval, plus one for small counts.
fn tolerance(p: f64, n: f64) -> f64 {
    3.9 * (p * (1.0 - p) * n).sqrt() + 1.0
}

#[test]
fn loss_duplicate_corrupt_and_reorder_at_their_rates_over_ten_thousand_packets() {
    if !privileged_here(
        "loss_duplicate_corrupt_and_reorder_at_their_rates_over_ten_thousand_packets",
    ) {
        return;
    }
    let echo = UdpEcho::start();
    let dir = tempdir();
    let n = 10_000u64;
    let flood = |profile: &str| {
        let (out, json) = shell_probe(&["--profile", profile], echo.port, &["flood", "10000"]);
        let replies: Vec<u64> = json["replies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        (summary(&out), replies)
    };
    let check = |what: &str, got: u64, p: f64, of: u64| {
        let expected = p * of as f64;
        assert!(
            (got as f64 - expected).abs() <= tolerance(p, of as f64),
            "{what}: {got}, expected {expected:.0} of {of}"
        );
    };

    // Loss and delay on every packet.
    let lossy = profile_file(&dir, "lossy", "[link]\ndelay = \"2ms\"\nloss = 0.03\n");
    let ([up, down], replies) = flood(&lossy);
    assert_eq!(up["packets"], n);
    check("lost up", up["lost"], 0.03, n);
    check("lost down", down["lost"], 0.03, down["packets"]);
    assert_eq!(replies.len() as u64, n - up["lost"] - down["lost"]);

    // Duplicates: each surviving packet may be doubled on the way up and again on the way down.
    let dup = profile_file(&dir, "dup", "[link]\ndelay = \"2ms\"\nduplicate = 0.1\n");
    let ([up, down], replies) = flood(&dup);
    check("duplicated up", up["duplicated"], 0.1, n);
    check("duplicated down", down["duplicated"], 0.1, down["packets"]);
    assert_eq!(down["packets"], n + up["duplicated"]);
    assert_eq!(replies.len() as u64, down["packets"] + down["duplicated"]);

    // Corruption: the kernel drops a bad UDP checksum, so it looks like loss to the application.
    let bad = profile_file(&dir, "bad", "[link]\ndelay = \"2ms\"\ncorrupt = 0.05\n");
    let ([up, down], replies) = flood(&bad);
    check("corrupted up", up["corrupted"], 0.05, n);
    assert_eq!(
        down["packets"],
        n - up["corrupted"],
        "the server's kernel must drop every corrupted packet"
    );
    assert_eq!(replies.len() as u64, down["packets"] - down["corrupted"]);

    // Reordering: netem's meaning, a reordered packet skips the delay and overtakes.
    let reorder = profile_file(&dir, "reorder", "[link]\ndelay = \"5ms\"\nreorder = 0.1\n");
    let ([up, _], replies) = flood(&reorder);
    check("reordered up", up["reordered"], 0.1, n);
    let overtaken = replies.windows(2).filter(|w| w[1] < w[0]).count();
    assert!(
        overtaken > 100,
        "only {overtaken} replies arrived out of order"
    );
}

/// The host address a shell gave its command.
fn shell_host(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn host_has_address(addr: &str) -> bool {
    let out = Command::new("ip").args(["-o", "addr"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).contains(&format!(" {addr} "))
}

#[test]
fn shell_returns_the_exit_code_and_leaves_nothing_behind() {
    if !privileged_here("shell_returns_the_exit_code_and_leaves_nothing_behind") {
        return;
    }
    let netns_before = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let out = faultrig(&["shell", "--", "sh", "-c", "echo $FAULTRIG_HOST; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let host = shell_host(&out);
    assert!(host.starts_with("198.1"), "{host}");
    assert!(!host_has_address(&host), "device {host} left behind");

    // A command that cannot start: exit 2, and nothing left.
    let out = faultrig(&["shell", "--", "/nonexistent/command"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/command"));

    // SIGTERM: passed to the command, which ends; faultrig returns its code and cleans up.
    let mut child = Command::new(env!("CARGO_BIN_EXE_faultrig"))
        .args([
            "shell",
            "--",
            "sh",
            "-c",
            "echo $FAULTRIG_HOST; exec sleep 30",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let host = line.trim().to_string();
    assert!(host_has_address(&host));
    let started = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    assert!(
        !host_has_address(&host),
        "device {host} left behind after SIGTERM"
    );

    // The command killed outright: its 128 + 9, nothing left.
    let out = faultrig(&["shell", "--", "sh", "-c", "echo $FAULTRIG_HOST; kill -9 $$"]);
    assert_eq!(out.status.code(), Some(128 + 9), "{out:?}");
    assert!(!host_has_address(&shell_host(&out)));

    let netns_after = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert_eq!(
        netns_before.stdout, netns_after.stdout,
        "named namespaces changed"
    );
}

#[test]
fn without_the_privilege_one_message_and_exit_2() {
    refused_without_the_privilege(&["shell", "--", "true"]);
}

#[test]
fn the_model_proxy_refuses_packet_only_keys_by_name() {
    let dir = tempdir();
    let path = profile_file(
        &dir,
        "reordering",
        "[link]\ndelay = \"1ms\"\nreorder = 0.01\n",
    );
    let out = faultrig(&["proxy", "--upstream", "127.0.0.1:9", "--profile", &path]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("upstream.reorder"), "{stderr}");
    assert!(stderr.contains("--engine kernel"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_engine_is_byte_exact_64mib_each_way_on_lossy() {
    if !privileged_here("kernel_engine_is_byte_exact_64mib_each_way_on_lossy") {
        return;
    }
    crate::proxy::bulk_both_ways("lossy-10ms-1pct", Engine::Kernel).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_engine_half_close_and_resets_cross_the_link() {
    if !privileged_here("kernel_engine_half_close_and_resets_cross_the_link") {
        return;
    }
    crate::proxy::half_close("lossy-10ms-1pct", Engine::Kernel).await;

    // The server resets: the client sees a reset, not a clean close.
    let (l, addr) = listener().await;
    let proxy = TestProxy::start_engine(addr, "lan", Engine::Kernel).await;
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
    });
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    c.write_all(b"ping").await.unwrap();
    server.await.unwrap();
    let mut buf = [0u8; 1];
    let r = timeout(PROMPT, c.read(&mut buf)).await.expect("prompt");
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "expected a reset, got {r:?}"
    );
    proxy.stop().await;
}

/// Sequential calls over one connection through a kernel-engine proxy in front of the
/// calibration reply server: a 100-byte request, `reply` bytes back. Returns each latency.
async fn kernel_calls(profile: &str, reply: usize, calls: usize) -> Vec<Duration> {
    use faultrig::calibrate::{serve, REQUEST};
    let (l, addr) = listener().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(l, stopped));
    let proxy = TestProxy::start_engine(addr, profile, Engine::Kernel).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    c.set_nodelay(true).unwrap();
    let mut request = [0u8; REQUEST];
    request[..8].copy_from_slice(&(reply as u64).to_le_bytes());
    let mut got = vec![0u8; reply];
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        c.write_all(&request).await.unwrap();
        timeout(Duration::from_secs(60), c.read_exact(&mut got))
            .await
            .expect("call within 60 s")
            .unwrap();
        times.push(start.elapsed());
    }
    drop(c);
    proxy.stop().await;
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_engine_takes_the_round_trips_real_tcp_takes() {
    if !privileged_here("kernel_engine_takes_the_round_trips_real_tcp_takes") {
        return;
    }
    let p50 = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    // One segment each way: one 20 ms round trip.
    let one = p50(kernel_calls("lossy-10ms-1pct", 100, 150).await);
    assert!(
        one >= Duration::from_millis(20) && one < Duration::from_millis(30),
        "one-segment p50 {one:?}"
    );
    // A 16 KiB reply on a fresh connection is 12 segments, more than the initial window of
    // 10: it needs a second round trip (the fault model says one).
    let fresh = kernel_calls("lossy-10ms-1pct", 16 << 10, 1).await[0];
    assert!(fresh >= Duration::from_millis(40), "16 KiB fresh {fresh:?}");
}
