//! Reports from results CSVs (of one run, or many runs and hosts): the comparison table people
//! use for connection strategies on clean vs lossy links. Rounds and hosts are combined by
//! merging histograms and summing counts, never by averaging percentiles.

pub mod html;

use std::collections::BTreeMap;
use std::fmt::Write;

use hdrhistogram::Histogram;

use crate::results::{new_histogram, Row};

/// How a cell's rounds become one figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RoundSummary {
    /// Total time is the mean over rounds; latency and failures cover every round.
    #[default]
    Mean,
    /// The round with the median total time stands for the cell (its total, latency and
    /// failures), so one round disturbed by the machine does not move the figure.
    Median,
}

impl RoundSummary {
    pub fn parse(s: &str) -> Result<RoundSummary, String> {
        match s {
            "mean" => Ok(RoundSummary::Mean),
            "median" => Ok(RoundSummary::Median),
            _ => Err(format!(
                "unknown round summary \"{s}\" (use mean or median)"
            )),
        }
    }

    /// One sentence for the report, saying what the numbers are.
    pub fn explain(self) -> &'static str {
        match self {
            RoundSummary::Mean => {
                "total time is the mean over rounds of the time a cell's calls took; p99 and \
                 failures merge every round (and host)"
            }
            RoundSummary::Median => {
                "each cell shows its median round by total time (rounds of several hosts \
                 combined first): that round's total, p99 and failures"
            }
        }
    }
}

/// Everything measured for one (flavour, mode, workload, concurrency) under one profile.
#[derive(Debug)]
pub struct Cell {
    /// Rows combined (rounds × hosts) into these figures.
    pub rows: usize,
    /// Time the cell's calls took, ms: the mean over rows, or the median round's.
    pub mean_total_ms: f64,
    /// Calls per second: per round, the sum over hosts (they run at once); then the mean over
    /// rounds. The figure that matters for fixed-duration cells.
    pub calls_per_sec: f64,
    pub calls: u64,
    pub failed: u64,
    /// The combined rows' latency histograms, merged.
    pub latency: Histogram<u64>,
}

impl Cell {
    /// Combines rows: counts summed, histograms merged, total time averaged.
    fn combine(rows: &[&Row]) -> Result<Cell, String> {
        let mut cell = Cell {
            rows: rows.len(),
            mean_total_ms: 0.0,
            calls_per_sec: 0.0,
            calls: 0,
            failed: 0,
            latency: new_histogram(),
        };
        for r in rows {
            cell.calls += r.calls;
            cell.failed += r.failed;
            cell.latency
                .add(r.histogram()?)
                .map_err(|e| format!("cannot merge histograms: {e:?}"))?;
            cell.mean_total_ms += r.elapsed_ms as f64;
            cell.calls_per_sec += r.calls as f64 / (r.elapsed_ms.max(1) as f64 / 1e3);
        }
        let mut rounds: Vec<u32> = rows.iter().map(|r| r.round).collect();
        rounds.sort_unstable();
        rounds.dedup();
        cell.mean_total_ms /= rows.len().max(1) as f64;
        cell.calls_per_sec /= rounds.len().max(1) as f64;
        Ok(cell)
    }

    /// The median round: rows grouped by round number, each round combined, the one with the
    /// median total time kept (the lower of the middle two when the count is even).
    fn median_round(rows: &[&Row]) -> Result<Cell, String> {
        let mut by_round: BTreeMap<u32, Vec<&Row>> = BTreeMap::new();
        for &r in rows {
            by_round.entry(r.round).or_default().push(r);
        }
        let mut rounds = by_round
            .values()
            .map(|rs| Cell::combine(rs))
            .collect::<Result<Vec<_>, _>>()?;
        rounds.sort_by(|a, b| a.mean_total_ms.total_cmp(&b.mean_total_ms));
        let middle = (rounds.len() - 1) / 2;
        Ok(rounds.swap_remove(middle))
    }
}

/// A table: row keys in first-seen order, profile columns in first-seen order.
#[derive(Debug, Default)]
pub struct Table {
    pub rows: Vec<String>,
    pub profiles: Vec<String>,
    pub cells: BTreeMap<(usize, usize), Cell>,
    /// How the cells' rounds were combined.
    pub summary: RoundSummary,
    /// The hosts whose rows were combined, in first-seen order.
    pub hosts: Vec<String>,
}

fn row_key(r: &Row) -> String {
    let mut key = format!("{} {}", r.flavour, r.mode);
    if r.workload != "order" {
        key += &format!(" {}", r.workload);
    }
    if r.concurrency != 1 {
        key += &format!(" c={}", r.concurrency);
    }
    key
}

impl Table {
    pub fn build(rows: &[Row], summary: RoundSummary) -> Result<Table, String> {
        let mut t = Table {
            summary,
            ..Table::default()
        };
        let mut groups: BTreeMap<(usize, usize), Vec<&Row>> = BTreeMap::new();
        for r in rows {
            index_of(&mut t.hosts, r.host.clone());
            let profile = r.profile.clone().unwrap_or_else(|| "(unknown)".into());
            let ri = index_of(&mut t.rows, row_key(r));
            let pi = index_of(&mut t.profiles, profile);
            groups.entry((ri, pi)).or_default().push(r);
        }
        for (k, group) in groups {
            let cell = match summary {
                RoundSummary::Mean => Cell::combine(&group)?,
                RoundSummary::Median => Cell::median_round(&group)?,
            };
            t.cells.insert(k, cell);
        }
        Ok(t)
    }

    /// Plain-text rendering: mean total time, p99 and failures per cell.
    pub fn render(&self) -> String {
        let width = self.rows.iter().map(String::len).max().unwrap_or(0).max(14);
        let mut out = format!("({})\n", self.summary.explain());
        if self.hosts.len() > 1 {
            // Rows of one round from several load hosts ran at once: counts and calls/s add up.
            let _ = writeln!(
                out,
                "(rows of {} hosts combined: {})",
                self.hosts.len(),
                self.hosts.join(", ")
            );
        }
        let _ = write!(out, "{:<width$}", "flavour mode");
        for p in &self.profiles {
            let _ = write!(out, " | {:^41}", p);
        }
        out.push('\n');
        let _ = write!(out, "{:<width$}", "");
        for _ in &self.profiles {
            let _ = write!(
                out,
                " | {:>10} {:>10} {:>10} {:>8}",
                "total ms", "calls/s", "p99 ms", "failed"
            );
        }
        out.push('\n');
        for (ri, name) in self.rows.iter().enumerate() {
            let _ = write!(out, "{name:<width$}");
            for pi in 0..self.profiles.len() {
                match self.cells.get(&(ri, pi)) {
                    Some(c) => {
                        let p99 = if c.latency.is_empty() {
                            "-".to_string()
                        } else {
                            format!("{:.1}", c.latency.value_at_quantile(0.99) as f64 / 1e3)
                        };
                        let _ = write!(
                            out,
                            " | {:>10.1} {:>10.0} {:>10} {:>8}",
                            c.mean_total_ms, c.calls_per_sec, p99, c.failed
                        );
                    }
                    None => {
                        let _ = write!(out, " | {:>10} {:>10} {:>10} {:>8}", "", "", "", "");
                    }
                }
            }
            out.push('\n');
        }
        out
    }
}

fn index_of(list: &mut Vec<String>, item: String) -> usize {
    match list.iter().position(|x| *x == item) {
        Some(i) => i,
        None => {
            list.push(item);
            list.len() - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(flavour: &str, mode: &str, profile: &str, elapsed_ms: u64, latencies: &[u64]) -> Row {
        let mut h = new_histogram();
        for &l in latencies {
            h.record(l).unwrap();
        }
        let mut r = Row {
            flavour: flavour.into(),
            mode: mode.into(),
            workload: "order".into(),
            concurrency: 1,
            profile: Some(profile.into()),
            calls: latencies.len() as u64,
            elapsed_ms,
            ..Row::default()
        };
        r.set_latency(&h);
        r
    }

    #[test]
    fn rounds_average_totals_and_merge_histograms() {
        let rows = [
            row("grpc", "single", "local", 10, &[100, 200]),
            row("grpc", "single", "local", 30, &[300, 400_000]),
            row("grpc", "per-call", "lossy", 50, &[1000]),
        ];
        let t = Table::build(&rows, RoundSummary::Mean).unwrap();
        assert_eq!(t.rows, ["grpc single", "grpc per-call"]);
        assert_eq!(t.profiles, ["local", "lossy"]);
        let c = &t.cells[&(0, 0)];
        assert_eq!((c.rows, c.calls, c.latency.len()), (2, 4, 4));
        assert_eq!(c.mean_total_ms, 20.0);
        // Two rounds (both round 0 here, as from two hosts at once): 2/0.01 + 2/0.03 calls/s.
        assert!((c.calls_per_sec - (200.0 + 2.0 / 0.03)).abs() < 1e-9);
        assert!(
            c.latency.value_at_quantile(0.99) >= 399_000,
            "merged, not averaged"
        );
        let text = t.render();
        assert!(
            text.contains("grpc per-call") && text.contains("lossy"),
            "{text}"
        );
    }

    #[test]
    fn the_median_round_stands_for_the_cell() {
        let mut rows = Vec::new();
        // Rounds 1..=3 take 50, 10 and 30 ms; round 2 is measured by two hosts (10 and 20 ms,
        // combined to 15 ms), so the median round is round 3 (30 ms) with its one slow call.
        for (round, elapsed, lat) in [(1, 50, 900), (2, 10, 100), (2, 20, 200), (3, 30, 300)] {
            let mut r = row("grpc", "single", "local", elapsed, &[lat, lat]);
            r.round = round;
            rows.push(r);
        }
        let t = Table::build(&rows, RoundSummary::Median).unwrap();
        let c = &t.cells[&(0, 0)];
        assert_eq!((c.rows, c.calls, c.mean_total_ms), (1, 2, 30.0));
        assert_eq!(c.latency.max(), 300);
        let mean = Table::build(&rows, RoundSummary::Mean).unwrap();
        assert_eq!(mean.cells[&(0, 0)].mean_total_ms, 27.5);
        assert!(t.render().contains("median round"));
        // Even counts take the lower middle: rounds 1 and 2 only -> round 2 (15 ms).
        let t = Table::build(&rows[..3], RoundSummary::Median).unwrap();
        assert_eq!(t.cells[&(0, 0)].mean_total_ms, 15.0);
    }
}
