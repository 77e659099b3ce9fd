//! `faultrig report`, and what it shares with `run`: the gates, the JSON summary, the HTML page.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;

use super::CliError;
use crate::report::gate::{self, Assertion};
use crate::report::{compare, RoundSummary, Table};

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

/// `report`'s arguments, checked: the tables read and combined, the baseline compared.
pub(crate) struct Report {
    table: Table,
    rows: usize,
    comparison: Option<compare::Comparison>,
    fail_on_regression: bool,
    html: Option<PathBuf>,
    flags: ReportFlags,
}

impl ReportArgs {
    /// Reads the results files (and the baseline's): a missing or foreign file, or a broken
    /// row, is bad input naming the file.
    pub(crate) fn validate(self) -> Result<Report, CliError> {
        let (table, rows) = read_table(&self.files, self.rounds)?;
        let comparison = if self.baseline.is_empty() {
            None
        } else {
            let (old, _) = read_table(&self.baseline, self.rounds)?;
            Some(compare::compare(&old, &table, self.threshold))
        };
        Ok(Report {
            table,
            rows,
            comparison,
            fail_on_regression: self.fail_on_regression,
            html: self.html,
            flags: self.flags,
        })
    }
}

pub fn run(r: Report) -> Result<(), CliError> {
    let html = r.html.as_deref().map(|p| (p, "faultrig report"));
    finish_report(
        &r.table,
        r.rows,
        &r.flags,
        r.comparison.as_ref().map(|c| (c, r.fail_on_regression)),
        html,
        "",
    )
}

/// Reads and combines results files: bad input (a missing or foreign file, a broken row) is
/// a usage error naming the file.
fn read_table(files: &[PathBuf], rounds: RoundSummary) -> Result<(Table, usize), CliError> {
    let mut rows = Vec::new();
    for f in files {
        rows.extend(crate::results::read(f).map_err(|e| CliError::Usage(e.to_string()))?);
    }
    let table = Table::build(&rows, rounds).map_err(|e| CliError::Usage(e.to_string()))?;
    Ok((table, rows.len()))
}

/// What `run` and `report` do with a finished table: print it (or its JSON), write the HTML
/// and JSON files asked for, then check the gates and the baseline, exit 1 naming every cell
/// that failed one. The files are written first, so a failed gate still leaves its report.
pub(super) fn finish_report(
    table: &Table,
    rows: usize,
    flags: &ReportFlags,
    baseline: Option<(&compare::Comparison, bool)>,
    html: Option<(&Path, &str)>,
    done: &str,
) -> Result<(), CliError> {
    let checks = gate::check(table, &flags.assert);
    let comparison = baseline.map(|(c, _)| c);
    if let Some((path, title)) = html {
        write_html(path, title, table, rows, &checks, comparison)?;
    }
    let json = || crate::report::json::summary(table, rows, &checks, comparison);
    let mut out = std::io::stdout();
    match flags.json.as_deref() {
        Some(p) if p == Path::new("-") => {
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
                let _ = write!(out, "\n{}", gate::render(&checks));
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
    path: &Path,
    title: &str,
    table: &Table,
    rows: usize,
    checks: &[gate::Check],
    baseline: Option<&compare::Comparison>,
) -> Result<(), CliError> {
    let page = crate::report::html::page(title, table, rows, checks, baseline)
        .map_err(|e| CliError::Failed(e.into()))?;
    std::fs::write(path, page)
        .map_err(|e| CliError::Failed(anyhow::anyhow!("write {}: {e}", path.display())))
}
