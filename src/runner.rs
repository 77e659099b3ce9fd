//! The experiment runner behind `faultrig run`: one `faultrig serve` child process per flavour
//! and downstream (so its CPU time and peak RSS can be read from /proc), one fault proxy per
//! profile in front of each server (named after the profile, so every flavour sees the same
//! fault streams), then every cell, round by round in a fixed order, each row written as soon
//! as it is measured.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use anyhow::{bail, Context};
use tokio::sync::oneshot;

use crate::bench::{self, BenchSpec};
use crate::experiment::{DownstreamSpec, Experiment};
use crate::flavour::Flavour;
use crate::local_redis::LocalRedis;
use crate::proxy::{Proxy, ProxyOptions, ProxyStats, StatsSnapshot};
use crate::results::{ResultsWriter, Row};
use crate::service::Downstream;

/// A `faultrig serve` child process; killed and reaped on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(bin: &Path, flavour: &dyn Flavour, downstream: &Downstream) -> anyhow::Result<Server> {
        let mut child = Command::new(bin)
            .args([
                "serve",
                "--flavour",
                flavour.name(),
                "--listen",
                "127.0.0.1:0",
                "--downstream",
                &downstream.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start the {} server", flavour.name()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .context("read the server's address")?;
        let Some(addr) = line
            .split("listening on ")
            .nth(1)
            .map(|a| a.trim().to_string())
        else {
            let _ = child.kill();
            bail!("the {} server did not start: {line:?}", flavour.name());
        };
        Ok(Server { child, addr })
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
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One server and the proxies (one per profile) in front of it.
struct Target {
    server: Server,
    proxies: Vec<RunningProxy>,
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

/// Where a run's files go.
pub struct RunFiles {
    pub run_id: String,
    pub dir: PathBuf,
    pub csv: PathBuf,
}

impl RunFiles {
    /// `OUT/RUN_ID/results.csv`; a run never writes into another run's directory.
    pub fn create(out: &Path, run_id: &str) -> std::io::Result<RunFiles> {
        let dir = out.join(run_id);
        std::fs::create_dir_all(out)?;
        std::fs::create_dir(&dir)?;
        Ok(RunFiles {
            run_id: run_id.to_string(),
            csv: dir.join("results.csv"),
            dir,
        })
    }
}

/// Runs every cell of `exp`; returns the rows written. Stops early (with every finished row on
/// disk) when `interrupted` completes.
pub async fn run(
    exp: &Experiment,
    files: &RunFiles,
    bin: &Path,
    interrupted: impl std::future::Future,
) -> anyhow::Result<Vec<Row>> {
    let mut writer = ResultsWriter::append(&files.csv)
        .with_context(|| format!("write {}", files.csv.display()))?;
    let downstreams = exp.downstreams();
    // Started before any server, so a missing redis-server fails the run before any traffic.
    let local_redis = if downstreams.contains(&DownstreamSpec::LocalRedis) {
        Some(LocalRedis::start().map_err(|e| anyhow::anyhow!("workload @redis: {e}"))?)
    } else {
        None
    };
    // targets[downstream][flavour]: a server and one proxy per profile in front of it.
    let mut targets: Vec<Vec<Target>> = Vec::new();
    for spec in &downstreams {
        let downstream = match spec {
            DownstreamSpec::Given(d) => d.clone(),
            DownstreamSpec::LocalRedis => {
                Downstream::Redis(local_redis.as_ref().expect("started above").url())
            }
        };
        let mut per_flavour = Vec::new();
        for &flavour in &exp.flavours {
            let server = Server::start(bin, flavour, &downstream)?;
            let mut proxies = Vec::new();
            for profile in &exp.profiles {
                proxies.push(start_proxy(&server.addr, profile, exp.seed).await?);
            }
            per_flavour.push(Target { server, proxies });
        }
        targets.push(per_flavour);
    }
    let cells = exp.cells();
    let total = cells.len() as u64 * u64::from(exp.rounds);
    let progress = indicatif::ProgressBar::new(total).with_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} cells  {msg}  elapsed {elapsed}  eta {eta}",
        )
        .expect("valid template"),
    );
    let host = crate::cli::host_name();
    let mut rows = Vec::new();
    tokio::pin!(interrupted);
    'rounds: for round in 1..=exp.rounds {
        for cell in &cells {
            let f = exp
                .flavours
                .iter()
                .position(|x| x.name() == cell.flavour.name())
                .expect("listed");
            let d = downstreams
                .iter()
                .position(|x| *x == cell.workload.downstream)
                .expect("listed");
            let target = &targets[d][f];
            let (server, proxy) = (&target.server, &target.proxies[cell.profile]);
            let spec = BenchSpec {
                flavour: cell.flavour,
                target: proxy.addr.clone(),
                mode: cell.mode,
                workload: cell.workload.workload,
                concurrency: cell.concurrency,
                stop: exp.stop,
                warmup: exp.warmup,
                rate: None,
                timeout: exp.timeout,
                seed: exp.seed,
            };
            let before = proxy.stats.snapshot();
            let cpu_before = server.cpu_ms();
            server.reset_peak_rss();
            let outcome = tokio::select! {
                outcome = bench::run(&spec) => outcome,
                _ = &mut interrupted => {
                    progress.abandon_with_message("interrupted");
                    break 'rounds;
                }
            };
            let after = proxy.stats.snapshot();
            let mut row = outcome.row(&spec);
            row.run_id = files.run_id.clone();
            row.host = host.clone();
            row.round = round;
            row.profile = Some(exp.profiles[cell.profile].name.clone());
            row.workload = cell.workload.label.clone();
            fill_proxy(&mut row, before, after);
            row.server_cpu_ms = cpu_before
                .zip(server.cpu_ms())
                .map(|(b, a)| a.saturating_sub(b));
            row.server_rss_kb = server.peak_rss_kb();
            writer.write(&row)?;
            progress.set_message(format!("{:.0} calls/s", outcome.throughput()));
            progress.inc(1);
            rows.push(row);
        }
    }
    progress.finish_and_clear();
    Ok(rows)
}

fn fill_proxy(row: &mut Row, before: StatsSnapshot, after: StatsSnapshot) {
    row.bytes_up = Some(after.bytes_up - before.bytes_up);
    row.bytes_down = Some(after.bytes_down - before.bytes_down);
    row.stalls_up = Some(after.stalls_up - before.stalls_up);
    row.stalls_down = Some(after.stalls_down - before.stalls_down);
}
