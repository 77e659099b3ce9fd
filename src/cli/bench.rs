//! `faultrig bench`: drive RPC load against a server and report, optionally as a CSV row.
//!
//! Its flags are typed as they are parsed (each value parser names the flag on a bad value);
//! [`BenchArgs::validate`] puts them together into the load driver's [`BenchSpec`]: one of our
//! flavours with a workload, or a generic gRPC service or HTTP endpoint ([`crate::target`]),
//! whose protos are compiled (or fetched by reflection) there, before any load.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::{host_name, parse_flavour, run_id, CliError, CALL_TIMEOUT_TEXT};
use crate::bench::{
    BenchSpec, Mode, RigTarget, Stop, Target, MAX_CALLS, MAX_CONCURRENCY, RATE_RANGE,
};
use crate::flavour::{Flavour, SocketOptions, WritePattern};
use crate::profile::CongestionControl;
use crate::results::ResultsWriter;
use crate::target::{GrpcTargetSpec, HttpTargetSpec};
use crate::units;
use crate::workload::Workload;

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("stop").required(true).args(["calls", "duration"]))]
pub struct BenchArgs {
    /// RPC flavour: grpc, http1-json, http2-json, tcp-binary, thrift; or http (a generic HTTP
    /// endpoint, with --url). grpc with --call is a generic gRPC service.
    #[arg(long, value_parser = parse_bench_flavour)]
    pub flavour: BenchFlavour,
    /// Server (or proxy) address, HOST:PORT. With --url: the URL's HOST:PORT unless given.
    #[arg(long, value_parser = parse_target)]
    pub target: Option<String>,
    /// Connection mode: single, per-call, per-worker, pool:N.
    #[arg(long, value_parser = Mode::parse, default_value = "single")]
    pub mode: Mode,
    /// What each call carries: order, blob:SIZE (128B..16MiB), wide, deduct.
    #[arg(long, value_parser = Workload::parse, default_value = "order",
          conflicts_with_all = ["call", "url"])]
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
    #[command(flatten)]
    pub grpc: GrpcTargetSpec,
    #[command(flatten)]
    pub http: HttpTargetSpec,
}

/// `bench --flavour`: one of our flavours, or `http` (a generic HTTP endpoint).
#[derive(Clone, Copy, Debug)]
pub enum BenchFlavour {
    Rig(&'static dyn Flavour),
    Http,
}

fn parse_bench_flavour(s: &str) -> Result<BenchFlavour, String> {
    if s == "http" {
        return Ok(BenchFlavour::Http);
    }
    parse_flavour(s)
        .map(BenchFlavour::Rig)
        .map_err(|e| format!("{e}, or http with --url"))
}

/// `bench`'s arguments, checked: the load to drive, and where its row goes.
pub(crate) struct Bench {
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
    pub(crate) fn validate(self) -> Result<Bench, CliError> {
        // Opened first: a path we cannot write is found before a reflection round trip.
        let csv = match &self.csv {
            Some(path) => {
                let writer = ResultsWriter::append(path).map_err(|e| {
                    CliError::Usage(format!("--csv {}: cannot write: {e}", path.display()))
                })?;
                let labels = CsvLabels {
                    host: self.host.clone().unwrap_or_else(host_name),
                    round: self.round,
                    profile: self.profile_label.clone(),
                };
                Some((writer, labels))
            }
            None => None,
        };
        let (load, target) = self.load()?;
        let spec = BenchSpec {
            load,
            target,
            mode: self.mode,
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
        Ok(Bench { spec, csv })
    }

    /// What the load calls, and the address it connects to.
    fn load(&self) -> Result<(Arc<dyn Target>, String), CliError> {
        let usage = |e: crate::target::TargetError| CliError::Usage(e.to_string());
        let target = || {
            self.target
                .clone()
                .ok_or_else(|| CliError::Usage("--target HOST:PORT is required".into()))
        };
        match self.flavour {
            BenchFlavour::Http => {
                if self.http.url.is_none() {
                    return Err(CliError::Usage(
                        "--flavour http drives a generic HTTP endpoint: give it --url URL".into(),
                    ));
                }
                let (load, url_addr) = self.http.resolve(self.seed).map_err(usage)?;
                let addr = self.target.clone().unwrap_or(url_addr);
                Ok((Arc::new(load), addr))
            }
            BenchFlavour::Rig(f) if self.http.url.is_some() => Err(CliError::Usage(format!(
                "--url drives a generic HTTP endpoint: use it with --flavour http, not {}",
                f.name()
            ))),
            BenchFlavour::Rig(f) if self.grpc.is_set() => {
                if f.name() != crate::flavour::grpc::Grpc.name() {
                    return Err(CliError::Usage(format!(
                        "--call, --proto and --reflect drive a generic gRPC service: use them \
                         with --flavour grpc, not {}",
                        f.name()
                    )));
                }
                let addr = target()?;
                // Reflection is a network round trip: done here, on a runtime of its own, so
                // bad input is still found before any load.
                let load = bench_runtime()?
                    .block_on(self.grpc.resolve(&addr, self.seed, self.timeout))
                    .map_err(usage)?;
                Ok((Arc::new(load), addr))
            }
            BenchFlavour::Rig(f) => Ok((
                Arc::new(RigTarget::new(f, self.workload, self.seed)),
                target()?,
            )),
        }
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
