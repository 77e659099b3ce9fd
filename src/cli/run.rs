//! `faultrig run`: an experiment's servers, proxies and every cell, then the report.
//!
//! Its flags override the experiment file's keys, so they stay text here and are checked with
//! the file's values by [`crate::experiment::ExperimentFile::validate`], which names the flag
//! when a flag set the value: one set of rules for both.

use std::path::PathBuf;

use clap::Args;

use super::report::{finish_report, ReportFlags};
use super::{host_name, namespace_error, run_id, runtime, shutdown_signal, CliError};
use crate::experiment::{Experiment, ExperimentFile, DEFAULT};
use crate::report::Table;

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

/// `run`'s arguments, checked: the experiment with the flags merged in.
pub struct Run {
    experiment: Experiment,
    out: PathBuf,
    host: String,
    report: ReportFlags,
}

impl RunArgs {
    /// The experiment file (or the built-in one) with the flags over it, every value checked.
    pub(crate) fn validate(self) -> Result<Run, CliError> {
        let (file, origin) = match &self.experiment {
            Some(path) => (ExperimentFile::load(path), path.display().to_string()),
            None => (
                ExperimentFile::parse(DEFAULT, "<built-in lan-compare>"),
                "<built-in lan-compare>".into(),
            ),
        };
        let overrides = ExperimentFile {
            profiles: self.profiles,
            flavours: self.flavours,
            modes: self.modes,
            workloads: self.workloads,
            concurrency: self.concurrency,
            calls: self.calls,
            duration: self.duration,
            warmup: self.warmup,
            timeout: self.timeout,
            rounds: self.rounds,
            round_summary: self.round_summary,
            seed: self.seed,
            engine: self.engine,
            nodelay: self
                .nodelay
                .map(|v| toml::Value::Array(v.into_iter().map(toml::Value::Boolean).collect())),
            write_pattern: self
                .write_pattern
                .map(|v| toml::Value::Array(v.into_iter().map(toml::Value::String).collect())),
            ..ExperimentFile::default()
        };
        let usage = |e: crate::experiment::ExperimentError| CliError::Usage(e.to_string());
        let experiment = file
            .map_err(usage)?
            .merge(overrides)
            .validate(&origin)
            .map_err(usage)?;
        Ok(Run {
            experiment,
            out: self.out,
            host: self.host.unwrap_or_else(host_name),
            report: self.report,
        })
    }
}

pub fn run(r: Run) -> Result<(), CliError> {
    let experiment = &r.experiment;
    if experiment.engine.is_privileged() {
        // Before any server starts: a missing privilege is one message and exit 2.
        crate::link::Namespace::new().map_err(namespace_error)?;
    }
    let run_id = run_id("run");
    let files = crate::runner::RunFiles::create(&r.out, &run_id).map_err(|e| {
        CliError::Usage(format!(
            "--out {}: cannot create the run directory: {e}",
            r.out.display()
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
    let outcome = rt
        .block_on(crate::runner::run(
            experiment,
            &files,
            &bin,
            &r.host,
            interrupted,
        ))
        .map_err(|e| CliError::Failed(e.into()))?;
    let rows = &outcome.rows;
    // Failed cells (an external flavour's client that exited non-zero, hung or printed
    // garbage) have no row: they are listed in a file next to the CSV and after the report.
    let failed = failed_cells(&files, &outcome.failed)?;
    if rows.is_empty() && !outcome.failed.is_empty() {
        return Err(CliError::Failed(anyhow::anyhow!(
            "every cell failed, so there is no report\n{failed}"
        )));
    }
    let table =
        Table::build(rows, experiment.round_summary).map_err(|e| CliError::Failed(e.into()))?;
    let html = files.dir.join("report.html");
    let title = format!("faultrig run {run_id}");
    let done = format!(
        "{} rows in {}; report in {}",
        rows.len(),
        files.csv.display(),
        html.display()
    );
    println!();
    let reported = finish_report(
        &table,
        rows.len(),
        &r.report,
        None,
        Some((&html, &title)),
        &done,
    );
    if outcome.failed.is_empty() {
        return reported;
    }
    // Exit 1, as a failed gate does; with the gates' own failures when there are some.
    match reported {
        Ok(()) => Err(CliError::Failed(anyhow::anyhow!(failed))),
        Err(CliError::Failed(e)) => Err(CliError::Failed(anyhow::anyhow!("{e}\n{failed}"))),
        Err(usage) => Err(usage),
    }
}

/// Writes OUT/RUN_ID/failed-cells.txt (one line per failed cell: round, cell, reason) when a
/// cell failed; returns the same lines under a heading naming the file.
fn failed_cells(
    files: &crate::runner::RunFiles,
    failed: &[crate::runner::FailedCell],
) -> Result<String, CliError> {
    if failed.is_empty() {
        return Ok(String::new());
    }
    let path = files.dir.join("failed-cells.txt");
    let lines: Vec<String> = failed
        .iter()
        .map(|f| format!("round {}, {}: {}", f.round, f.cell, f.reason))
        .collect();
    std::fs::write(&path, lines.join("\n") + "\n")
        .map_err(|e| CliError::Failed(anyhow::anyhow!("write {}: {e}", path.display())))?;
    Ok(format!(
        "{} cell(s) failed and have no row (also in {}):\n{}",
        failed.len(),
        path.display(),
        lines.join("\n")
    ))
}
