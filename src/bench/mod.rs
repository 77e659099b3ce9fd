//! The load driver: workers that make calls through a connection mode, in a closed loop (each
//! worker sends its next call when the last returns) or an open loop at a fixed rate, with every
//! reply checked and every call's outcome counted.
//!
//! In the open loop a call's latency runs from its *intended* start (call `i` is due at
//! `t0 + i/rate`), so a server that falls behind shows it in the latency instead of silently
//! lowering the offered load (no coordinated omission).

pub mod mode;
mod target;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hdrhistogram::Histogram;

use crate::flavour::{CallError, Failure, FailureCounts, SocketOptions, WireCounters};
use crate::results::{new_histogram, Row};
pub use mode::{Connections, Mode};
pub use target::{RigTarget, Session, Target};

/// Most concurrent workers (and pool connections) a cell may ask for.
pub(crate) const MAX_CONCURRENCY: usize = 100_000;
/// Most calls a cell may ask for: far past any run, and far from overflowing a call index.
pub(crate) const MAX_CALLS: u64 = 1_000_000_000_000;
/// The open loop's slowest and fastest rates, calls/s: call `i` is due at `i / rate`, which must
/// stay a time a clock can hold.
pub(crate) const RATE_RANGE: std::ops::RangeInclusive<f64> = 0.001..=10_000_000.0;
/// The limit for one call, connecting included, unless told otherwise (`bench --timeout`, an
/// experiment's `timeout`).
pub(crate) const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// When a cell's measured phase ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stop {
    /// After this many calls in total, shared among the workers.
    Calls(u64),
    /// After this long.
    Duration(Duration),
}

/// Everything that defines one cell's load.
#[derive(Clone)]
pub struct BenchSpec {
    /// What is called, and how each call is made and checked: one of our flavours with a
    /// workload ([`RigTarget`]), or a generic gRPC or HTTP target.
    pub load: Arc<dyn Target>,
    /// `HOST:PORT` of the server (or of a proxy in front of it).
    pub target: String,
    pub mode: Mode,
    /// Concurrent workers.
    pub concurrency: usize,
    pub stop: Stop,
    /// Calls made before measuring (to open connections and warm caches), not recorded.
    pub warmup: Duration,
    /// Open-loop rate in calls per second; `None` is a closed loop.
    pub rate: Option<f64>,
    /// Limit for one call, connect included.
    pub timeout: Duration,
    /// The seed the load was made with (the CSV's seed column).
    pub seed: u64,
    /// How the client's sockets are made (TCP_NODELAY, write pattern, congestion control,
    /// namespace).
    pub socket: SocketOptions,
}

/// What one measured phase produced.
#[derive(Debug)]
pub struct BenchOutcome {
    pub started_at: SystemTime,
    pub elapsed: Duration,
    pub calls: u64,
    pub ok: u64,
    /// Failures by kind.
    pub errors: FailureCounts,
    /// Latency of successful calls, µs.
    pub latency: Histogram<u64>,
    /// Connections opened during the phase, plus kept ones carried over from warm-up.
    pub conns_opened: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub payload_bytes: usize,
    /// The first few failures, for the summary.
    pub sample_errors: Vec<CallError>,
}

impl BenchOutcome {
    pub fn failed(&self) -> u64 {
        self.errors.total()
    }

    pub fn throughput(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The CSV row of this outcome; the caller fills run-level columns (run id, host, round,
    /// profile) and anything it measured elsewhere (proxy, server).
    pub fn row(&self, spec: &BenchSpec) -> Row {
        Row {
            flavour: spec.load.name().to_string(),
            mode: spec.mode.to_string(),
            workload: spec.load.label(),
            concurrency: spec.concurrency as u32,
            seed: spec.seed,
            nodelay: Some(spec.socket.nodelay),
            write_pattern: Some(spec.socket.write_pattern.as_str().to_string()),
            ..self.measured_row()
        }
    }

    /// The columns of what was measured (calls, outcomes, latency, time, connections, bytes),
    /// the rest left for the caller: one place for every row made of calls, whoever made
    /// them (an external flavour's client too).
    pub(crate) fn measured_row(&self) -> Row {
        let per_call = |bytes: u64| (self.calls > 0).then(|| bytes.div_ceil(self.calls));
        let mut row = Row {
            // Milliseconds: the report tells rows that ran at once from rows that ran one
            // after the other by these times.
            started_at: humantime::format_rfc3339_millis(self.started_at).to_string(),
            payload_bytes: self.payload_bytes as u64,
            calls: self.calls,
            ok: self.ok,
            failed: self.failed(),
            err_connect: self.errors.connect,
            err_timeout: self.errors.timeout,
            err_reset: self.errors.reset,
            err_protocol: self.errors.protocol,
            err_other: self.errors.other,
            elapsed_ms: self.elapsed.as_millis() as u64,
            throughput_rps: (self.throughput() * 100.0).round() / 100.0,
            conns_opened: self.conns_opened,
            req_bytes: per_call(self.bytes_out),
            resp_bytes: per_call(self.bytes_in),
            ..Row::default()
        };
        row.set_latency(&self.latency);
        row
    }

    /// A few human lines.
    pub fn summary(&self, spec: &BenchSpec) -> String {
        let mut s = format!(
            "{} {} {} concurrency {}: {} calls in {:.2} s ({:.1} calls/s), {} ok, {} failed",
            spec.load.name(),
            spec.mode,
            spec.load.label(),
            spec.concurrency,
            self.calls,
            self.elapsed.as_secs_f64(),
            self.throughput(),
            self.ok,
            self.failed()
        );
        if self.failed() > 0 {
            let kinds: Vec<String> = Failure::ALL
                .into_iter()
                .filter(|&k| self.errors[k] > 0)
                .map(|k| format!("{} {}", k.label(), self.errors[k]))
                .collect();
            s += &format!(" ({})", kinds.join(", "));
        }
        let h = &self.latency;
        if !h.is_empty() {
            s += &format!(
                "\n  latency µs: min {} mean {:.0} p50 {} p90 {} p99 {} p99.9 {} max {}",
                h.min(),
                h.mean(),
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.9),
                h.value_at_quantile(0.99),
                h.value_at_quantile(0.999),
                h.max()
            );
        }
        if let (Some(out), Some(inn)) = (
            self.bytes_out.checked_div(self.calls),
            self.bytes_in.checked_div(self.calls),
        ) {
            s += &format!(
                "\n  connections opened {}; on the wire per call: {out} B out, {inn} B in (payload {} B)",
                self.conns_opened, self.payload_bytes
            );
        }
        for e in &self.sample_errors {
            s += &format!("\n  e.g. {e}");
        }
        s
    }
}

/// What the workers of one phase share.
struct Phase {
    spec: BenchSpec,
    connections: Arc<Connections>,
    /// Next call index to claim, when the phase runs for a duration. A call-count phase
    /// stripes indices instead (worker `w` makes calls `w`, `w + C`, `w + 2C`, ...), so every
    /// worker makes its share and the same worker always sends the same calls.
    next: AtomicU64,
    start: Instant,
    deadline: Option<Instant>,
    limit: Option<u64>,
    /// Every worker's latencies, in batches of [`LATENCY_BATCH`]. One histogram, not one per
    /// worker: at 3 significant digits over an hour's range each is a few hundred KB, and 64
    /// of them turn every record into a cache miss (measured: more time than the JSON codec).
    latency: std::sync::Mutex<Histogram<u64>>,
}

/// Latencies a worker keeps before adding them to the phase's histogram under its lock.
const LATENCY_BATCH: usize = 64;

/// What one worker counted.
struct Tally {
    ok: u64,
    errors: FailureCounts,
    sample_errors: Vec<CallError>,
}

const SAMPLE_ERRORS: usize = 3;

/// Runs warm-up (if any), then the measured phase, and closes the connections.
pub async fn run(spec: &BenchSpec) -> BenchOutcome {
    run_with(spec, async {}).await.0
}

/// Like [`run`], awaiting `measuring` after the warm-up, right before the measured phase, and
/// returning its output too: the runner reads its proxy's and server's counters there, so they
/// cover the same calls as the row.
pub(crate) async fn run_with<T>(
    spec: &BenchSpec,
    measuring: impl std::future::Future<Output = T>,
) -> (BenchOutcome, T) {
    let wire = Arc::new(WireCounters::with_socket(spec.socket.clone()));
    let connections = Arc::new(Connections::new(
        spec.load.clone(),
        &spec.target,
        spec.mode,
        spec.concurrency,
        wire.clone(),
    ));
    if !spec.warmup.is_zero() {
        let warm = BenchSpec {
            stop: Stop::Duration(spec.warmup),
            ..spec.clone()
        };
        phase(&warm, connections.clone()).await;
    }
    let before = measuring.await;
    let carried = connections.open() as u64;
    let (opened, out, inn) = (
        wire.opened.load(Ordering::Relaxed),
        wire.bytes_out.load(Ordering::Relaxed),
        wire.bytes_in.load(Ordering::Relaxed),
    );
    let started_at = SystemTime::now();
    let start = Instant::now();
    let (tallies, latency) = phase(spec, connections.clone()).await;
    let elapsed = start.elapsed();
    connections.close().await;

    let mut outcome = BenchOutcome {
        started_at,
        elapsed,
        calls: 0,
        ok: 0,
        errors: FailureCounts::default(),
        latency,
        conns_opened: carried + wire.opened.load(Ordering::Relaxed) - opened,
        bytes_out: wire.bytes_out.load(Ordering::Relaxed) - out,
        bytes_in: wire.bytes_in.load(Ordering::Relaxed) - inn,
        payload_bytes: spec.load.payload_bytes(),
        sample_errors: Vec::new(),
    };
    for t in tallies {
        outcome.ok += t.ok;
        outcome.errors.add(&t.errors);
        for e in t.sample_errors {
            if outcome.sample_errors.len() < SAMPLE_ERRORS {
                outcome.sample_errors.push(e);
            }
        }
    }
    outcome.calls = outcome.ok + outcome.failed();
    (outcome, before)
}

async fn phase(spec: &BenchSpec, connections: Arc<Connections>) -> (Vec<Tally>, Histogram<u64>) {
    let start = Instant::now();
    let (deadline, limit) = match spec.stop {
        Stop::Calls(n) => (None, Some(n)),
        Stop::Duration(d) => (Some(start + d), None),
    };
    let shared = Arc::new(Phase {
        spec: spec.clone(),
        connections,
        next: AtomicU64::new(0),
        start,
        deadline,
        limit,
        latency: std::sync::Mutex::new(new_histogram()),
    });
    let workers: Vec<_> = (0..spec.concurrency.max(1))
        .map(|w| tokio::spawn(worker(shared.clone(), w)))
        .collect();
    let mut tallies = Vec::with_capacity(workers.len());
    for w in workers {
        tallies.push(w.await.expect("a worker never panics"));
    }
    let latency = std::mem::replace(
        &mut *shared.latency.lock().unwrap_or_else(|e| e.into_inner()),
        new_histogram(),
    );
    (tallies, latency)
}

/// `after` from now, or as far ahead as tokio's own timers go (about 30 years) when that is
/// past what an `Instant` holds. The command line and experiment files bound a timeout to under
/// a year, but a `BenchSpec` built in code may carry any `Duration`, as `tokio::time::timeout`
/// took one.
fn deadline_after(after: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30))
}

async fn worker(phase: Arc<Phase>, id: usize) -> Tally {
    let spec = &phase.spec;
    let mut tally = Tally {
        ok: 0,
        errors: FailureCounts::default(),
        sample_errors: Vec::new(),
    };
    let mut latencies = Vec::with_capacity(LATENCY_BATCH);
    let record = |latencies: &mut Vec<u64>| {
        let mut h = phase.latency.lock().unwrap_or_else(|e| e.into_inner());
        for micros in latencies.drain(..) {
            h.saturating_record(micros);
        }
    };
    let stride = spec.concurrency.max(1) as u64;
    let mut striped = id as u64;
    // One timer for all of a worker's calls, pushed later before each: moving a registered
    // deadline later is an atomic store in tokio, where a `timeout` per call took the timer
    // wheel's lock to register and again to cancel.
    let limit = tokio::time::sleep(spec.timeout);
    tokio::pin!(limit);
    loop {
        let index = match phase.limit {
            Some(limit) => {
                let index = striped;
                striped += stride;
                if index >= limit {
                    break;
                }
                index
            }
            None => phase.next.fetch_add(1, Ordering::Relaxed),
        };
        let start = match spec.rate {
            Some(rate) => {
                let due = phase.start + Duration::from_secs_f64(index as f64 / rate);
                if phase.deadline.is_some_and(|d| due >= d) {
                    break;
                }
                crate::timer::sleep_until_yielding(due).await;
                due
            }
            None => {
                let now = Instant::now();
                if phase.deadline.is_some_and(|d| now >= d) {
                    break;
                }
                now
            }
        };
        let mut leased = None;
        limit.as_mut().reset(deadline_after(spec.timeout));
        let call = async {
            let lease = phase.connections.lease(id).await?;
            let session = lease.session.clone();
            leased = Some(lease);
            session.call(index, id).await
        };
        let outcome = tokio::select! {
            biased;
            checked = call => checked,
            () = limit.as_mut() => Err(CallError::new(
                Failure::Timeout,
                format!("no reply within {:?}", spec.timeout),
            )),
        };
        match outcome {
            Ok(()) => {
                let micros = start.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
                latencies.push(micros.max(1));
                if latencies.len() == LATENCY_BATCH {
                    record(&mut latencies);
                }
                tally.ok += 1;
            }
            Err(e) => {
                // A reset connection is gone; one that timed out or answered wrongly while
                // carrying one exchange at a time (HTTP/1.1) is mid-exchange. Neither is reused.
                if let Some(lease) = &leased {
                    if e.kind == Failure::Reset || !lease.session.multiplexed() {
                        phase.connections.discard(lease).await;
                    }
                }
                tally.errors[e.kind] += 1;
                if tally.sample_errors.len() < SAMPLE_ERRORS {
                    tally.sample_errors.push(e);
                }
            }
        }
    }
    record(&mut latencies);
    tally
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_limit_past_what_an_instant_holds_saturates() {
        let now = tokio::time::Instant::now();
        assert!(deadline_after(Duration::MAX) > now + Duration::from_secs(86_400 * 365 * 29));
        let soon = deadline_after(Duration::from_millis(5));
        assert!(soon >= now + Duration::from_millis(5) && soon < now + Duration::from_secs(60));
    }
}
