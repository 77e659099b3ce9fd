//! The command line: every flag is defined here, once. `main.rs` parses and calls [`run`].
//!
//! Exit codes: 0 success, 1 a runtime failure, 2 bad input (a flag, a profile, an address),
//! always reported before any traffic is sent, in one message naming what was wrong.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::bench::{BenchSpec, Mode, Stop};
use crate::flavour::{self, Flavour, SocketOptions, WritePattern};
use crate::link::{Engine, NamespaceError};
use crate::profile::{CongestionControl, Profile};
use crate::proxy::{Proxy, ProxyOptions, DEFAULT_WINDOW, MAX_WINDOW};
use crate::report::gate::Assertion;
use crate::report::{compare, RoundSummary, Table};
use crate::service::{Downstream, RigService};
use crate::units;
use crate::workload::Workload;

#[derive(Debug, Parser)]
#[command(
    name = "faultrig",
    version,
    about = "A network fault-injection test rig"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an experiment: servers, proxies and every cell, then the report (the main job).
    Run(Box<RunArgs>),
    /// Print the comparison table of results CSVs (from one run or many runs and hosts).
    Report(ReportArgs),
    /// Run a fault proxy between clients and one upstream server, or (--api) a Toxiproxy-style
    /// control API hosting any number of named proxies.
    Proxy(ProxyArgs),
    /// Talk to a control API (`faultrig proxy --api`): list, create, toxics, reset, metrics.
    Ctl(CtlArgs),
    /// Run an RPC server of one flavour.
    Serve(ServeArgs),
    /// Drive RPC load against a server (directly or through a proxy) and report.
    Bench(BenchArgs),
    /// Run a command in a fresh network namespace whose traffic to this host crosses the link
    /// engine (real packets, real kernel TCP); the host is at $FAULTRIG_HOST inside.
    Shell(ShellArgs),
    /// Run the same workloads through the fault model and the kernel engine side by side, and
    /// compare them: a table per profile, calibrate.csv and calibrate.html; exit 1 when a ratio
    /// is out of tolerance. Needs CAP_NET_ADMIN.
    Calibrate(CalibrateArgs),
    /// List, show and check network profiles.
    Profiles {
        #[command(subcommand)]
        action: Option<ProfilesAction>,
    },
    /// Runs PROGRAM until it exits, or until the process --parent dies (then stops it): how
    /// `faultrig run` ties a redis-server's life to its own.
    #[command(hide = true)]
    Supervise {
        #[arg(long = "parent")]
        parent: u32,
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        program: Vec<String>,
    },
}

/// What to check and write after a report: shared by `run` and `report`, so the two take the
/// same flags with the same meaning.
#[derive(Debug, Args)]
pub struct ReportFlags {
    /// A gate: exit 1 unless every cell it applies to meets EXPR, e.g. 'p99 < 300ms',
    /// 'failed == 0', 'per-call/single < 3' (repeat for more; README, "Gates").
    #[arg(long = "assert", value_name = "EXPR", value_parser = Assertion::parse)]
    pub assert: Vec<Assertion>,
    /// Write the summary (every cell's figures, the findings, the gates) as JSON to FILE; `-`
    /// prints it on standard output in place of the text table.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Results CSV files.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Also write a self-contained HTML report (tables and SVG plots) to this file.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// How a cell's rounds are combined: mean (total time averaged, histograms merged) or
    /// median (the round with the median total time stands for the cell).
    #[arg(long, value_parser = RoundSummary::parse, default_value = "mean")]
    pub rounds: RoundSummary,
    /// Results CSV(s) to compare against: per-cell deltas of p50, p99, calls/s and failures,
    /// regressions flagged (repeat for more files).
    #[arg(long, value_name = "OLD.csv")]
    pub baseline: Vec<PathBuf>,
    /// With --baseline: how far p50 or p99 may rise, or calls/s fall, before it is a
    /// regression (a larger share of failed calls always is).
    #[arg(long, value_parser = compare::parse_threshold, default_value = "10%",
          requires = "baseline")]
    pub threshold: f64,
    /// With --baseline: exit 1 when any cell regressed.
    #[arg(long, requires = "baseline")]
    pub fail_on_regression: bool,
    #[command(flatten)]
    pub flags: ReportFlags,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Experiment file (scripts/*.toml); without one, the built-in lan-compare experiment.
    pub experiment: Option<PathBuf>,
    /// Override the file's profiles (comma-separated names or files).
    #[arg(long, value_delimiter = ',')]
    pub profiles: Option<Vec<String>>,
    /// Override the file's flavours (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub flavours: Option<Vec<String>>,
    /// Override the file's modes (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub modes: Option<Vec<String>>,
    /// Override the file's workloads (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub workloads: Option<Vec<String>>,
    /// Override the file's concurrency levels (comma-separated).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub concurrency: Option<Vec<i64>>,
    /// Override the calls per cell (replaces the file's duration).
    #[arg(long, allow_negative_numbers = true, conflicts_with = "duration")]
    pub calls: Option<i64>,
    /// Override the measured time per cell (replaces the file's calls).
    #[arg(long)]
    pub duration: Option<String>,
    /// Override the unrecorded warm-up before each cell.
    #[arg(long)]
    pub warmup: Option<String>,
    /// Override the limit for one call.
    #[arg(long)]
    pub timeout: Option<String>,
    /// Override the rounds.
    #[arg(long, allow_negative_numbers = true)]
    pub rounds: Option<i64>,
    /// Override how the report combines rounds: mean or median.
    #[arg(long)]
    pub round_summary: Option<String>,
    /// Override the seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override the engine: `model` (the fault model), `kernel` (each proxied connection
    /// crosses real kernel TCP over the link engine) or `link` (no proxy: servers and load
    /// driver in two namespaces, their own sockets across the link engine). The last two need
    /// CAP_NET_ADMIN.
    #[arg(long)]
    pub engine: Option<String>,
    /// Override the nodelay axis: TCP_NODELAY on client and server sockets (comma-separated:
    /// true, false).
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, num_args = 1)]
    pub nodelay: Option<Vec<bool>>,
    /// Override the write_pattern axis (comma-separated: one, split).
    #[arg(long, value_delimiter = ',')]
    pub write_pattern: Option<Vec<String>>,
    /// Results directory; each run writes OUT/RUN_ID/results.csv.
    #[arg(long, default_value = "out")]
    pub out: PathBuf,
    /// The CSV's host column (default: this machine's name).
    #[arg(long)]
    pub host: Option<String>,
    #[command(flatten)]
    pub report: ReportFlags,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// RPC flavour: grpc, http1-json, http2-json, tcp-binary, thrift.
    #[arg(long, value_parser = parse_flavour)]
    pub flavour: &'static dyn Flavour,
    /// Address to serve on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Serve the listening TCP socket given as standard input instead of binding --listen
    /// (inetd-style; `faultrig run --engine link` hands each server a socket made in the link's
    /// namespace this way).
    #[arg(long, conflicts_with = "listen")]
    pub listen_stdin: bool,
    /// TCP_NODELAY on accepted connections; false leaves Nagle's algorithm on.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub nodelay: bool,
    /// Stock each SKU starts with, for Deduct.
    #[arg(long, default_value_t = crate::service::DEFAULT_STOCK)]
    pub stock: i64,
    /// What Deduct does after the stock update: none, sleep:DUR, or redis://HOST:PORT (a Redis
    /// DECRBY per call).
    #[arg(long, value_parser = Downstream::parse, default_value = "none")]
    pub downstream: Downstream,
    /// Most connections at once; more are accepted and reset. Default 65536, lowered to what
    /// the file-descriptor limit leaves room for; a value given here is used as is.
    #[arg(long, value_parser = parse_max_connections)]
    pub max_connections: Option<usize>,
    /// Exit when this process (the runner that started the server) dies.
    #[arg(long, hide = true)]
    pub parent: Option<u32>,
}

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
          value_parser = clap::value_parser!(u32).range(1..=crate::bench::MAX_CONCURRENCY as i64))]
    pub concurrency: u32,
    /// Total calls, shared among the workers.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=crate::bench::MAX_CALLS))]
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
    #[arg(long, value_parser = parse_positive_duration, default_value = "10s")]
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

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Address to accept clients on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Address of the server to forward to (HOST:PORT). With --api, optional: it creates the
    /// proxy --name on --listen at start.
    #[arg(long, required_unless_present = "api")]
    pub upstream: Option<String>,
    /// Serve the control API (Toxiproxy's REST API and /metrics) on this address (default
    /// 127.0.0.1:8474; it binds another interface only when named here).
    #[arg(long, num_args = 0..=1, default_missing_value = "127.0.0.1:8474")]
    pub api: Option<SocketAddr>,
    /// With --api: proxies to create at start, a JSON array in Toxiproxy's config shape
    /// ([{"name", "listen", "upstream", "enabled"}]); each may carry "toxics" (a list of
    /// toxics as POST /proxies/NAME/toxics takes them), in force before it listens.
    #[arg(long, requires = "api")]
    pub config: Option<PathBuf>,
    /// Built-in profile name or path to a profile file (.toml).
    #[arg(long, default_value = "local")]
    pub profile: String,
    /// Run seed: the same seed replays the same fault schedule.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Bytes buffered per direction before the proxy stops reading (e.g. 4MiB).
    #[arg(long, value_parser = parse_window, default_value_t = DEFAULT_WINDOW)]
    pub window: usize,
    /// Give up connecting to the upstream after this long.
    #[arg(long, value_parser = units::parse_duration, default_value = "5s")]
    pub connect_timeout: Duration,
    /// Name of this proxy in logs; also keys its fault RNG streams.
    #[arg(long, default_value = "proxy")]
    pub name: String,
    /// Most client connections at once (per proxy, with --api); more are accepted and reset.
    /// Default 65536, lowered to what the file-descriptor limit leaves room for (two each); a
    /// value given here is used as is.
    #[arg(long, value_parser = parse_max_connections)]
    pub max_connections: Option<usize>,
    /// How the network is emulated: `model` (the fault model: deterministic, unprivileged) or
    /// `kernel` (each connection crosses real kernel TCP over the link engine; needs
    /// CAP_NET_ADMIN). With --api it is the --upstream proxy's; a proxy created over the API
    /// or in --config names its own (`"engine": "kernel"`), and its toxics retune the link.
    #[arg(long, value_parser = Engine::parse, default_value = "model")]
    pub engine: Engine,
}

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Profiles (comma-separated names or files); default: lossy-10ms-1pct, wan, bursty,
    /// clean-10ms, or with --quick lossy-10ms-1pct.
    #[arg(long, value_delimiter = ',')]
    pub profiles: Option<Vec<String>>,
    /// Workloads (comma-separated): order, 3seg, 16k, 64k, 1m, per-call, bulk; default all, or
    /// with --quick order, 3seg, 16k, per-call, bulk.
    #[arg(long, value_delimiter = ',', value_parser = crate::calibrate::Workload::parse)]
    pub workloads: Option<Vec<crate::calibrate::Workload>>,
    /// Counted calls per latency workload and engine, over all connections (default 1000, with
    /// --quick 1500).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=crate::bench::MAX_CALLS))]
    pub calls: Option<u64>,
    /// Concurrent connections per latency workload (default 4, with --quick 6).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub connections: Option<u32>,
    /// Seed of the model's and the link's fault draws, and of the bootstrap.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The CI suite: lossy-10ms-1pct only, five workloads, a 4 s bulk flow (about 3 minutes).
    #[arg(long)]
    pub quick: bool,
    /// Directory for calibrate.csv and calibrate.html.
    #[arg(long, default_value = "out/calibrate")]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct ShellArgs {
    /// Built-in profile name or path to a profile file (.toml).
    #[arg(long, default_value = "lossy-10ms-1pct")]
    pub profile: String,
    /// Seed of the link's random streams: the same seed drops the same packet ordinals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The command and its arguments (after `--`).
    #[arg(required = true, last = true)]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Address of the control API.
    #[arg(long, default_value = "127.0.0.1:8474", global = true)]
    pub api: String,
    #[command(subcommand)]
    pub action: CtlAction,
}

#[derive(Debug, Subcommand)]
pub enum CtlAction {
    /// List the proxies with their toxics.
    List,
    /// Create a proxy.
    Create {
        name: String,
        #[arg(long)]
        upstream: String,
        /// Where it listens (port 0: a free port, printed in the answer).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Create it without listening.
        #[arg(long)]
        disabled: bool,
    },
    /// Delete a proxy (closing its connections).
    Delete { name: String },
    /// Start listening again.
    Enable { name: String },
    /// Close the listener and every connection.
    Disable { name: String },
    /// Add, update, remove or list toxics.
    Toxic {
        #[command(subcommand)]
        action: ToxicAction,
    },
    /// Enable every proxy and remove every toxic.
    Reset,
    /// Print the Prometheus metrics.
    Metrics,
}

#[derive(Debug, Subcommand)]
pub enum ToxicAction {
    /// Add a toxic: `toxic add PROXY --type latency -a latency=100 -a jitter=10`.
    Add {
        proxy: String,
        /// latency, bandwidth, slow_close, timeout, reset_peer, slicer, limit_data, loss,
        /// syn_loss, profile, noop.
        #[arg(long = "type")]
        kind: String,
        /// Name (default TYPE_STREAM).
        #[arg(long)]
        name: Option<String>,
        /// upstream (client to server) or downstream.
        #[arg(long, default_value = "downstream")]
        stream: String,
        /// Share of connections that suffer it, 0..1.
        #[arg(long, default_value_t = 1.0)]
        toxicity: f64,
        /// An attribute, KEY=VALUE (repeat for more).
        #[arg(short = 'a', long = "attr", value_parser = parse_attribute)]
        attributes: Vec<(String, serde_json::Value)>,
    },
    /// Change a toxic's attributes or toxicity; the rest stay.
    Update {
        proxy: String,
        toxic: String,
        #[arg(long)]
        toxicity: Option<f64>,
        #[arg(short = 'a', long = "attr", value_parser = parse_attribute)]
        attributes: Vec<(String, serde_json::Value)>,
    },
    /// Remove a toxic.
    Remove { proxy: String, toxic: String },
    /// List a proxy's toxics.
    List { proxy: String },
}

/// `KEY=VALUE`, the value a JSON number when it reads as one, else a string.
fn parse_attribute(s: &str) -> Result<(String, serde_json::Value), String> {
    let (k, v) = s
        .split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("\"{s}\" is not KEY=VALUE"))?;
    let value = serde_json::from_str::<serde_json::Number>(v)
        .map(serde_json::Value::Number)
        .unwrap_or_else(|_| serde_json::Value::String(v.to_string()));
    Ok((k.to_string(), value))
}

#[derive(Debug, Subcommand)]
pub enum ProfilesAction {
    /// List the built-in profiles (the default).
    List,
    /// Print a profile's effective values, defaults filled in, as a profile file.
    Show {
        /// Built-in name or path to a .toml file.
        profile: String,
    },
    /// Validate profile files.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

fn parse_flavour(s: &str) -> Result<&'static dyn Flavour, String> {
    flavour::by_name(s).ok_or_else(|| {
        format!(
            "unknown flavour \"{s}\" (use {})",
            flavour::names().join(", ")
        )
    })
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
    let range = crate::bench::RATE_RANGE;
    match s.parse::<f64>() {
        Ok(r) if range.contains(&r) => Ok(r),
        _ => Err(format!(
            "\"{s}\" is not a number of calls per second from {} to {}",
            range.start(),
            range.end()
        )),
    }
}

fn parse_window(s: &str) -> Result<usize, String> {
    match units::parse_size(s)? {
        n if n == 0 || n > MAX_WINDOW as u64 => Err(format!(
            "\"{s}\" is not a window from 1 B to {} MiB",
            MAX_WINDOW >> 20
        )),
        n => Ok(n as usize),
    }
}

/// A connection cap: 1 to 10,000,000 (more than any descriptor limit allows).
fn parse_max_connections(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=10_000_000).contains(&n) => Ok(n),
        _ => Err(format!(
            "\"{s}\" is not a connection count from 1 to 10000000"
        )),
    }
}

/// What went wrong, and so which exit code to use.
#[derive(Debug)]
pub enum CliError {
    /// Bad input: exit code 2.
    Usage(String),
    /// Something failed while running: exit code 1.
    Failed(anyhow::Error),
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(m) => write!(f, "{m}"),
            CliError::Failed(e) => write!(f, "{e:#}"),
        }
    }
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Run(args) => run_experiment(*args),
        Command::Report(args) => report(args),
        Command::Proxy(args) if args.api.is_some() => control_api(args),
        Command::Proxy(args) => proxy(args),
        Command::Ctl(args) => ctl(args),
        Command::Serve(args) => serve(args),
        Command::Bench(args) => bench(args),
        Command::Shell(args) => shell(args),
        Command::Calibrate(args) => calibrate(args),
        Command::Profiles { action } => profiles(action.unwrap_or(ProfilesAction::List)),
        Command::Supervise { parent, program } => supervise(parent, &program),
    }
}

/// A proxy runs the model or the kernel engine, and the model cannot honour packet-only keys.
fn check_engine(engine: Engine, profile: &Profile, origin: &str) -> Result<(), CliError> {
    match engine {
        Engine::Link => Err(CliError::Usage(
            "--engine link: a proxy runs the `model` or `kernel` engine; `link` (no proxy at all) \
             is for `faultrig run`"
                .into(),
        )),
        Engine::Model => profile
            .check_model_engine(origin)
            .map_err(|e| CliError::Usage(format!("--profile: {e}"))),
        Engine::Kernel => Ok(()),
    }
}

/// A namespace that could not be made: the missing privilege is the user's to fix (exit 2).
fn namespace_error(e: NamespaceError) -> CliError {
    match e {
        NamespaceError::Privilege(_) => CliError::Usage(e.to_string()),
        e => CliError::Failed(e.into()),
    }
}

/// `faultrig supervise`: PROGRAM's exit status becomes ours; a SIGTERM (sent by the kernel when
/// the parent dies, or by the parent's drop guard) stops PROGRAM first.
fn supervise(parent: u32, program: &[String]) -> Result<(), CliError> {
    crate::child::die_with_parent(parent).map_err(|e| CliError::Failed(anyhow::anyhow!(e)))?;
    runtime()?.block_on(async {
        let stop = shutdown_signal();
        let mut child = tokio::process::Command::new(&program[0])
            .args(&program[1..])
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| CliError::Failed(anyhow::anyhow!("start {}: {e}", program[0])))?;
        let status = tokio::select! {
            status = child.wait() => status,
            _ = stop => {
                if let Some(pid) = child.id() {
                    let pid = nix::unistd::Pid::from_raw(pid as i32);
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                }
                child.wait().await
            }
        }
        .map_err(|e| CliError::Failed(e.into()))?;
        match status.code() {
            Some(0) => Ok(()),
            _ => Err(CliError::Failed(anyhow::anyhow!(
                "{} exited ({status})",
                program[0]
            ))),
        }
    })
}

fn load_profile(name: &str, flag: &str) -> Result<Profile, CliError> {
    Profile::load(name).map_err(|e| CliError::Usage(format!("{flag}: {e}")))
}

fn profiles(action: ProfilesAction) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match action {
        ProfilesAction::List => {
            for name in Profile::builtin_names() {
                let p = Profile::builtin(name).expect("listed");
                let _ = writeln!(out, "{name:<18} {}", p.description);
            }
        }
        ProfilesAction::Show { profile } => {
            let p = load_profile(&profile, "profiles show")?;
            let _ = write!(out, "{p}");
        }
        ProfilesAction::Check { files } => {
            for file in files {
                let p = Profile::load_file(&file).map_err(|e| CliError::Usage(e.to_string()))?;
                let _ = writeln!(out, "{}: ok ({})", file.display(), p.name);
            }
        }
    }
    Ok(())
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(e.into()))
}

fn proxy(args: ProxyArgs) -> Result<(), CliError> {
    let profile = load_profile(&args.profile, "--profile")?;
    check_engine(args.engine, &profile, &args.profile)?;
    let options = ProxyOptions {
        name: args.name.clone(),
        seed: args.seed,
        window: args.window,
        connect_timeout: args.connect_timeout,
        max_connections: args.max_connections,
    };
    let rt = runtime()?;
    let upstream = args
        .upstream
        .expect("clap requires --upstream without --api");
    rt.block_on(async move {
        let listener = listen(args.listen, |local| {
            format!(
                "faultrig proxy {} listening on {local} -> {} (profile {}, seed {})",
                args.name, upstream, profile.name, args.seed
            )
        })?;
        let proxy = Proxy::new(upstream, profile, options);
        let proxy = match args.engine {
            Engine::Kernel => proxy.with_kernel_engine().await.map_err(namespace_error)?,
            _ => proxy,
        };
        let stats = proxy.stats();
        proxy
            .run(listener, shutdown_signal())
            .await
            .map_err(|e| CliError::Failed(e.into()))?;
        let s = stats.snapshot();
        tracing::info!(
            connections = s.connections,
            bytes_up = s.bytes_up,
            bytes_down = s.bytes_down,
            stalls_up = s.stalls_up,
            stalls_down = s.stalls_down,
            connect_failures = s.connect_failures,
            "proxy stopped"
        );
        Ok(())
    })
}

/// `faultrig proxy --api`: the control API, with the proxies of `--config` and `--upstream`.
fn control_api(args: ProxyArgs) -> Result<(), CliError> {
    use crate::api::{ProxySpec, Registry, RegistryOptions};
    let profile = load_profile(&args.profile, "--profile")?;
    check_engine(args.engine, &profile, &args.profile)?;
    // Everything given at start is checked before anything listens.
    let mut specs = Vec::new();
    if let Some(path) = &args.config {
        let bad = |e: String| CliError::Usage(format!("--config {}: {e}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let list = value
            .as_array()
            .ok_or_else(|| bad("expected a JSON array of proxies".into()))?;
        for (i, v) in list.iter().enumerate() {
            specs.push(ProxySpec::from_json(v, Some(i)).map_err(|e| bad(e.message))?);
        }
    }
    if let Some(upstream) = &args.upstream {
        specs.push(ProxySpec {
            name: args.name.clone(),
            listen: args.listen.to_string(),
            upstream: upstream.clone(),
            enabled: true,
            base: profile,
            engine: args.engine,
            toxics: None,
        });
    }
    let registry = std::sync::Arc::new(Registry::new(RegistryOptions {
        seed: args.seed,
        window: args.window,
        connect_timeout: args.connect_timeout,
        max_connections: args.max_connections,
    }));
    let addr = args.api.expect("called with --api");
    runtime()?.block_on(async move {
        let listener = crate::net::bind(addr)
            .map_err(|e| CliError::Usage(format!("--api {addr}: cannot listen: {e}")))?;
        if !specs.is_empty() {
            let created = registry.populate(specs).await.map_err(|(e, _)| {
                CliError::Usage(format!("creating the proxies: {}", e.message))
            })?;
            for p in created["proxies"].as_array().into_iter().flatten() {
                println!(
                    "proxy {} listening on {} -> {}",
                    p["name"].as_str().unwrap_or_default(),
                    p["listen"].as_str().unwrap_or_default(),
                    p["upstream"].as_str().unwrap_or_default()
                );
            }
        }
        let local = listener
            .local_addr()
            .map_err(|e| CliError::Failed(e.into()))?;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "faultrig proxy control API listening on {local}");
        let _ = out.flush();
        crate::api::run(listener, registry, shutdown_signal())
            .await
            .map_err(|e| CliError::Failed(e.into()))
    })
}

/// `faultrig ctl`: one request to the control API, its answer printed as JSON.
fn ctl(args: CtlArgs) -> Result<(), CliError> {
    use crate::api::client::{self, ClientError};
    use http::Method;
    use serde_json::{json, Map, Value};
    let segment = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let attrs = |list: Vec<(String, Value)>| Value::Object(list.into_iter().collect::<Map<_, _>>());
    let (method, path, body) = match args.action {
        CtlAction::List => (Method::GET, "/proxies".to_string(), None),
        CtlAction::Create {
            name,
            upstream,
            listen,
            disabled,
        } => (
            Method::POST,
            "/proxies".into(),
            Some(
                json!({"name": name, "upstream": upstream, "listen": listen, "enabled": !disabled}),
            ),
        ),
        CtlAction::Delete { name } => {
            (Method::DELETE, format!("/proxies/{}", segment(&name)), None)
        }
        CtlAction::Enable { name } => (
            Method::POST,
            format!("/proxies/{}", segment(&name)),
            Some(json!({"enabled": true})),
        ),
        CtlAction::Disable { name } => (
            Method::POST,
            format!("/proxies/{}", segment(&name)),
            Some(json!({"enabled": false})),
        ),
        CtlAction::Reset => (Method::POST, "/reset".into(), None),
        CtlAction::Metrics => {
            let text = runtime()?
                .block_on(client::get_text(&args.api, "/metrics"))
                .map_err(|e| CliError::Failed(e.into()))?;
            print!("{text}");
            return Ok(());
        }
        CtlAction::Toxic { action } => match action {
            ToxicAction::Add {
                proxy,
                kind,
                name,
                stream,
                toxicity,
                attributes,
            } => {
                let mut body = json!({
                    "type": kind,
                    "stream": stream,
                    "toxicity": toxicity,
                    "attributes": attrs(attributes),
                });
                if let Some(n) = name {
                    body["name"] = json!(n);
                }
                (
                    Method::POST,
                    format!("/proxies/{}/toxics", segment(&proxy)),
                    Some(body),
                )
            }
            ToxicAction::Update {
                proxy,
                toxic,
                toxicity,
                attributes,
            } => {
                let mut body = json!({"attributes": attrs(attributes)});
                if let Some(t) = toxicity {
                    body["toxicity"] = json!(t);
                }
                (
                    Method::PATCH,
                    format!("/proxies/{}/toxics/{}", segment(&proxy), segment(&toxic)),
                    Some(body),
                )
            }
            ToxicAction::Remove { proxy, toxic } => (
                Method::DELETE,
                format!("/proxies/{}/toxics/{}", segment(&proxy), segment(&toxic)),
                None,
            ),
            ToxicAction::List { proxy } => (
                Method::GET,
                format!("/proxies/{}/toxics", segment(&proxy)),
                None,
            ),
        },
    };
    match runtime()?.block_on(client::request(&args.api, method, &path, body.as_ref())) {
        Ok(Value::Null) => Ok(()),
        Ok(v) => {
            let _ = writeln!(
                std::io::stdout(),
                "{}",
                serde_json::to_string_pretty(&v).unwrap_or_default()
            );
            Ok(())
        }
        // The API refused what we asked: bad input, named by the API's message.
        Err(e @ ClientError::Api { status, .. }) if status < 500 => {
            Err(CliError::Usage(e.to_string()))
        }
        Err(e) => Err(CliError::Failed(e.into())),
    }
}

/// The listening socket on standard input (`serve --listen-stdin`), announced as [`listen`]
/// announces a bound one.
fn listener_from_stdin(
    announce: impl FnOnce(SocketAddr) -> String,
) -> Result<tokio::net::TcpListener, CliError> {
    let bad = |e: &dyn std::fmt::Display| {
        CliError::Usage(format!(
            "--listen-stdin: standard input is not a listening TCP socket: {e}"
        ))
    };
    // dup: the socket gets a descriptor of its own, and stdin stays what it was.
    use std::os::fd::AsFd;
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| bad(&e))?;
    let socket = socket2::Socket::from(fd);
    if !socket.is_listener().map_err(|e| bad(&e))? {
        return Err(bad(&"not listening"));
    }
    socket.set_nonblocking(true).map_err(|e| bad(&e))?;
    let listener = tokio::net::TcpListener::from_std(socket.into()).map_err(|e| bad(&e))?;
    let local = listener.local_addr().map_err(|e| bad(&e))?;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{}", announce(local));
    let _ = out.flush();
    Ok(listener)
}

/// Binds `--listen` and announces the bound address on stdout, in a line containing
/// `listening on ADDR` that scripts read (port 0 picks a free port).
fn listen(
    addr: SocketAddr,
    announce: impl FnOnce(SocketAddr) -> String,
) -> Result<tokio::net::TcpListener, CliError> {
    let listener = crate::net::bind(addr)
        .map_err(|e| CliError::Usage(format!("--listen {addr}: cannot listen: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| CliError::Failed(e.into()))?;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{}", announce(local));
    let _ = out.flush();
    Ok(listener)
}

/// Completes on Ctrl-C or SIGTERM. The handlers are installed at once (in the runtime the
/// caller is in), not when the future is first polled: a signal in between would otherwise get
/// its default action, ending the process with no clean-up.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).expect("install a SIGINT handler");
    let mut term = signal(SignalKind::terminate()).expect("install a SIGTERM handler");
    async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    }
}

fn shell(args: ShellArgs) -> Result<(), CliError> {
    use crate::link::shell::{self, ShellError};
    let profile = load_profile(&args.profile, "--profile")?;
    let rt = runtime()?;
    let code = rt.block_on(shell::run(&profile, args.seed, &args.command));
    match code {
        Ok(0) => Ok(()),
        Ok(code) => {
            // The command's own exit code is faultrig's; it has said what went wrong.
            drop(rt);
            std::process::exit(code)
        }
        Err(ShellError::Namespace(e)) => Err(namespace_error(e)),
        Err(e @ ShellError::Spawn { .. }) => Err(CliError::Usage(format!("faultrig shell: {e}"))),
        Err(e) => Err(CliError::Failed(anyhow::anyhow!("faultrig shell: {e}"))),
    }
}

fn calibrate(args: CalibrateArgs) -> Result<(), CliError> {
    use crate::calibrate::{self as cal, Plan, Workload};
    let (calls, connections, bulk_time) = if args.quick { cal::QUICK } else { cal::FULL };
    let names: Vec<String> = match args.profiles {
        Some(p) => p,
        None if args.quick => vec![cal::QUICK_PROFILE.into()],
        None => cal::PROFILES.iter().map(|p| p.to_string()).collect(),
    };
    let mut profiles = Vec::new();
    for name in &names {
        // Both engines run every profile, so the model's limits apply to each.
        let profile = load_profile(name, "--profiles")?;
        check_engine(Engine::Model, &profile, name)?;
        profiles.push(profile);
    }
    let plan = Plan {
        profiles,
        workloads: args.workloads.unwrap_or_else(|| {
            if args.quick {
                Workload::QUICK.to_vec()
            } else {
                Workload::ALL.to_vec()
            }
        }),
        calls: args.calls.unwrap_or(calls),
        connections: args.connections.map_or(connections, |c| c as usize),
        warmup_calls: cal::WARMUP_CALLS,
        bulk_time,
        seed: args.seed,
    };
    // Before any traffic: a missing privilege is one message and exit 2.
    crate::link::Namespace::new().map_err(namespace_error)?;
    std::fs::create_dir_all(&args.out).map_err(|e| {
        CliError::Usage(format!("--out {}: cannot create: {e}", args.out.display()))
    })?;
    let started = std::time::Instant::now();
    println!(
        "faultrig calibrate: {} profile(s) x {} workload(s), model then kernel; {} counted calls \
         on {} connections after {} uncounted warm-up calls each; bulk {} s; seed {}",
        plan.profiles.len(),
        plan.workloads.len(),
        plan.calls,
        plan.connections,
        plan.warmup_calls,
        plan.bulk_time.as_secs(),
        plan.seed
    );
    let outcome = runtime()?
        .block_on(cal::run(&plan, &args.out, |line| {
            let _ = writeln!(std::io::stdout(), "{line}");
        }))
        .map_err(CliError::Failed)?;
    println!(
        "wrote {} and {} in {:.0} s",
        args.out.join("calibrate.csv").display(),
        args.out.join("calibrate.html").display(),
        started.elapsed().as_secs_f64()
    );
    match outcome.out_of_tolerance() {
        0 => Ok(()),
        n => Err(CliError::Failed(anyhow::anyhow!(
            "{n} workload(s) out of tolerance (mean and p50 within 10 %, p90 and p99 within 15 %)"
        ))),
    }
}

fn serve(args: ServeArgs) -> Result<(), CliError> {
    if let Some(parent) = args.parent {
        crate::child::die_with_parent(parent).map_err(|e| CliError::Failed(anyhow::anyhow!(e)))?;
    }
    let rt = runtime()?;
    rt.block_on(async move {
        // Before listening: a runner waiting for the address must never see a server that
        // cannot reach its downstream.
        let downstream = args
            .downstream
            .connect()
            .await
            .map_err(|e| CliError::Usage(format!("--downstream: {e}")))?;
        let announce = |local| {
            format!(
                "faultrig serve {} listening on {local}",
                args.flavour.name()
            )
        };
        let listener = if args.listen_stdin {
            listener_from_stdin(announce)?
        } else {
            listen(args.listen, announce)?
        };
        let service = std::sync::Arc::new(RigService::new(args.stock, downstream));
        flavour::serve_with(
            args.flavour,
            listener,
            service,
            shutdown_signal(),
            args.nodelay,
            args.max_connections,
        )
        .await
        .map_err(|e| CliError::Failed(e.into()))
    })
}

fn bench(args: BenchArgs) -> Result<(), CliError> {
    let spec = BenchSpec {
        flavour: args.flavour,
        target: args.target,
        mode: args.mode,
        workload: args.workload,
        concurrency: args.concurrency as usize,
        stop: match (args.calls, args.duration) {
            (Some(n), _) => Stop::Calls(n),
            (None, Some(d)) => Stop::Duration(d),
            (None, None) => unreachable!("clap requires one of --calls and --duration"),
        },
        warmup: args.warmup,
        rate: args.rate,
        timeout: args.timeout,
        seed: args.seed,
        socket: SocketOptions {
            nodelay: args.nodelay,
            write_pattern: args.write_pattern,
            congestion: args.congestion_control,
            namespace: None,
        },
    };
    // Open the CSV first: a path we cannot write is bad input, found before any traffic.
    let mut csv = match &args.csv {
        Some(path) => Some(crate::results::ResultsWriter::append(path).map_err(|e| {
            CliError::Usage(format!("--csv {}: cannot write: {e}", path.display()))
        })?),
        None => None,
    };
    let outcome = bench_runtime()?.block_on(crate::bench::run(&spec));
    // A closed stdout (bench ... | head) must not turn a finished run into a panic.
    let _ = writeln!(std::io::stdout(), "{}", outcome.summary(&spec));
    if let Some(csv) = &mut csv {
        let mut row = outcome.row(&spec);
        row.run_id = run_id("bench");
        row.host = args.host.clone().unwrap_or_else(host_name);
        row.round = args.round;
        row.profile = args.profile_label.clone();
        csv.write(&row).map_err(|e| CliError::Failed(e.into()))?;
    }
    Ok(())
}

/// A run id that sorts by time and does not collide between hosts or processes.
pub fn run_id(kind: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    format!("{kind}-{secs}-{}-{}", host_name(), std::process::id())
}

/// This machine's name, for the CSV's `host` column.
pub fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into())
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

fn run_experiment(args: RunArgs) -> Result<(), CliError> {
    use crate::experiment::{ExperimentFile, DEFAULT};
    let (file, origin) = match &args.experiment {
        Some(path) => (ExperimentFile::load(path), path.display().to_string()),
        None => (
            ExperimentFile::parse(DEFAULT, "<built-in lan-compare>"),
            "<built-in lan-compare>".into(),
        ),
    };
    let overrides = ExperimentFile {
        profiles: args.profiles,
        flavours: args.flavours,
        modes: args.modes,
        workloads: args.workloads,
        concurrency: args.concurrency,
        calls: args.calls,
        duration: args.duration,
        warmup: args.warmup,
        timeout: args.timeout,
        rounds: args.rounds,
        round_summary: args.round_summary,
        seed: args.seed,
        engine: args.engine,
        nodelay: args
            .nodelay
            .map(|v| toml::Value::Array(v.into_iter().map(toml::Value::Boolean).collect())),
        write_pattern: args
            .write_pattern
            .map(|v| toml::Value::Array(v.into_iter().map(toml::Value::String).collect())),
        ..ExperimentFile::default()
    };
    let experiment = file
        .map_err(CliError::Usage)?
        .merge(overrides)
        .validate(&origin)
        .map_err(CliError::Usage)?;
    if experiment.engine.is_privileged() {
        // Before any server starts: a missing privilege is one message and exit 2.
        crate::link::Namespace::new().map_err(namespace_error)?;
    }
    let run_id = run_id("run");
    let files = crate::runner::RunFiles::create(&args.out, &run_id).map_err(|e| {
        CliError::Usage(format!(
            "--out {}: cannot create the run directory: {e}",
            args.out.display()
        ))
    })?;
    let bin = std::env::current_exe().map_err(|e| CliError::Failed(e.into()))?;
    let cells = experiment.cells().len();
    println!(
        "faultrig run {run_id}: experiment {}, {cells} cells x {} rounds -> {}",
        experiment.name,
        experiment.rounds,
        files.csv.display()
    );
    let rt = runtime()?;
    // Ctrl-C and SIGTERM alike stop the run after its finished rows, and its servers with it.
    let interrupted = {
        let _entered = rt.enter();
        shutdown_signal()
    };
    // block_on runs the runner on this (the main) thread, which spawns the servers: their
    // parent-death signal is tied to the spawning thread ([`crate::child`]).
    let rows = rt
        .block_on(crate::runner::run(
            &experiment,
            &files,
            &bin,
            &args.host.clone().unwrap_or_else(host_name),
            interrupted,
        ))
        .map_err(CliError::Failed)?;
    let table = Table::build(&rows, experiment.round_summary)
        .map_err(|e| CliError::Failed(anyhow::anyhow!(e)))?;
    let html = files.dir.join("report.html");
    let title = format!("faultrig run {run_id}");
    let done = format!(
        "{} rows in {}; report in {}",
        rows.len(),
        files.csv.display(),
        html.display()
    );
    println!();
    finish_report(
        &table,
        rows.len(),
        &args.report,
        None,
        Some((&html, &title)),
        &done,
    )
}

/// What `run` and `report` do with a finished table: print it (or its JSON), write the HTML
/// and JSON files asked for, then check the gates and the baseline, exit 1 naming every cell
/// that failed one. The files are written first, so a failed gate still leaves its report.
fn finish_report(
    table: &Table,
    rows: usize,
    flags: &ReportFlags,
    baseline: Option<(&compare::Comparison, bool)>,
    html: Option<(&std::path::Path, &str)>,
    done: &str,
) -> Result<(), CliError> {
    let checks = crate::report::gate::check(table, &flags.assert);
    let comparison = baseline.map(|(c, _)| c);
    if let Some((path, title)) = html {
        write_html(path, title, table, rows, &checks, comparison)?;
    }
    let json = || crate::report::json::summary(table, rows, &checks, comparison);
    let mut out = std::io::stdout();
    match flags.json.as_deref() {
        Some(p) if p == std::path::Path::new("-") => {
            let _ = writeln!(out, "{}", json());
        }
        other => {
            if let Some(path) = other {
                std::fs::write(path, json() + "\n").map_err(|e| {
                    CliError::Failed(anyhow::anyhow!("write {}: {e}", path.display()))
                })?;
            }
            let _ = write!(out, "{}", table.render());
            if let Some(c) = comparison {
                let _ = write!(out, "{}", c.render());
            }
            if !checks.is_empty() {
                let _ = write!(out, "\n{}", crate::report::gate::render(&checks));
            }
            if !done.is_empty() {
                let _ = writeln!(out, "{done}");
            }
        }
    }
    let mut failures = Vec::new();
    let failed: Vec<_> = checks.iter().filter(|c| !c.holds).collect();
    if !failed.is_empty() {
        // Each cell is named in the report above (or the JSON); here, which gates failed where.
        let mut gates: Vec<(&str, usize)> = Vec::new();
        for c in &failed {
            match gates.iter_mut().find(|(a, _)| *a == c.assertion) {
                Some((_, n)) => *n += 1,
                None => gates.push((&c.assertion, 1)),
            }
        }
        let gates: Vec<String> = gates
            .iter()
            .map(|(a, n)| format!("'{a}' in {n} cell(s)"))
            .collect();
        failures.push(format!("--assert failed: {}", gates.join(", ")));
    }
    if let Some((c, true)) = baseline {
        if c.regressions() > 0 {
            failures.push(format!(
                "--fail-on-regression: {} of {} cells regressed against the baseline",
                c.regressions(),
                c.deltas.len()
            ));
        }
    }
    match failures.is_empty() {
        true => Ok(()),
        false => Err(CliError::Failed(anyhow::anyhow!(failures.join("\n")))),
    }
}

fn write_html(
    path: &std::path::Path,
    title: &str,
    table: &Table,
    rows: usize,
    checks: &[crate::report::gate::Check],
    baseline: Option<&compare::Comparison>,
) -> Result<(), CliError> {
    let page = crate::report::html::page(title, table, rows, checks, baseline)
        .map_err(|e| CliError::Failed(anyhow::anyhow!(e)))?;
    std::fs::write(path, page)
        .map_err(|e| CliError::Failed(anyhow::anyhow!("write {}: {e}", path.display())))
}

/// Reads and combines results files: bad input (a missing or foreign file, a broken row) is
/// a usage error naming the file.
fn read_table(files: &[PathBuf], rounds: RoundSummary) -> Result<(Table, usize), CliError> {
    let mut rows = Vec::new();
    for f in files {
        rows.extend(crate::results::read(f).map_err(CliError::Usage)?);
    }
    let table = Table::build(&rows, rounds).map_err(CliError::Usage)?;
    Ok((table, rows.len()))
}

fn report(args: ReportArgs) -> Result<(), CliError> {
    let (table, rows) = read_table(&args.files, args.rounds)?;
    let comparison = if args.baseline.is_empty() {
        None
    } else {
        let (old, _) = read_table(&args.baseline, args.rounds)?;
        Some(compare::compare(&old, &table, args.threshold))
    };
    let html = args.html.as_deref().map(|p| (p, "faultrig report"));
    finish_report(
        &table,
        rows,
        &args.flags,
        comparison.as_ref().map(|c| (c, args.fail_on_regression)),
        html,
        "",
    )
}
