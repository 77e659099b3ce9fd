//! `faultrig proxy`: one fault proxy in front of one upstream, or (`--api`) the control API
//! hosting any number of named proxies.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::{
    announce_address, check_engine, listen, load_profile, namespace_error, parse_max_connections,
    runtime, shutdown_signal, CliError, CONNECT_TIMEOUT_TEXT, DEFAULT_API,
};
use crate::api::registry::DEFAULT_LISTEN;
use crate::api::{ProxySpec, Registry, RegistryOptions};
use crate::link::Engine;
use crate::profile::Profile;
use crate::proxy::{Proxy, ProxyOptions, DEFAULT_WINDOW, MAX_WINDOW};
use crate::units;

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Address to accept clients on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Address of the server to forward to (HOST:PORT). With --api, optional: it creates the
    /// proxy --name on --listen at start.
    #[arg(long, required_unless_present = "api")]
    pub upstream: Option<String>,
    /// Serve the control API (Toxiproxy's REST API and /metrics) on this address (default
    /// 127.0.0.1:8474; it binds another interface only when named here).
    #[arg(long, num_args = 0..=1, default_missing_value = DEFAULT_API)]
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
    #[arg(long, value_parser = units::parse_duration,
          default_value = CONNECT_TIMEOUT_TEXT.as_str())]
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

/// `proxy`'s arguments, checked: the profile loaded, and with `--api` every proxy of
/// `--config` and `--upstream` parsed, before anything listens.
pub(crate) enum ProxyCommand {
    /// One proxy in front of `upstream`.
    Single {
        listen: SocketAddr,
        upstream: String,
        profile: Box<Profile>,
        engine: Engine,
        options: ProxyOptions,
    },
    /// The control API on `api`, with these proxies created at start.
    Api {
        api: SocketAddr,
        specs: Vec<ProxySpec>,
        options: RegistryOptions,
    },
}

impl ProxyArgs {
    pub(crate) fn validate(self) -> Result<ProxyCommand, CliError> {
        let profile = load_profile(&self.profile, "--profile")?;
        check_engine(self.engine, &profile, &self.profile)?;
        let Some(api) = self.api else {
            let upstream = self
                .upstream
                .expect("clap requires --upstream without --api");
            return Ok(ProxyCommand::Single {
                listen: self.listen,
                upstream,
                profile: Box::new(profile),
                engine: self.engine,
                options: ProxyOptions {
                    name: self.name,
                    seed: self.seed,
                    window: self.window,
                    connect_timeout: self.connect_timeout,
                    max_connections: self.max_connections,
                },
            });
        };
        let mut specs = match &self.config {
            Some(path) => read_config(path)?,
            None => Vec::new(),
        };
        if let Some(upstream) = self.upstream {
            specs.push(ProxySpec {
                name: self.name,
                listen: self.listen.to_string(),
                upstream,
                enabled: true,
                base: profile,
                engine: self.engine,
                toxics: None,
            });
        }
        Ok(ProxyCommand::Api {
            api,
            specs,
            options: RegistryOptions {
                seed: self.seed,
                window: self.window,
                connect_timeout: self.connect_timeout,
                max_connections: self.max_connections,
            },
        })
    }
}

/// `--config`: the proxies to create at start, each checked as the API checks one.
fn read_config(path: &std::path::Path) -> Result<Vec<ProxySpec>, CliError> {
    let bad = |e: String| CliError::Usage(format!("--config {}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let serde_json::Value::Array(list) = value else {
        return Err(bad("expected a JSON array of proxies".into()));
    };
    list.into_iter()
        .enumerate()
        .map(|(i, v)| ProxySpec::from_json(v, Some(i)).map_err(|e| bad(e.message)))
        .collect()
}

pub fn run(command: ProxyCommand) -> Result<(), CliError> {
    match command {
        ProxyCommand::Single {
            listen,
            upstream,
            profile,
            engine,
            options,
        } => single(listen, upstream, *profile, engine, options),
        ProxyCommand::Api {
            api,
            specs,
            options,
        } => control_api(api, specs, options),
    }
}

fn single(
    addr: SocketAddr,
    upstream: String,
    profile: Profile,
    engine: Engine,
    options: ProxyOptions,
) -> Result<(), CliError> {
    let rt = runtime()?;
    rt.block_on(async move {
        let listener = listen(addr, |local| {
            format!(
                "faultrig proxy {} listening on {local} -> {} (profile {}, seed {})",
                options.name, upstream, profile.name, options.seed
            )
        })?;
        let proxy = Proxy::new(upstream, profile, options);
        let proxy = match engine {
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
fn control_api(
    addr: SocketAddr,
    specs: Vec<ProxySpec>,
    options: RegistryOptions,
) -> Result<(), CliError> {
    let registry = Arc::new(Registry::new(options));
    runtime()?.block_on(async move {
        let listener = crate::net::bind(addr)
            .map_err(|e| CliError::Usage(format!("--api {addr}: cannot listen: {e}")))?;
        if !specs.is_empty() {
            let created = registry.populate_proxies(specs).await.map_err(|(e, _)| {
                CliError::Usage(format!("creating the proxies: {}", e.message))
            })?;
            let mut out = std::io::stdout();
            for p in &created.proxies {
                let _ = writeln!(
                    out,
                    "proxy {} listening on {} -> {}",
                    p.name, p.listen, p.upstream
                );
            }
        }
        let local = listener
            .local_addr()
            .map_err(|e| CliError::Failed(e.into()))?;
        announce_address(&format!("faultrig proxy control API listening on {local}"));
        crate::api::run(listener, registry, shutdown_signal())
            .await
            .map_err(|e| CliError::Failed(e.into()))
    })
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
