//! The command line: every flag is defined here, once. `main.rs` parses and calls [`run`].
//!
//! Exit codes: 0 success, 1 a runtime failure, 2 bad input (a flag, a profile, an address),
//! always reported before any traffic is sent, in one message naming what was wrong.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::profile::Profile;
use crate::proxy::{Proxy, ProxyOptions, DEFAULT_WINDOW};
use crate::units;

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
    /// Run a fault proxy between clients and one upstream server.
    Proxy(ProxyArgs),
    /// List, show and check network profiles.
    Profiles {
        #[command(subcommand)]
        action: Option<ProfilesAction>,
    },
}

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Address to accept clients on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Address of the server to forward to (HOST:PORT).
    #[arg(long)]
    pub upstream: String,
    /// Built-in profile name or path to a profile file (.toml).
    #[arg(long, default_value = "local")]
    pub profile: String,
    /// Run seed: the same seed replays the same fault schedule.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Bytes buffered per direction before the proxy stops reading (e.g. 4MiB).
    #[arg(long, value_parser = parse_size, default_value_t = DEFAULT_WINDOW)]
    pub window: usize,
    /// Give up connecting to the upstream after this long.
    #[arg(long, value_parser = units::parse_duration, default_value = "5s")]
    pub connect_timeout: Duration,
    /// Name of this proxy in logs; also keys its fault RNG streams.
    #[arg(long, default_value = "proxy")]
    pub name: String,
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

fn parse_size(s: &str) -> Result<usize, String> {
    units::parse_size(s).map(|n| n as usize)
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
        Command::Proxy(args) => proxy(args),
        Command::Profiles { action } => profiles(action.unwrap_or(ProfilesAction::List)),
    }
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
    let options = ProxyOptions {
        name: args.name.clone(),
        seed: args.seed,
        window: args.window,
        connect_timeout: args.connect_timeout,
    };
    let rt = runtime()?;
    rt.block_on(async move {
        let listener = crate::net::bind(args.listen).map_err(|e| {
            CliError::Usage(format!("--listen {}: cannot listen: {e}", args.listen))
        })?;
        let local = listener
            .local_addr()
            .map_err(|e| CliError::Failed(e.into()))?;
        // Scripts read the bound address from this line (port 0 picks a free port).
        println!(
            "faultrig proxy {} listening on {local} -> {} (profile {}, seed {})",
            args.name, args.upstream, profile.name, args.seed
        );
        let _ = std::io::stdout().flush();
        let proxy = Proxy::new(args.upstream, profile, options);
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

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
