//! `faultrig calibrate`: the fault model against real kernel TCP, side by side in one run.
//!
//! For each profile and workload, a model proxy and then a kernel-engine proxy are started in
//! front of the same raw TCP reply server ([`serve`]) and driven with the same calls, so both
//! engines see the same machine state; [`stats`] turns the two samples into ratios, bootstrap
//! intervals and a verdict. Calibration measures the network model, so the calls are raw TCP
//! with TCP_NODELAY: no RPC framing, no serialisation, nothing but the bytes the workload moves.
//!
//! Each (profile, workload, engine) gets a fresh proxy: a kernel engine's namespaces would
//! otherwise carry TCP metrics (cached ssthresh, RTT) from one workload to the next, and the
//! model's connection ordinals (its random streams) would depend on the order of the suite.

pub mod stats;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::link::{Engine, NamespaceError};
use crate::profile::Profile;
use crate::proxy::{Proxy, ProxyOptions};
use stats::{Comparison, Kind, Stat};

/// Bytes of every request: the first 8 are the reply size, little-endian.
pub const REQUEST: usize = 100;
/// A request for this reply size asks for an endless reply (the bulk flow).
const ENDLESS: u64 = u64::MAX;
/// A bulk flow's rate is sampled in slices this long.
const SLICE: Duration = Duration::from_millis(250);
/// One call may take this long before the run fails. A slow call is a sample, not an error: a
/// burst of losses backs a retransmission off for minutes (RTO doubling, capped at 120 s), so
/// the limit is beyond the ~924 s after which Linux gives a connection up (tcp_retries2 = 15).
const CALL_LIMIT: Duration = Duration::from_secs(1000);

/// One workload of the suite. The names are the command line's and the CSV's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// 100 B request, 100 B reply: one segment each way.
    Order,
    /// 100 B request, 4000 B reply: three segments back.
    ThreeSeg,
    /// 16 KiB reply: 12 segments, more than the initial window of 10.
    K16,
    /// 64 KiB reply.
    K64,
    /// 1 MiB reply.
    M1,
    /// A new connection per call, 100 B each way; the time includes the connect.
    PerCall,
    /// One flow, server to client, for a fixed time: throughput instead of latency.
    Bulk,
}

impl Workload {
    pub const ALL: [Workload; 7] = [
        Workload::Order,
        Workload::ThreeSeg,
        Workload::K16,
        Workload::K64,
        Workload::M1,
        Workload::PerCall,
        Workload::Bulk,
    ];
    /// `--quick`: one-segment, multi-segment, the initial-window edge, connects, and a flow.
    pub(crate) const QUICK: [Workload; 5] = [
        Workload::Order,
        Workload::ThreeSeg,
        Workload::K16,
        Workload::PerCall,
        Workload::Bulk,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Order => "order",
            Workload::ThreeSeg => "3seg",
            Workload::K16 => "16k",
            Workload::K64 => "64k",
            Workload::M1 => "1m",
            Workload::PerCall => "per-call",
            Workload::Bulk => "bulk",
        }
    }

    pub fn parse(s: &str) -> Result<Workload, String> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Workload::ALL.iter().map(|w| w.name()).collect();
                format!("unknown workload \"{s}\" (use {})", names.join(", "))
            })
    }

    /// Bytes of one reply.
    pub fn reply(self) -> u64 {
        match self {
            Workload::Order | Workload::PerCall => 100,
            Workload::ThreeSeg => 4000,
            Workload::K16 => 16 << 10,
            Workload::K64 => 64 << 10,
            Workload::M1 => 1 << 20,
            Workload::Bulk => ENDLESS,
        }
    }

    pub fn kind(self) -> Kind {
        match self {
            Workload::Bulk => Kind::Throughput,
            _ => Kind::Latency,
        }
    }
}

/// Everything one calibration run does.
#[derive(Clone, Debug)]
pub struct Plan {
    pub profiles: Vec<Profile>,
    pub workloads: Vec<Workload>,
    /// Counted calls per latency workload and engine, over all connections.
    pub calls: u64,
    /// Concurrent connections per latency workload.
    pub connections: usize,
    /// Uncounted calls each connection makes first.
    pub warmup_calls: u64,
    /// How long the bulk flow runs.
    pub bulk_time: Duration,
    /// The proxies' seed (the model's fault draws, the link's loss draws) and the bootstrap's.
    pub seed: u64,
}

/// The full suite's profiles: loss alone, a rate-limited WAN, bursty loss, and a clean path.
pub(crate) const PROFILES: [&str; 4] = ["lossy-10ms-1pct", "wan", "bursty", "clean-10ms"];
/// `--quick`'s profile.
pub(crate) const QUICK_PROFILE: &str = "lossy-10ms-1pct";
/// Full suite: calls and connections per latency workload, bulk time.
pub(crate) const FULL: (u64, usize, Duration) = (1000, 4, Duration::from_secs(10));
/// `--quick`: 1500 calls on 6 connections, so that p99 rests on 15 samples, and the suite fits
/// in about three minutes on `lossy-10ms-1pct`.
pub(crate) const QUICK: (u64, usize, Duration) = (1500, 6, Duration::from_secs(4));
/// Uncounted calls per connection before measuring: the connection is up and the first
/// handshake-time effects are past, so the count compares steady calls on both engines.
pub(crate) const WARMUP_CALLS: u64 = 3;

/// One engine's samples for one (profile, workload): ms per call, or Mbit/s per slice.
#[derive(Clone, Debug)]
pub struct Samples {
    pub profile: String,
    pub workload: Workload,
    pub engine: Engine,
    pub values: Vec<f64>,
    pub wall: Duration,
}

/// What a run found: every comparison by profile, and the raw samples the pages plot.
pub struct Outcome {
    pub tables: Vec<(String, Vec<Comparison>)>,
    pub samples: Vec<Samples>,
}

impl Outcome {
    /// Comparisons with a statistic out of tolerance.
    pub(crate) fn out_of_tolerance(&self) -> usize {
        self.tables
            .iter()
            .flat_map(|(_, rows)| rows)
            .filter(|c| !c.failing().is_empty())
            .count()
    }
}

/// Why a calibration run stopped. Every figure measured before it is still written.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// The reply server or a proxy could not be started.
    #[error("start: {0}")]
    Start(#[from] io::Error),
    /// One engine's run of one workload failed.
    #[error("{profile} {workload} {engine}: {source}")]
    Measure {
        profile: String,
        workload: &'static str,
        engine: &'static str,
        source: MeasureError,
    },
    /// A workload produced nothing to compare.
    #[error("{profile} {workload}: no samples")]
    NoSamples {
        profile: String,
        workload: &'static str,
    },
    /// The CSV or the page could not be written.
    #[error("write {path}: {reason}")]
    Write { path: String, reason: String },
}

/// Why one engine's run of one workload failed.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Namespace(#[from] NamespaceError),
    #[error("a call took over {0:?}")]
    CallLimit(Duration),
    #[error("the bulk flow ended early")]
    BulkEnded,
    #[error("a connection's task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Runs the plan, printing each profile's table as it completes (`say` gets every line), and
/// writes `calibrate.csv` and `calibrate.html` into `out`: after a failure, with the profiles
/// that completed before it.
pub async fn run(
    plan: &Plan,
    out: &Path,
    mut say: impl FnMut(&str),
) -> Result<Outcome, CalibrateError> {
    let listener = crate::net::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let upstream = listener.local_addr()?;
    let stop = CancellationToken::new();
    let server = tokio::spawn(serve(listener, stop.clone().cancelled_owned()));
    let result = run_against(plan, upstream, out, &mut say).await;
    stop.cancel();
    // The server task only ends with an accept error or a panic; either is a failed start.
    server.await.map_err(io::Error::other)??;
    result
}

async fn run_against(
    plan: &Plan,
    upstream: SocketAddr,
    out: &Path,
    say: &mut impl FnMut(&str),
) -> Result<Outcome, CalibrateError> {
    let mut outcome = Outcome {
        tables: Vec::new(),
        samples: Vec::new(),
    };
    let measured = measure_all(plan, upstream, say, &mut outcome).await;
    // Written whatever happened: the profiles finished before a failure are still results.
    let csv = out.join("calibrate.csv");
    write_csv(&csv, &outcome).map_err(|e| CalibrateError::Write {
        path: csv.display().to_string(),
        reason: e.to_string(),
    })?;
    let html = out.join("calibrate.html");
    page(plan, &outcome)
        .map_err(|e| e.to_string())
        .and_then(|page| std::fs::write(&html, page).map_err(|e| e.to_string()))
        .map_err(|reason| CalibrateError::Write {
            path: html.display().to_string(),
            reason,
        })?;
    measured.map(|()| outcome)
}

async fn measure_all(
    plan: &Plan,
    upstream: SocketAddr,
    say: &mut impl FnMut(&str),
    outcome: &mut Outcome,
) -> Result<(), CalibrateError> {
    for profile in &plan.profiles {
        if shares_a_bottleneck(profile) && plan.connections > 1 {
            say(&format!(
                "  {}: limits the rate, so its latency workloads run on one connection (the \
                 link's bottleneck is shared by all connections, the model's is per connection)",
                profile.name
            ));
        }
        let mut rows = Vec::new();
        for &workload in &plan.workloads {
            let mut pair = Vec::new();
            for engine in [Engine::Model, Engine::Kernel] {
                let started = Instant::now();
                let values = measure(plan, profile, upstream, workload, engine)
                    .await
                    .map_err(|source| CalibrateError::Measure {
                        profile: profile.name.clone(),
                        workload: workload.name(),
                        engine: engine.as_str(),
                        source,
                    })?;
                let wall = started.elapsed();
                say(&format!(
                    "  {} {:<8} {:<6} {} samples in {:.1} s",
                    profile.name,
                    workload.name(),
                    engine.as_str(),
                    values.len(),
                    wall.as_secs_f64()
                ));
                pair.push(Samples {
                    profile: profile.name.clone(),
                    workload,
                    engine,
                    values,
                    wall,
                });
            }
            let (m, k) = (&pair[0].values, &pair[1].values);
            let (Some(model), Some(kernel), Some(ratios)) = (
                stats::Summary::of(m),
                stats::Summary::of(k),
                stats::ratios(m, k, plan.seed, stats::RESAMPLES),
            ) else {
                return Err(CalibrateError::NoSamples {
                    profile: profile.name.clone(),
                    workload: workload.name(),
                });
            };
            rows.push(Comparison {
                workload: workload.name().into(),
                kind: workload.kind(),
                model,
                kernel,
                ratios,
            });
            outcome.samples.extend(pair);
        }
        say(&format!("\n{}", stats::render(&profile.name, &rows)));
        outcome.tables.push((profile.name.clone(), rows));
    }
    Ok(())
}

/// One engine's run of one workload through a fresh proxy.
async fn measure(
    plan: &Plan,
    profile: &Profile,
    upstream: SocketAddr,
    workload: Workload,
    engine: Engine,
) -> Result<Vec<f64>, MeasureError> {
    let options = ProxyOptions {
        name: "calibrate".into(),
        seed: plan.seed,
        ..ProxyOptions::default()
    };
    let proxy = Proxy::new(upstream.to_string(), profile.clone(), options);
    let proxy = match engine {
        Engine::Kernel => proxy.with_kernel_engine().await?,
        _ => proxy,
    };
    let listener = crate::net::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let served = crate::net::Served::spawn(listener, |l, stop| proxy.run(l, stop))?;
    let addr = served.addr();
    let connections = if shares_a_bottleneck(profile) {
        1
    } else {
        plan.connections
    };
    let values = match workload {
        Workload::Bulk => bulk(addr, plan.bulk_time).await,
        _ => latencies(addr, workload, plan, connections).await,
    };
    served.stop().await?;
    values
}

/// The reply server: on each connection, reads [`REQUEST`]-byte requests and answers each with
/// the size its first 8 bytes ask for (endless for the bulk flow), until the client closes or
/// `shutdown` completes.
pub async fn serve(listener: TcpListener, shutdown: impl Future) -> io::Result<()> {
    crate::net::accept_until(
        listener,
        shutdown,
        "calibrate server",
        crate::net::connection_cap(None, 1),
        None,
        |s, _, cancel| async move {
            let _ = s.set_nodelay(true);
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = answer(s) => {}
            }
        },
    )
    .await
}

async fn answer(mut s: TcpStream) -> io::Result<()> {
    let chunk = vec![0x5au8; 64 << 10];
    let mut request = [0u8; REQUEST];
    loop {
        s.read_exact(&mut request).await?;
        let mut left = u64::from_le_bytes(request[..8].try_into().expect("8 bytes"));
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            s.write_all(&chunk[..n]).await?;
            if left != ENDLESS {
                left -= n as u64;
            }
        }
    }
}

fn request(reply: u64) -> [u8; REQUEST] {
    let mut r = [0u8; REQUEST];
    r[..8].copy_from_slice(&reply.to_le_bytes());
    r
}

async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Whether the profile limits the rate. The kernel engine's connections then share one
/// bottleneck queue, as flows on a real path do, while the model gives each connection its own:
/// concurrent connections would compare different networks.
fn shares_a_bottleneck(profile: &Profile) -> bool {
    profile.upstream.rate_bps.is_some() || profile.downstream.rate_bps.is_some()
}

/// `connections` connections making sequential calls, each after its warm-up calls, until
/// `plan.calls` calls are counted in all. Returns each counted call's latency in ms.
async fn latencies(
    addr: SocketAddr,
    workload: Workload,
    plan: &Plan,
    connections: usize,
) -> Result<Vec<f64>, MeasureError> {
    let left = Arc::new(AtomicU64::new(plan.calls));
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let left = left.clone();
        let warmup = plan.warmup_calls;
        tasks.push(tokio::spawn(async move {
            let mut conn = None;
            let mut times = Vec::new();
            let mut buf = vec![0u8; workload.reply() as usize];
            let req = request(workload.reply());
            for i in 0.. {
                // Warm-up calls are not counted and claim nothing from the total; they only
                // stop early if the other connections have already made every counted call.
                let counted = i >= warmup;
                let go = if counted {
                    left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                        .is_ok()
                } else {
                    left.load(Ordering::Relaxed) > 0
                };
                if !go {
                    break;
                }
                let start = Instant::now();
                let one = async {
                    let mut c = match conn.take() {
                        Some(c) if workload != Workload::PerCall => c,
                        _ => connect(addr).await?,
                    };
                    c.write_all(&req).await?;
                    c.read_exact(&mut buf).await?;
                    io::Result::Ok(c)
                };
                let c = tokio::time::timeout(CALL_LIMIT, one)
                    .await
                    .map_err(|_| MeasureError::CallLimit(CALL_LIMIT))??;
                if counted {
                    times.push(start.elapsed().as_secs_f64() * 1e3);
                }
                conn = Some(c);
            }
            Ok::<_, MeasureError>(times)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// One endless reply read for `time`: the rate of each [`SLICE`] in Mbit/s. The flow starts
/// from a fresh connection, slow start included, as a download would.
async fn bulk(addr: SocketAddr, time: Duration) -> Result<Vec<f64>, MeasureError> {
    let mut c = connect(addr).await?;
    c.write_all(&request(ENDLESS)).await?;
    let mut buf = vec![0u8; 256 << 10];
    let start = tokio::time::Instant::now();
    let mut rates = Vec::new();
    let slices = (time.as_nanos() / SLICE.as_nanos()).max(1) as u32;
    for i in 1..=slices {
        let end = start + SLICE * i;
        let mut bytes = 0u64;
        loop {
            match tokio::time::timeout_at(end, c.read(&mut buf)).await {
                Err(_) => break,
                Ok(Ok(0)) => return Err(MeasureError::BulkEnded),
                Ok(Ok(n)) => bytes += n as u64,
                Ok(Err(e)) => return Err(e.into()),
            }
        }
        rates.push(bytes as f64 * 8.0 / SLICE.as_secs_f64() / 1e6);
    }
    Ok(rates)
}

/// One row per (profile, workload, engine) with its statistics, and one `ratio` row per
/// (profile, workload) with the ratios, their intervals and the verdict.
fn write_csv(path: &Path, outcome: &Outcome) -> Result<(), csv::Error> {
    let mut w = csv::Writer::from_path(path)?;
    let mut header = vec!["profile", "workload", "engine", "unit", "samples", "wall_s"];
    header.extend(Stat::ALL.map(|s| s.name()));
    let bounds: Vec<String> = Stat::ALL
        .iter()
        .flat_map(|s| [format!("{}_low", s.name()), format!("{}_high", s.name())])
        .collect();
    header.extend(bounds.iter().map(String::as_str));
    header.push("verdict");
    w.write_record(&header)?;
    let num = |v: f64| format!("{v:.4}");
    for (profile, rows) in &outcome.tables {
        for c in rows {
            for (engine, s) in [("model", &c.model), ("kernel", &c.kernel)] {
                let wall = outcome
                    .samples
                    .iter()
                    .find(|x| {
                        &x.profile == profile
                            && x.workload.name() == c.workload
                            && x.engine.as_str() == engine
                    })
                    .map_or(0.0, |x| x.wall.as_secs_f64());
                let mut r = vec![
                    profile.clone(),
                    c.workload.clone(),
                    engine.into(),
                    c.kind.unit().into(),
                    s.n.to_string(),
                    format!("{wall:.1}"),
                ];
                r.extend(s.values.map(num));
                r.extend(std::iter::repeat_n(String::new(), 9));
                w.write_record(&r)?;
            }
            let mut r = vec![
                profile.clone(),
                c.workload.clone(),
                "ratio".into(),
                "model/kernel".into(),
                String::new(),
                String::new(),
            ];
            r.extend(c.ratios.point.map(num));
            for i in 0..4 {
                r.push(num(c.ratios.low[i]));
                r.push(num(c.ratios.high[i]));
            }
            r.push(stats::verdict(&c.failing()));
            w.write_record(&r)?;
        }
    }
    w.flush()?;
    Ok(())
}

/// The page: the tables, then per (profile, workload) both engines' CDFs overlaid.
fn page(plan: &Plan, outcome: &Outcome) -> Result<String, crate::report::html::PlotError> {
    use crate::report::html::{cdf_plot, escape, head};
    let mut html = head("faultrig calibrate: the model against kernel TCP");
    html += &format!(
        "<p>Latency workloads: {} counted calls on {} connections after {} warm-up calls each; \
         bulk: one flow for {:.0} s, rate per {} ms slice. Seed {}. Tolerance: mean and p50 \
         within 10 %, p90 and p99 within 15 % (bulk: the mean rate).</p>\n",
        plan.calls,
        plan.connections,
        plan.warmup_calls,
        plan.bulk_time.as_secs_f64(),
        SLICE.as_millis(),
        plan.seed
    );
    for (profile, rows) in &outcome.tables {
        html += &format!("<pre>{}</pre>\n", escape(&stats::render(profile, rows)));
    }
    for (profile, rows) in &outcome.tables {
        for c in rows {
            html += &format!(
                "<h2>{} on {}: {}</h2>\n",
                escape(&c.workload),
                escape(profile),
                stats::verdict(&c.failing())
            );
            let series: Vec<(String, Vec<(f64, f64)>)> = outcome
                .samples
                .iter()
                .filter(|s| &s.profile == profile && s.workload.name() == c.workload)
                .map(|s| (s.engine.as_str().to_string(), stats::cdf(&s.values, 500)))
                .collect();
            let x = format!("{}, {} (log scale)", c.kind.unit(), describe(c.kind));
            html += &cdf_plot(&series, &x)?;
        }
    }
    html += "</body></html>\n";
    Ok(html)
}

fn describe(kind: Kind) -> &'static str {
    match kind {
        Kind::Latency => "latency per call",
        Kind::Throughput => "rate per slice",
    }
}
