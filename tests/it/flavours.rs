//! Every flavour × mode × workload through the real servers and load driver; the flavours
//! through the lossy proxy; failures counted as data.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use faultrig::bench::{self, BenchSpec, Mode, Stop};
use faultrig::flavour::{self, Flavour};
use faultrig::service::RigService;
use faultrig::workload::Workload;
use tokio::io::AsyncReadExt;

use crate::util::*;

/// A server of `flavour` in this process, stopped on drop.
async fn server(flavour: &'static dyn Flavour) -> Served {
    let (l, _) = listener().await;
    flavour::spawn(flavour, l, Arc::new(RigService::default())).unwrap()
}

pub fn spec(
    flavour: &'static dyn Flavour,
    target: SocketAddr,
    mode: Mode,
    workload: Workload,
) -> BenchSpec {
    BenchSpec {
        load: Arc::new(bench::RigTarget::new(flavour, workload, 1)),
        target: target.to_string(),
        mode,
        concurrency: 3,
        stop: Stop::Calls(12),
        warmup: Duration::ZERO,
        rate: None,
        timeout: Duration::from_secs(20),
        seed: 1,
        socket: Default::default(),
    }
}

/// All calls succeed with verified replies, and the mode opened exactly its connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_flavour_mode_and_workload() {
    for &flavour in flavour::ALL {
        let s = server(flavour).await;
        every_mode_and_workload(flavour, s.addr()).await;
    }
}

/// Runs 12 calls over 3 workers of every mode × workload against `target` and checks each cell:
/// every call answered and verified, exactly the connections the mode opens.
pub async fn every_mode_and_workload(flavour: &'static dyn Flavour, target: SocketAddr) {
    let modes = [Mode::Single, Mode::PerCall, Mode::PerWorker, Mode::Pool(2)];
    let workloads = [
        Workload::Order,
        Workload::Blob(4096),
        Workload::Wide,
        Workload::Deduct,
    ];
    for mode in modes {
        for workload in workloads {
            let spec = spec(flavour, target, mode, workload);
            let out = bench::run(&spec).await;
            let what = format!("{} {mode} {workload}", flavour.name());
            assert_eq!(
                (out.calls, out.ok),
                (12, 12),
                "{what}: {}",
                out.summary(&spec)
            );
            let expected_conns = match mode {
                Mode::Single => 1,
                Mode::PerCall => 12,
                Mode::PerWorker => 3,
                Mode::Pool(n) => n as u64,
            };
            assert_eq!(out.conns_opened, expected_conns, "{what}");
            assert_eq!(out.latency.len(), 12, "{what}");
            assert!(
                out.bytes_out >= 12 * out.payload_bytes as u64,
                "{what}: wire bytes"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_blobs_and_open_loop() {
    for &flavour in flavour::ALL {
        let s = server(flavour).await;
        let mut big = spec(flavour, s.addr(), Mode::Single, Workload::Blob(16 << 20));
        big.stop = Stop::Calls(2);
        big.concurrency = 1;
        let out = bench::run(&big).await;
        assert_eq!(out.ok, 2, "{}: {}", flavour.name(), out.summary(&big));

        // Open loop: 40 calls at 400/s take about 0.1 s whatever the latency.
        let mut open = spec(flavour, s.addr(), Mode::PerWorker, Workload::Order);
        open.stop = Stop::Calls(40);
        open.rate = Some(400.0);
        let out = bench::run(&open).await;
        assert_eq!(out.ok, 40, "{}", flavour.name());
        assert!(
            out.elapsed >= Duration::from_millis(95),
            "{:?}",
            out.elapsed
        );
    }
}

/// 200 sequential calls through `lossy-10ms-1pct`: everything succeeds, and a new connection
/// per call costs about one more RTT (20 ms) at the median.
async fn lossy(flavour: &'static dyn Flavour) {
    let s = server(flavour).await;
    let proxy = TestProxy::start(s.addr(), "lossy-10ms-1pct").await;
    // Low quantiles, not medians: while other tests load the two cores a kept connection's
    // median rose from 20.4 to 24.0 ms and its p90 to 39 ms (the wait for a core, not the model),
    // but every quantile is bounded below by the round trips the model adds, and the 10th
    // percentile of 200 calls still has twenty of them.
    let mut lows = Vec::new();
    for mode in [Mode::Single, Mode::PerCall] {
        let mut spec = spec(flavour, proxy.addr, mode, Workload::Order);
        spec.concurrency = 1;
        spec.stop = Stop::Calls(200);
        let out = bench::run(&spec).await;
        assert_eq!(out.ok, 200, "{}", out.summary(&spec));
        let p10 = out.latency.value_at_quantile(0.1);
        // A clean call is 20 ms on a kept connection: 2 × 10 ms, plus a little processing.
        if mode == Mode::Single {
            assert!((20_000..24_000).contains(&p10), "{}", out.summary(&spec));
        }
        println!("{}", out.summary(&spec));
        lows.push(p10 as i64);
    }
    let extra = lows[1] - lows[0];
    assert!(
        (17_000..30_000).contains(&extra),
        "{}: per-call adds {extra} µs at the 10th percentile, expected about one RTT (20 ms)",
        flavour.name()
    );
    assert!(proxy.stats.snapshot().stalls_up + proxy.stats.snapshot().stalls_down > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_grpc() {
    lossy(&flavour::grpc::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_http1_json() {
    lossy(&flavour::http1_json::Http1Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_http2_json() {
    lossy(&flavour::http2_json::Http2Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_tcp_binary() {
    lossy(&flavour::tcp_binary::TcpBinary).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_thrift() {
    lossy(&flavour::thrift::Thrift).await;
}

fn only(out: &bench::BenchOutcome, kind: flavour::Failure) -> bool {
    out.ok == 0 && out.errors[kind] == out.calls && out.calls > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_by_kind() {
    // A server that accepts, reads the request, then resets the connection; clients reach it
    // through the proxy, which passes the reset on.
    let (l, resetting) = listener().await;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                socket2::SockRef::from(&s)
                    .set_linger(Some(Duration::ZERO))
                    .unwrap();
            });
        }
    });
    let proxy = TestProxy::start(resetting, "local").await;
    // A server that accepts and never answers.
    let (silent_l, silent) = listener().await;
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent_l.accept().await {
            held.push(s);
        }
    });
    let held = dead_addr();
    let down = held.addr;
    for &flavour in flavour::ALL {
        let name = flavour.name();
        let mut s = spec(flavour, down, Mode::Single, Workload::Order);
        s.stop = Stop::Calls(5);
        let out = bench::run(&s).await;
        assert!(
            only(&out, flavour::Failure::Connect),
            "{name} down: {}",
            out.summary(&s)
        );

        // Two calls for each of the three workers: a worker's limit, once spent, is armed again.
        let mut s = spec(flavour, silent, Mode::PerWorker, Workload::Order);
        s.stop = Stop::Calls(6);
        s.timeout = Duration::from_millis(300);
        let out = bench::run(&s).await;
        assert!(
            only(&out, flavour::Failure::Timeout),
            "{name} silent: {}",
            out.summary(&s)
        );

        let mut s = spec(flavour, proxy.addr, Mode::Single, Workload::Order);
        s.stop = Stop::Calls(4);
        s.concurrency = 1;
        let out = bench::run(&s).await;
        assert!(
            only(&out, flavour::Failure::Reset),
            "{name} reset: {}",
            out.summary(&s)
        );
    }
}

/// A worker's call limit is one timer pushed later before each call: over a run several times
/// the limit long, no call that is answered promptly is counted as timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_limit_runs_from_each_call() {
    let served = server(&flavour::tcp_binary::TcpBinary).await;
    let mut s = spec(
        &flavour::tcp_binary::TcpBinary,
        served.addr(),
        Mode::PerWorker,
        Workload::Order,
    );
    s.timeout = Duration::from_millis(200);
    s.stop = Stop::Duration(Duration::from_millis(1200));
    let out = bench::run(&s).await;
    assert!(out.ok > 100, "{}", out.summary(&s));
    assert_eq!(out.failed(), 0, "{}", out.summary(&s));
}
