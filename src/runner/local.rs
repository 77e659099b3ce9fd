//! A local run's targets: one `faultrig serve` child process per flavour and downstream (so its
//! CPU time and peak RSS can be read from /proc), and one in-process fault proxy per profile in
//! front of each server (named after the profile, so every flavour meets the same fault
//! streams).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use anyhow::{bail, Context};
use tokio::sync::oneshot;

use super::Probe;
use crate::experiment::{Cell, DownstreamSpec, Experiment};
use crate::flavour::Flavour;
use crate::link::Engine;
use crate::local_redis::LocalRedis;
use crate::proxy::{Proxy, ProxyOptions, ProxyStats};
use crate::service::Downstream;

/// Every server and proxy of a local run; all stopped on drop.
pub struct LocalTargets {
    /// The distinct downstreams, in the order of `targets`' first index.
    downstreams: Vec<DownstreamSpec>,
    /// `targets[downstream][flavour]`: a server and one proxy per profile in front of it.
    targets: Vec<Vec<Target>>,
    /// The private redis-server of `deduct@redis` cells. Declared after `targets`, so it is
    /// stopped after the servers using it.
    _redis: Option<LocalRedis>,
}

impl LocalTargets {
    pub async fn start(exp: &Experiment, bin: &Path) -> anyhow::Result<LocalTargets> {
        let downstreams = exp.downstreams();
        // Started before any server, so a missing redis-server fails the run before any traffic.
        let redis = if downstreams.contains(&DownstreamSpec::LocalRedis) {
            let redis = LocalRedis::start(Some(bin));
            Some(redis.map_err(|e| anyhow::anyhow!("workload @redis: {e}"))?)
        } else {
            None
        };
        let mut targets = Vec::new();
        for spec in &downstreams {
            let downstream = match spec {
                DownstreamSpec::Given(d) => d.clone(),
                DownstreamSpec::LocalRedis => {
                    Downstream::Redis(redis.as_ref().expect("started above").url())
                }
            };
            let mut per_flavour = Vec::new();
            for &flavour in &exp.flavours {
                let server = Server::start(bin, flavour, &downstream)?;
                let mut proxies = Vec::new();
                for profile in &exp.profiles {
                    proxies.push(start_proxy(&server.addr, profile, exp.seed, exp.engine).await?);
                }
                per_flavour.push(Target { server, proxies });
            }
            targets.push(per_flavour);
        }
        Ok(LocalTargets {
            downstreams,
            targets,
            _redis: redis,
        })
    }

    fn target(&self, exp: &Experiment, cell: &Cell) -> (&Server, &RunningProxy) {
        let f = exp.flavour_index(cell.flavour);
        let d = self
            .downstreams
            .iter()
            .position(|x| *x == cell.workload.downstream)
            .expect("listed");
        let target = &self.targets[d][f];
        (&target.server, &target.proxies[cell.profile])
    }

    /// The address of the cell's proxy.
    pub fn enter(&self, exp: &Experiment, cell: &Cell) -> String {
        self.target(exp, cell).1.addr.clone()
    }

    /// The counters as the measured calls begin; the server's peak RSS starts again here.
    pub fn begin(&self, exp: &Experiment, cell: &Cell) -> Probe {
        let (server, proxy) = self.target(exp, cell);
        server.reset_peak_rss();
        Probe {
            proxy: Some(proxy.stats.snapshot()),
            server_cpu_ms: server.cpu_ms(),
            server_rss_kb: None,
        }
    }

    /// The counters after the cell.
    pub fn leave(&self, exp: &Experiment, cell: &Cell) -> Probe {
        let (server, proxy) = self.target(exp, cell);
        Probe {
            proxy: Some(proxy.stats.snapshot()),
            server_cpu_ms: server.cpu_ms(),
            server_rss_kb: server.peak_rss_kb(),
        }
    }
}

/// One server and the proxies (one per profile) in front of it.
struct Target {
    server: Server,
    proxies: Vec<RunningProxy>,
}

/// A `faultrig serve` child process; stopped and reaped on drop, and ending by itself if this
/// process dies ([`crate::child`]).
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(bin: &Path, flavour: &dyn Flavour, downstream: &Downstream) -> anyhow::Result<Server> {
        let child = Command::new(bin)
            .args([
                "serve",
                "--flavour",
                flavour.name(),
                "--listen",
                "127.0.0.1:0",
                "--downstream",
                &downstream.to_string(),
                crate::child::PARENT_FLAG,
                &std::process::id().to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start the {} server", flavour.name()))?;
        // Guarded before anything can fail: every early return below stops and reaps it.
        let mut server = Server {
            child,
            addr: String::new(),
        };
        let mut line = String::new();
        BufReader::new(server.child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .context("read the server's address")?;
        let Some(addr) = line.split("listening on ").nth(1) else {
            bail!("the {} server did not start: {line:?}", flavour.name());
        };
        server.addr = addr.trim().to_string();
        Ok(server)
    }

    /// CPU time (user + system) so far, in milliseconds.
    fn cpu_ms(&self) -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).ok()?;
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
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.child.id()), "5");
    }

    /// Peak resident set size since the last reset, in KiB.
    fn peak_rss_kb(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        crate::child::stop(&mut self.child);
    }
}

/// An in-process proxy in front of one server; stopped on drop.
struct RunningProxy {
    addr: String,
    stats: Arc<ProxyStats>,
    _stop: oneshot::Sender<()>,
}

async fn start_proxy(
    upstream: &str,
    profile: &crate::profile::Profile,
    seed: u64,
    engine: Engine,
) -> anyhow::Result<RunningProxy> {
    let listener = crate::net::bind("127.0.0.1:0".parse().expect("valid"))?;
    let addr = listener.local_addr()?.to_string();
    let options = ProxyOptions {
        // Keyed by profile only: every flavour meets the same fault streams.
        name: profile.name.clone(),
        seed,
        ..ProxyOptions::default()
    };
    let proxy = Proxy::new(upstream, profile.clone(), options);
    let proxy = match engine {
        Engine::Kernel => proxy.with_kernel_engine().await?,
        _ => proxy,
    };
    let stats = proxy.stats();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(proxy.run(listener, async move {
        let _ = stopped.await;
    }));
    Ok(RunningProxy {
        addr,
        stats,
        _stop: stop,
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
                &crate::flavour::tcp_binary::TcpBinary,
                &Downstream::None,
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
