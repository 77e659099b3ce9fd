//! A local run's targets: one `faultrig serve` child process per flavour, backend and
//! `nodelay` value (so its CPU time and peak RSS can be read from /proc) — for an external
//! flavour, its own server ([`super::external`]) — and one in-process
//! fault proxy per profile in front of each server (named after the profile, so every flavour
//! meets the same fault streams).
//!
//! With `--engine link` there is no proxy: each profile gets a namespace pair joined by the
//! link engine, each server a listening socket made in the pair's server namespace (B) and
//! handed over as its standard input (a socket's namespace is fixed when it is made, so the
//! server process itself stays on the host, with its backend), and the load driver makes
//! its client sockets in the client namespace (A). Every byte of every call then crosses the
//! impaired link between the endpoints' own TCP stacks.

use std::net::{SocketAddr, SocketAddrV4};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};

use super::external::ServerError;
use super::Probe;
use crate::child::{AnnounceError, Announced};
use crate::experiment::{BackendSpec, Cell, CellFlavour, Experiment};
use crate::flavour::SocketOptions;
use crate::link::{Engine, NamespaceError, NamespacePair, PAIR_ADDRS};
use crate::local_redis::{LocalRedis, RedisStartError};
use crate::net::Served;
use crate::profile::{CongestionControl, Profile};
use crate::proxy::{Proxy, ProxyOptions, ProxyStats, StatsSnapshot};
use crate::service::Backend;

/// Every server and proxy of a local run; all stopped on drop.
pub(crate) struct LocalTargets {
    /// The distinct backends, in the order of `targets`' first index.
    backends: Vec<BackendSpec>,
    /// `targets[backend][flavour][nodelay]` (`nodelay` in the experiment's order): a server
    /// and one proxy per profile in front of it, or with the link engine one server per profile.
    targets: Vec<Vec<Vec<Target>>>,
    /// The link engine's namespace pairs, one per profile; empty with the other engines.
    /// Declared after `targets`, so the servers stop before their namespaces go.
    links: Vec<NamespacePair>,
    /// The private redis-server of `deduct@redis` cells. Declared after `targets`, so it is
    /// stopped after the servers using it.
    _redis: Option<LocalRedis>,
}

/// Why a local run's servers, proxies or link namespaces could not be put in place.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// Said in one line, as the redis error is not a cause below it.
    #[error("workload @redis: {0}")]
    Redis(RedisStartError),
    #[error("link engine for profile {profile}")]
    Link {
        profile: String,
        source: NamespaceError,
    },
    #[error("listen in the link's server namespace")]
    ListenInLink(#[source] std::io::Error),
    #[error("start the {flavour} server")]
    Server {
        flavour: &'static str,
        source: AnnounceError,
    },
    #[error(transparent)]
    External(#[from] ServerError),
    /// The proxy's listening socket, or its serving task.
    #[error(transparent)]
    Proxy(std::io::Error),
    #[error(transparent)]
    KernelEngine(NamespaceError),
}

impl LocalTargets {
    pub async fn start(exp: &Experiment, bin: &Path) -> Result<LocalTargets, LocalError> {
        let backends = exp.backends();
        // Started before any server, so a missing redis-server fails the run before any traffic.
        let redis = if backends.contains(&BackendSpec::LocalRedis) {
            let redis = LocalRedis::start(Some(bin));
            Some(redis.map_err(LocalError::Redis)?)
        } else {
            None
        };
        // Before any server: each needs its listening socket in a pair's namespace.
        let mut links = Vec::new();
        if exp.engine == Engine::Link {
            for profile in &exp.profiles {
                // Named after the profile, as proxies are: every flavour meets the same faults.
                let pair = NamespacePair::new(profile, exp.seed, &profile.name)
                    .await
                    .map_err(|source| LocalError::Link {
                        profile: profile.name.clone(),
                        source,
                    })?;
                links.push(pair);
            }
        }
        let mut targets = Vec::new();
        for spec in &backends {
            let backend = match spec {
                BackendSpec::Given(d) => d.clone(),
                BackendSpec::LocalRedis => {
                    Backend::Redis(redis.as_ref().expect("started above").url())
                }
            };
            let mut per_flavour = Vec::new();
            for flavour in &exp.flavours {
                let mut per_nodelay = Vec::new();
                for &nodelay in &exp.nodelay {
                    let target = if exp.engine == Engine::Link {
                        let mut servers = Vec::new();
                        for (pair, profile) in links.iter().zip(&exp.profiles) {
                            let listener = listen_in_b(pair, profile).await?;
                            servers.push(Server::start(
                                bin,
                                flavour,
                                &backend,
                                nodelay,
                                Some(listener),
                            )?);
                        }
                        Target {
                            servers,
                            proxies: Vec::new(),
                        }
                    } else {
                        let server = Server::start(bin, flavour, &backend, nodelay, None)?;
                        let mut proxies = Vec::new();
                        for profile in &exp.profiles {
                            proxies.push(
                                start_proxy(&server.addr, profile, exp.seed, exp.engine).await?,
                            );
                        }
                        Target {
                            servers: vec![server],
                            proxies,
                        }
                    };
                    per_nodelay.push(target);
                }
                per_flavour.push(per_nodelay);
            }
            targets.push(per_flavour);
        }
        Ok(LocalTargets {
            backends,
            targets,
            links,
            _redis: redis,
        })
    }

    /// The cell's server, and its proxy (none with the link engine).
    fn target(&self, exp: &Experiment, cell: &Cell) -> (&Server, Option<&RunningProxy>) {
        let f = exp.flavour_index(&cell.flavour);
        let d = self
            .backends
            .iter()
            .position(|x| *x == cell.workload.backend)
            .expect("listed");
        let n = exp
            .nodelay
            .iter()
            .position(|&x| x == cell.nodelay)
            .expect("listed");
        let target = &self.targets[d][f][n];
        match target.proxies.get(cell.profile) {
            Some(proxy) => (&target.servers[0], Some(proxy)),
            None => (&target.servers[cell.profile], None),
        }
    }

    /// Where the cell's calls go, and how its client sockets are made.
    pub(crate) fn enter(&self, exp: &Experiment, cell: &Cell) -> (String, SocketOptions) {
        let mut socket = SocketOptions {
            nodelay: cell.nodelay,
            write_pattern: cell.write_pattern,
            ..SocketOptions::default()
        };
        let (server, proxy) = self.target(exp, cell);
        let addr = match proxy {
            Some(proxy) => proxy.addr.clone(),
            None => {
                let pair = &self.links[cell.profile];
                socket.namespace = Some(pair.a.clone());
                socket.congestion = Some(exp.profiles[cell.profile].upstream.congestion_control);
                server.addr.clone()
            }
        };
        (addr, socket)
    }

    /// The counters as the measured calls begin; the server's peak RSS starts again here.
    pub async fn begin(&self, exp: &Experiment, cell: &Cell) -> Probe {
        let (server, _) = self.target(exp, cell);
        server.reset_peak_rss();
        Probe {
            proxy: self.counters(exp, cell).await,
            server_cpu_ms: server.cpu_ms(),
            server_rss_kb: None,
        }
    }

    /// The counters after the cell.
    pub async fn leave(&self, exp: &Experiment, cell: &Cell) -> Probe {
        let (server, _) = self.target(exp, cell);
        Probe {
            proxy: self.counters(exp, cell).await,
            server_cpu_ms: server.cpu_ms(),
            server_rss_kb: server.peak_rss_kb(),
        }
    }

    /// The path's counters: the proxy's, or with the link engine the link's bytes and the
    /// segments each side's kernel retransmitted (upstream: the clients' namespace; downstream:
    /// the servers'). Unreadable retransmission counts leave the row's stalls empty.
    async fn counters(&self, exp: &Experiment, cell: &Cell) -> Option<StatsSnapshot> {
        if let (_, Some(proxy)) = self.target(exp, cell) {
            return Some(proxy.stats.snapshot());
        }
        let pair = &self.links[cell.profile];
        let stats = pair.link.stats();
        let (up, down) = (
            pair.a.tcp_retransmissions().await,
            pair.b.tcp_retransmissions().await,
        );
        let (stalls_up, stalls_down) = match (up, down) {
            (Ok(up), Ok(down)) => (up, down),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!("link engine: cannot read retransmissions: {e}");
                return None;
            }
        };
        use std::sync::atomic::Ordering::Relaxed;
        Some(StatsSnapshot {
            bytes_up: stats.a_to_b.bytes.load(Relaxed),
            bytes_down: stats.b_to_a.bytes.load(Relaxed),
            stalls_up,
            stalls_down,
            ..StatsSnapshot::default()
        })
    }
}

/// A listening socket in `pair`'s server namespace, on its address and a free port, with the
/// profile's downstream congestion control (accepted connections inherit it).
async fn listen_in_b(
    pair: &NamespacePair,
    profile: &Profile,
) -> Result<std::net::TcpListener, LocalError> {
    let cc: CongestionControl = profile.downstream.congestion_control;
    pair.b
        .within_async(move || -> std::io::Result<std::net::TcpListener> {
            let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
            socket.set_tcp_congestion(cc.as_str().as_bytes())?;
            socket.bind(&SocketAddr::from(SocketAddrV4::new(PAIR_ADDRS.b, 0)).into())?;
            // As deep as every other listener's (`crate::net::bind`): per-call bursts.
            socket.listen(4096)?;
            Ok(socket.into())
        })
        .await
        .map_err(LocalError::ListenInLink)
}

/// One server and the proxies (one per profile) in front of it; with the link engine, one
/// server per profile (each listening in that profile's namespace) and no proxy.
struct Target {
    servers: Vec<Server>,
    proxies: Vec<RunningProxy>,
}

/// A cell's server: a `faultrig serve` child process (stopped and reaped on drop, and ending
/// by itself if this process dies: [`crate::child`]), or an external flavour's.
struct Server {
    process: ServerProcess,
    addr: String,
}

enum ServerProcess {
    Faultrig(Announced),
    /// Not `faultrig serve`: an external flavour's server started from its `serve` line (held
    /// only to be stopped on drop), or none when it runs already (an external flavour's
    /// `target`, a `[[targets]]` entry's `address`).
    External {
        _process: Option<super::external::ServerProcess>,
    },
}

/// How long a server may take to say where it listens.
const SERVER_START: std::time::Duration = std::time::Duration::from_secs(30);

impl Server {
    /// Starts a server for `flavour` on a loopback port, or (`listener`) serving a socket made
    /// elsewhere (built-in flavours only: validation keeps external ones off the link engine).
    fn start(
        bin: &Path,
        flavour: &CellFlavour,
        backend: &Backend,
        nodelay: bool,
        listener: Option<std::net::TcpListener>,
    ) -> Result<Server, LocalError> {
        let flavour = match flavour {
            CellFlavour::Builtin(f) => f,
            CellFlavour::External(x) => {
                let (process, addr) = super::external::start_server(bin, x, nodelay)?;
                return Ok(Server {
                    process: ServerProcess::External { _process: process },
                    addr,
                });
            }
            // The user's service runs already: the runner only puts proxies in front of it.
            CellFlavour::Target(t) => {
                return Ok(Server {
                    process: ServerProcess::External { _process: None },
                    addr: t.address.clone(),
                })
            }
        };
        let mut command = Command::new(bin);
        command.args([
            "serve",
            "--flavour",
            flavour.name(),
            "--backend",
            &backend.to_string(),
            "--nodelay",
            if nodelay { "true" } else { "false" },
            crate::child::PARENT_FLAG,
            &std::process::id().to_string(),
        ]);
        match listener {
            Some(listener) => {
                command
                    .arg("--listen-stdin")
                    .stdin(std::os::fd::OwnedFd::from(listener));
            }
            None => {
                command.args(["--listen", "127.0.0.1:0"]);
            }
        }
        command.stderr(Stdio::inherit());
        let process =
            Announced::spawn(command, SERVER_START).map_err(|source| LocalError::Server {
                flavour: flavour.name(),
                source,
            })?;
        let addr = process.addr.clone();
        Ok(Server {
            process: ServerProcess::Faultrig(process),
            addr,
        })
    }

    /// The `faultrig serve` process, whose CPU time and memory the row reports. An external
    /// server runs under `faultrig supervise`, whose own figures would say nothing of it.
    fn faultrig(&self) -> Option<&Announced> {
        match &self.process {
            ServerProcess::Faultrig(p) => Some(p),
            ServerProcess::External { .. } => None,
        }
    }

    /// CPU time (user + system) so far, in milliseconds.
    fn cpu_ms(&self) -> Option<u64> {
        let pid = self.faultrig()?.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()??
            .max(1) as u64;
        Some(ticks * 1000 / hz)
    }

    /// Resets the peak-RSS mark, so the next read covers one cell.
    fn reset_peak_rss(&self) {
        if let Some(p) = self.faultrig() {
            let _ = std::fs::write(format!("/proc/{}/clear_refs", p.child.id()), "5");
        }
    }

    /// Peak resident set size since the last reset, in KiB.
    fn peak_rss_kb(&self) -> Option<u64> {
        self.faultrig()?.status_kib("VmHWM")
    }
}

/// An in-process proxy in front of one server; stopped on drop.
struct RunningProxy {
    addr: String,
    stats: Arc<ProxyStats>,
    _served: Served,
}

async fn start_proxy(
    upstream: &str,
    profile: &crate::profile::Profile,
    seed: u64,
    engine: Engine,
) -> Result<RunningProxy, LocalError> {
    let listener =
        crate::net::bind("127.0.0.1:0".parse().expect("valid")).map_err(LocalError::Proxy)?;
    let options = ProxyOptions {
        // Keyed by profile only: every flavour meets the same fault streams.
        name: profile.name.clone(),
        seed,
        ..ProxyOptions::default()
    };
    let proxy = Proxy::new(upstream, profile.clone(), options);
    let proxy = match engine {
        Engine::Kernel => proxy
            .with_kernel_engine()
            .await
            .map_err(LocalError::KernelEngine)?,
        _ => proxy,
    };
    let stats = proxy.stats();
    let served =
        Served::spawn(listener, |l, stop| proxy.run(l, stop)).map_err(LocalError::Proxy)?;
    Ok(RunningProxy {
        addr: served.addr().to_string(),
        stats,
        _served: served,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that does not announce its address (here, with bytes that are not even text)
    /// is stopped and reaped, not left running.
    #[test]
    fn a_server_that_fails_to_start_is_reaped() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for (i, says) in ["printf '\\377\\n'", "echo nothing to see"]
            .iter()
            .enumerate()
        {
            let pid_file = dir.path().join(format!("pid{i}"));
            let fake = dir.path().join(format!("fake{i}"));
            std::fs::write(
                &fake,
                format!(
                    "#!/bin/sh\necho $$ > {}\n{says}\nexec sleep 600\n",
                    pid_file.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
            let e = Server::start(
                &fake,
                &CellFlavour::Builtin(&crate::flavour::tcp_binary::TcpBinary),
                &Backend::None,
                true,
                None,
            );
            assert!(e.is_err(), "{says}");
            let pid = std::fs::read_to_string(&pid_file).unwrap();
            let proc = format!("/proc/{}", pid.trim());
            assert!(
                !std::path::Path::new(&proc).exists(),
                "{says}: the fake server {} is still there (running or a zombie)",
                pid.trim()
            );
        }
    }
}
