//! The experiment runner behind `faultrig run`: it puts servers and fault proxies in place —
//! started here ([`local`]) or on other hosts and driven through a control API ([`remote`]) —
//! then runs every cell, round by round in a fixed order, writing each row as soon as it is
//! measured. Both kinds of target give the same CSV; what one cannot measure (a remote server's
//! CPU time) stays empty.

mod external;
mod local;
mod remote;

pub use external::ServerError;
pub use local::LocalError;
pub use remote::RemoteError;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::bench::{self, BenchSpec, RigTarget};
use crate::experiment::{Cell, CellFlavour, Experiment};
use crate::flavour::SocketOptions;
use crate::proxy::StatsSnapshot;
use crate::results::{ResultsWriter, Row};

/// What a run reads around each cell, where it can.
#[derive(Debug, Default)]
struct Probe {
    /// The cell's proxy counters.
    proxy: Option<StatsSnapshot>,
    /// The server process's CPU time so far.
    server_cpu_ms: Option<u64>,
    /// The server's peak RSS since the cell began (read after it).
    server_rss_kb: Option<u64>,
}

/// A cell measured: its row (before the run-level and proxy columns), and the counters as
/// its measured calls began.
struct Measured {
    row: Row,
    before: Probe,
    /// The client did not count its connections: the proxy's count of those it accepted
    /// since this reading fills `conns_opened`.
    conns_since: Option<u64>,
}

/// A cell that gave no row, and why.
#[derive(Clone, Debug)]
pub struct FailedCell {
    pub round: u32,
    /// The cell's axes, as the report names them.
    pub cell: String,
    pub reason: String,
}

/// What a run produced: a row per measured cell, and the cells that failed.
#[derive(Debug, Default)]
pub struct RunOutcome {
    pub rows: Vec<Row>,
    pub failed: Vec<FailedCell>,
}

/// Why a run stopped before its cells were done (a cell that fails is not this: it is a
/// [`FailedCell`], and the run goes on).
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("write {}", path.display())]
    OpenResults {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    WriteRow(std::io::Error),
    #[error(transparent)]
    Local(#[from] local::LocalError),
    #[error(transparent)]
    Remote(#[from] remote::RemoteError),
}

/// The servers and proxies of a run.
enum Targets {
    Local(local::LocalTargets),
    Remote(remote::RemoteTargets),
}

impl Targets {
    async fn start(exp: &Experiment, bin: &Path) -> Result<Targets, RunnerError> {
        Ok(match &exp.remote {
            None => Targets::Local(local::LocalTargets::start(exp, bin).await?),
            Some(r) => Targets::Remote(remote::RemoteTargets::start(exp, r).await?),
        })
    }

    /// Prepares the cell (its profile in place); returns where its calls go and how its
    /// client sockets are made.
    async fn enter(&mut self, exp: &Experiment, cell: &Cell) -> (String, SocketOptions) {
        match self {
            Targets::Local(t) => t.enter(exp, cell),
            Targets::Remote(t) => {
                let addr = t.enter(exp, cell).await;
                let socket = SocketOptions {
                    nodelay: cell.nodelay,
                    write_pattern: cell.write_pattern,
                    ..SocketOptions::default()
                };
                (addr, socket)
            }
        }
    }

    /// The counters as the cell's measured calls begin (after its warm-up).
    async fn begin(&self, exp: &Experiment, cell: &Cell) -> Probe {
        match self {
            Targets::Local(t) => t.begin(exp, cell).await,
            Targets::Remote(t) => t.counters(exp, cell).await,
        }
    }

    async fn leave(&self, exp: &Experiment, cell: &Cell) -> Probe {
        match self {
            Targets::Local(t) => t.leave(exp, cell).await,
            Targets::Remote(t) => t.counters(exp, cell).await,
        }
    }

    async fn finish(self) {
        match self {
            Targets::Local(t) => drop(t),
            Targets::Remote(t) => t.finish().await,
        }
    }
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

/// Runs every cell of `exp`; returns the rows written and the cells that failed. Stops early
/// (with every finished row on disk) when `interrupted` completes.
pub async fn run(
    exp: &Experiment,
    files: &RunFiles,
    bin: &Path,
    host: &str,
    interrupted: impl std::future::Future,
) -> Result<RunOutcome, RunnerError> {
    let mut writer =
        ResultsWriter::append(&files.csv).map_err(|source| RunnerError::OpenResults {
            path: files.csv.clone(),
            source,
        })?;
    let mut targets = Targets::start(exp, bin).await?;
    let mut outcome = RunOutcome::default();
    let measured = run_cells(
        exp,
        files,
        bin,
        host,
        &mut targets,
        &mut writer,
        &mut outcome,
        interrupted,
    );
    let result = measured.await;
    // Also after a failure: a remote proxy host is left as it was found.
    targets.finish().await;
    result.map(|()| outcome)
}

/// Every cell, round by round; each row is written and kept as soon as it is measured, each
/// failed cell kept with its reason.
async fn run_cells(
    exp: &Experiment,
    files: &RunFiles,
    bin: &Path,
    host: &str,
    targets: &mut Targets,
    writer: &mut ResultsWriter,
    outcome: &mut RunOutcome,
    interrupted: impl std::future::Future,
) -> Result<(), RunnerError> {
    let cells = exp.cells();
    let total = cells.len() as u64 * u64::from(exp.rounds);
    let progress = indicatif::ProgressBar::new(total).with_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} cells  {msg}  elapsed {elapsed}  eta {eta}",
        )
        .expect("valid template"),
    );
    tokio::pin!(interrupted);
    for round in 1..=exp.rounds {
        for cell in &cells {
            let (addr, socket) = targets.enter(exp, cell).await;
            let measured = tokio::select! {
                measured = measure(exp, cell, addr, socket, targets, bin) => measured,
                _ = &mut interrupted => {
                    progress.abandon_with_message("interrupted");
                    return Ok(());
                }
            };
            progress.inc(1);
            let Measured {
                mut row,
                before,
                conns_since,
            } = match measured {
                Ok(m) => m,
                Err(reason) => {
                    let failed = FailedCell {
                        round,
                        cell: describe(exp, cell),
                        reason,
                    };
                    // Said now, not only at the end (println would say nothing without a
                    // terminal, where the bar is hidden).
                    progress.suspend(|| {
                        eprintln!(
                            "round {}, {}: failed: {}",
                            failed.round, failed.cell, failed.reason
                        )
                    });
                    outcome.failed.push(failed);
                    continue;
                }
            };
            let after = targets.leave(exp, cell).await;
            row.run_id = files.run_id.clone();
            row.host = host.to_string();
            row.round = round;
            row.profile = Some(exp.profiles[cell.profile].name.clone());
            row.workload = cell.workload.label.clone();
            row.engine = Some(exp.engine.as_str().to_string());
            if let (Some(b), Some(a)) = (conns_since, &after.proxy) {
                row.conns_opened = a.connections.saturating_sub(b);
            }
            fill_measurements(&mut row, before, after);
            writer.write(&row).map_err(RunnerError::WriteRow)?;
            progress.set_message(format!("{:.0} calls/s", row.throughput_rps));
            outcome.rows.push(row);
        }
    }
    progress.finish_and_clear();
    Ok(())
}

/// Runs one cell's calls against `addr` with its flavour; the counters are read after the
/// warm-up, so they cover the row's calls only. `Err` is why the cell gave no row.
async fn measure(
    exp: &Experiment,
    cell: &Cell,
    addr: String,
    socket: SocketOptions,
    targets: &Targets,
    bin: &Path,
) -> Result<Measured, String> {
    let load: Arc<dyn bench::Target> = match &cell.flavour {
        CellFlavour::Builtin(flavour) => {
            Arc::new(RigTarget::new(*flavour, cell.workload.workload, exp.seed))
        }
        CellFlavour::Target(t) => t.load.clone(),
        CellFlavour::External(x) => {
            return external::run_cell(bin, x, exp, cell, &addr, || targets.begin(exp, cell))
                .await
                .map_err(|e| format!("external flavour {}: its client {e}", x.name));
        }
    };
    let spec = BenchSpec {
        load,
        target: addr,
        mode: cell.mode,
        concurrency: cell.concurrency,
        stop: exp.stop,
        warmup: exp.warmup,
        rate: None,
        timeout: exp.timeout,
        seed: exp.seed,
        socket,
    };
    let (outcome, before) = bench::run_with(&spec, targets.begin(exp, cell)).await;
    // The experiment's name for it: a target's `grpc` or `http1` says what, not which.
    let row = Row {
        flavour: cell.flavour.name().to_string(),
        ..outcome.row(&spec)
    };
    Ok(Measured {
        row,
        before,
        conns_since: None,
    })
}

/// `profile P, flavour F, mode M, workload W, concurrency C` (and the socket axes when the
/// experiment varies them): which cell a message is about.
fn describe(exp: &Experiment, cell: &Cell) -> String {
    let mut s = format!(
        "profile {}, flavour {}, mode {}, workload {}, concurrency {}",
        exp.profiles[cell.profile].name,
        cell.flavour.name(),
        cell.mode,
        cell.workload.label,
        cell.concurrency
    );
    if exp.nodelay.len() > 1 {
        s += &format!(", nodelay {}", cell.nodelay);
    }
    if exp.write_patterns.len() > 1 {
        s += &format!(", write pattern {}", cell.write_pattern.as_str());
    }
    s
}

/// The proxy's and server's share of the cell: differences of counters read around it.
fn fill_measurements(row: &mut Row, before: Probe, after: Probe) {
    if let Some((b, a)) = before.proxy.zip(after.proxy) {
        // saturating: a proxy restarted on its host mid-cell starts its counters again.
        row.bytes_up = Some(a.bytes_up.saturating_sub(b.bytes_up));
        row.bytes_down = Some(a.bytes_down.saturating_sub(b.bytes_down));
        row.stalls_up = Some(a.stalls_up.saturating_sub(b.stalls_up));
        row.stalls_down = Some(a.stalls_down.saturating_sub(b.stalls_down));
    }
    row.server_cpu_ms = before
        .server_cpu_ms
        .zip(after.server_cpu_ms)
        .map(|(b, a)| a.saturating_sub(b));
    row.server_rss_kb = after.server_rss_kb;
}
