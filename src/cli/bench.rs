//! `faultrig bench`: drive RPC load against a server and report, optionally as a CSV row.
//!
//! Its flags are typed as they are parsed (each value parser names the flag on a bad value);
//! [`BenchArgs::validate`] puts them together into the load driver's [`BenchSpec`].

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{host_name, parse_flavour, run_id, CliError, CALL_TIMEOUT_TEXT};
use crate::bench::{BenchSpec, Mode, Stop, MAX_CALLS, MAX_CONCURRENCY, RATE_RANGE};
use crate::flavour::{Flavour, SocketOptions, WritePattern};
use crate::profile::CongestionControl;
use crate::results::ResultsWriter;
use crate::units;
use crate::workload::Workload;

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("stop").required(true).args(["calls", "duration"]))]
pub struct BenchArgs {
    /// RPC flavour: grpc, http1-json, http2-json, tcp-binary, thrift.
    #[arg(long, value_parser = parse_flavour)]
    pub flavour: &'static dyn Flavour,
    /// Server (or proxy) address, HOST:PORT.
    #[arg(long, value_parser = parse_target)]
    pub target: String,
    /// Connection mode: single, per-call, per-worker, pool:N.
    #[arg(long, value_parser = Mode::parse, default_value = "single")]
    pub mode: Mode,
    /// What each call carries: order, blob:SIZE (128B..16MiB), wide, deduct.
    #[arg(long, value_parser = Workload::parse, default_value = "order")]
    pub workload: Workload,
    /// Concurrent workers.
    #[arg(long, default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=MAX_CONCURRENCY as i64))]
    pub concurrency: u32,
    /// Total calls, shared among the workers.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_CALLS))]
    pub calls: Option<u64>,
    /// Measure for this long instead of a call count.
    #[arg(long, value_parser = parse_positive_duration)]
    pub duration: Option<Duration>,
    /// Run calls for this long first, unrecorded.
    #[arg(long, value_parser = units::parse_duration, default_value = "0s")]
    pub warmup: Duration,
    /// Open loop at this many calls per second (latency from each call's intended start).
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Limit for one call, connecting included.
    #[arg(long, value_parser = parse_positive_duration, default_value = CALL_TIMEOUT_TEXT.as_str())]
    pub timeout: Duration,
    /// Seed of the workload's data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Append the result row to this CSV file (header written when the file is new).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// The CSV's host column (default: this machine's name); several load hosts running at once
    /// against one target give their rows distinct hosts and the same round.
    #[arg(long)]
    pub host: Option<String>,
    /// The CSV's round column: the same number on every load host of one simultaneous run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub round: u32,
    /// The CSV's profile column: the network profile the target sits behind (bench only
    /// records it; the proxy applies it).
    #[arg(long)]
    pub profile_label: Option<String>,
    /// TCP_NODELAY on the client's sockets; false leaves Nagle's algorithm on.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub nodelay: bool,
    /// How a request is written: `one` send, or `split` (header and body as separate sends).
    #[arg(long, value_parser = WritePattern::parse, default_value = "one")]
    pub write_pattern: WritePattern,
    /// Pin this congestion control on the client's sockets (TCP_CONGESTION): cubic, bbr, reno.
    #[arg(long, value_parser = parse_congestion_control)]
    pub congestion_control: Option<CongestionControl>,
}

/// `bench`'s arguments, checked: the load to drive, and where its row goes.
pub struct Bench {
    spec: BenchSpec,
    /// Opened already: a path we cannot write is bad input, found before any traffic.
    csv: Option<(ResultsWriter, CsvLabels)>,
}

/// The columns of the CSV row the load driver cannot know.
struct CsvLabels {
    host: String,
    round: u32,
    profile: Option<String>,
}

impl BenchArgs {
    pub fn validate(self) -> Result<Bench, CliError> {
        let spec = BenchSpec {
            flavour: self.flavour,
            target: self.target,
            mode: self.mode,
            workload: self.workload,
            concurrency: self.concurrency as usize,
            stop: match (self.calls, self.duration) {
                (Some(n), _) => Stop::Calls(n),
                (None, Some(d)) => Stop::Duration(d),
                (None, None) => unreachable!("clap requires one of --calls and --duration"),
            },
            warmup: self.warmup,
            rate: self.rate,
            timeout: self.timeout,
            seed: self.seed,
            socket: SocketOptions {
                nodelay: self.nodelay,
                write_pattern: self.write_pattern,
                congestion: self.congestion_control,
                namespace: None,
            },
        };
        let csv = match &self.csv {
            Some(path) => {
                let writer = ResultsWriter::append(path).map_err(|e| {
                    CliError::Usage(format!("--csv {}: cannot write: {e}", path.display()))
                })?;
                let labels = CsvLabels {
                    host: self.host.unwrap_or_else(host_name),
                    round: self.round,
                    profile: self.profile_label,
                };
                Some((writer, labels))
            }
            None => None,
        };
        Ok(Bench { spec, csv })
    }
}

pub fn run(b: Bench) -> Result<(), CliError> {
    let Bench { spec, mut csv } = b;
    let outcome = bench_runtime()?.block_on(crate::bench::run(&spec));
    // A closed stdout (bench ... | head) must not turn a finished run into a panic.
    let _ = writeln!(std::io::stdout(), "{}", outcome.summary(&spec));
    if let Some((writer, labels)) = &mut csv {
        let mut row = outcome.row(&spec);
        row.run_id = run_id("bench");
        row.host = labels.host.clone();
        row.round = labels.round;
        row.profile = labels.profile.clone();
        writer.write(&row).map_err(|e| CliError::Failed(e.into()))?;
    }
    Ok(())
}

/// The load driver's runtime. On one core (a pinned client) a current-thread runtime avoids
/// the work-stealing scheduler's cross-thread wake-ups, which would be pure overhead there.
fn bench_runtime() -> Result<tokio::runtime::Runtime, CliError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut builder = if cores == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    builder
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(e.into()))
}

fn parse_congestion_control(s: &str) -> Result<CongestionControl, String> {
    CongestionControl::ALL
        .into_iter()
        .find(|c| c.as_str() == s)
        .ok_or_else(|| format!("unknown congestion control `{s}` (cubic, bbr or reno)"))
}

fn parse_target(s: &str) -> Result<String, String> {
    crate::net::split_host_port(s).map(|_| s.to_string())
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match units::parse_duration(s)? {
        d if d.is_zero() => Err("must be more than zero".into()),
        d => Ok(d),
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if RATE_RANGE.contains(&r) => Ok(r),
        _ => Err(format!(
            "\"{s}\" is not a number of calls per second from {} to {}",
            RATE_RANGE.start(),
            RATE_RANGE.end()
        )),
    }
}
