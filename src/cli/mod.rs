//! The command line: every flag is defined here, once, in the file of its command. `main.rs`
//! parses and calls [`run`].
//!
//! Each command's file holds its clap flags (`XxxArgs`), the one function that turns them into
//! validated arguments (`XxxArgs::validate`), and the handler that does the work with those. The
//! dispatch in [`run`] validates before it hands over, so every bad flag is found before any
//! work starts.
//!
//! Exit codes: 0 success, 1 a runtime failure, 2 bad input (a flag, a profile, an address),
//! always reported before any traffic is sent, in one message naming what was wrong.

mod bench;
mod calibrate;
mod ctl;
mod profiles;
mod proxy;
mod report;
mod run;
mod serve;
mod shell;
mod supervise;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::flavour::{self, Flavour};
use crate::link::{Engine, NamespaceError};
use crate::profile::Profile;

pub use bench::BenchArgs;
pub use calibrate::CalibrateArgs;
pub use ctl::{CtlAction, CtlArgs, ToxicAction};
pub use profiles::ProfilesAction;
pub use proxy::ProxyArgs;
pub use report::{ReportArgs, ReportFlags};
pub use run::RunArgs;
pub use serve::ServeArgs;
pub use shell::ShellArgs;

/// Where the control API listens (`proxy --api` without an address) and where `ctl` looks for
/// it: Toxiproxy's port, on loopback only.
pub(crate) const DEFAULT_API: &str = "127.0.0.1:8474";

/// [`crate::proxy::DEFAULT_CONNECT_TIMEOUT`] as `--connect-timeout`'s default text.
static CONNECT_TIMEOUT_TEXT: LazyLock<String> =
    LazyLock::new(|| duration_text(crate::proxy::DEFAULT_CONNECT_TIMEOUT));

/// [`crate::bench::DEFAULT_CALL_TIMEOUT`] as `bench --timeout`'s default text.
static CALL_TIMEOUT_TEXT: LazyLock<String> =
    LazyLock::new(|| duration_text(crate::bench::DEFAULT_CALL_TIMEOUT));

/// A default duration as a flag's default text (`5s`): clap parses it like a typed value, and
/// the number is written once, in its constant.
fn duration_text(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

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
    /// Talk to a control API (`faultrig proxy --api`, or Toxiproxy) as toxiproxy-cli does:
    /// list, inspect, create, toggle, delete, toxics, populate, reset, metrics.
    Ctl(CtlArgs),
    /// Run an RPC server of one flavour.
    Serve(ServeArgs),
    /// Drive RPC load against a server (directly or through a proxy) and report.
    Bench(Box<BenchArgs>),
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
    Supervise(supervise::SuperviseArgs),
}

/// Runs a parsed command line: each command's flags are validated in one step, then its
/// handler runs on the validated arguments.
pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Run(args) => run::run(args.validate()?),
        Command::Report(args) => report::run(args.validate()?),
        Command::Proxy(args) => proxy::run(args.validate()?),
        Command::Ctl(args) => ctl::run(args.validate()?),
        Command::Serve(args) => serve::run(args.validate()?),
        Command::Bench(args) => bench::run(args.validate()?),
        Command::Shell(args) => shell::run(args.validate()?),
        Command::Calibrate(args) => calibrate::run(args.validate()?),
        Command::Profiles { action } => profiles::run(action.unwrap_or(ProfilesAction::List)),
        Command::Supervise(args) => supervise::run(args),
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

/// `--flavour`, for the commands that serve or drive one.
fn parse_flavour(s: &str) -> Result<&'static dyn Flavour, String> {
    flavour::by_name(s).ok_or_else(|| {
        format!(
            "unknown flavour \"{s}\" (use {})",
            flavour::names().join(", ")
        )
    })
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

fn load_profile(name: &str, flag: &str) -> Result<Profile, CliError> {
    Profile::load(name).map_err(|e| CliError::Usage(format!("{flag}: {e}")))
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

/// A run id that sorts by time and does not collide between hosts or processes.
pub fn run_id(kind: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    format!("{kind}-{secs}-{}-{}", host_name(), std::process::id())
}

/// This machine's name, for the CSV's `host` column.
pub(crate) fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into())
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(e.into()))
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
    announce_address(&announce(local));
    Ok(listener)
}

/// Prints the line that says where we listen, at once: a script (or test) waits for it.
fn announce_address(line: &str) {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// clap's own checks of the definitions (duplicate flags, bad groups); they run in debug
    /// builds only, where this test then fails on a mistake the parser would hide.
    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn default_durations_read_back_as_their_constants() {
        for d in [
            crate::proxy::DEFAULT_CONNECT_TIMEOUT,
            crate::bench::DEFAULT_CALL_TIMEOUT,
        ] {
            assert_eq!(crate::units::parse_duration(&duration_text(d)), Ok(d));
        }
    }
}
