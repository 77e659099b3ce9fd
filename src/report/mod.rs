//! Reports from results CSVs (of one run, or many runs and hosts): the comparison table people
//! use for connection strategies on clean vs lossy links. Rounds and hosts are combined by
//! merging histograms and summing counts, never by averaging percentiles.
//!
//! Rows of one cell that ran *at once* (several load hosts of one experiment, each a
//! `faultrig bench` of its own) form one round, and their calls/s add up. What "at once" means
//! comes from the rows themselves: the same round number, different runs (`run_id`), and
//! measured intervals (`started_at` + `elapsed_ms`) that overlap. Any other row is a round of
//! its own: another run appended to the same CSV, or the same round number measured an hour
//! later, is averaged with the rest, never added.

pub mod html;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, SystemTime};

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
                "each cell shows its median round by total time (rows of several hosts that ran \
                 at once combined first): that round's total, p99 and failures"
            }
        }
    }
}

/// Everything measured for one (flavour, mode, workload, concurrency) under one profile.
#[derive(Debug)]
pub struct Cell {
    /// Rows combined (rounds × hosts) into these figures.
    pub rows: usize,
    /// Rounds as they ran: rows that ran at once count as one (see the module's doc).
    pub rounds: usize,
    /// Time the cell's calls took, ms: the mean over rows, or the median round's.
    pub mean_total_ms: f64,
    /// Calls per second: per round, the sum over the rows that ran at once; then the mean over
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
        let rounds = rounds_as_run(rows);
        let mut cell = Cell {
            rows: rows.len(),
            rounds: rounds.len(),
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
            // Summed over every row, then divided by the rounds: each round's rows that ran at
            // once add up, and the rounds are averaged.
            cell.calls_per_sec += r.calls as f64 / (r.elapsed_ms.max(1) as f64 / 1e3);
        }
        cell.mean_total_ms /= rows.len().max(1) as f64;
        cell.calls_per_sec /= rounds.len().max(1) as f64;
        Ok(cell)
    }

    /// The median round: the rows grouped into rounds as they ran, each round combined, the one
    /// with the median total time kept (the lower of the middle two when the count is even).
    fn median_round(rows: &[&Row]) -> Result<Cell, String> {
        let mut rounds = rounds_as_run(rows)
            .iter()
            .map(|rs| Cell::combine(rs))
            .collect::<Result<Vec<_>, _>>()?;
        rounds.sort_by(|a, b| a.mean_total_ms.total_cmp(&b.mean_total_ms));
        let middle = (rounds.len() - 1) / 2;
        Ok(rounds.swap_remove(middle))
    }
}

/// A cell's rows grouped into rounds as they ran: rows of one round number from different runs
/// whose measured intervals overlap ran at once and form one round; every other row is a round
/// of its own (the module's doc says why).
fn rounds_as_run<'a>(rows: &[&'a Row]) -> Vec<Vec<&'a Row>> {
    let mut rounds: Vec<Vec<&Row>> = Vec::new();
    for &r in rows {
        let at_once = |round: &Vec<&Row>| {
            round
                .iter()
                .all(|o| o.round == r.round && o.run_id != r.run_id)
                && round.iter().any(|o| overlap(o, r))
        };
        match rounds.iter_mut().find(|round| at_once(round)) {
            Some(round) => round.push(r),
            None => rounds.push(vec![r]),
        }
    }
    rounds
}

/// Whether two rows' measured phases overlapped in time; false when either has no time.
fn overlap(a: &Row, b: &Row) -> bool {
    match (measured(a), measured(b)) {
        (Some((a0, a1)), Some((b0, b1))) => a0 < b1 && b0 < a1,
        _ => false,
    }
}

/// When a row's measured phase ran: from `started_at` for `elapsed_ms`, the end widened by the
/// precision `started_at` was written with (whole seconds in older files, milliseconds now),
/// since the true start may be that much later than written.
fn measured(r: &Row) -> Option<(SystemTime, SystemTime)> {
    let text = r.started_at.trim();
    let start = humantime::parse_rfc3339_weak(text).ok()?;
    let digits = text.split_once('.').map_or(0, |(_, frac)| {
        frac.chars().take_while(char::is_ascii_digit).count()
    });
    let precision = Duration::from_nanos(10u64.pow(9 - digits.min(9) as u32));
    Some((
        start,
        start + Duration::from_millis(r.elapsed_ms) + precision,
    ))
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
    // The socket-option axes, named only when they differ from the defaults older rows had.
    if r.nodelay == Some(false) {
        key += " nagle";
    }
    if let Some(pattern) = r.write_pattern.as_deref().filter(|p| *p != "one") {
        key += &format!(" {pattern}");
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
            // The model is the default; another engine's figures are a column of their own.
            let profile = match r.engine.as_deref() {
                None | Some("model") => profile,
                Some(engine) => format!("{profile} [{engine}]"),
            };
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
        // Say which rows were taken to have run at once, and why, since calls/s depend on it.
        let at_once = self.cells.values().any(|c| c.rows > c.rounds);
        if at_once {
            let _ = writeln!(
                out,
                "(rows of {} hosts combined: {}; rows of one round from different runs whose \
                 measured times (started_at + elapsed_ms) overlap ran at once, so their calls/s \
                 add up; any other row is a round of its own)",
                self.hosts.len(),
                self.hosts.join(", ")
            );
        } else if self.hosts.len() > 1 {
            let _ = writeln!(
                out,
                "(rows of {} hosts: {}; none ran at the same time as another (started_at + \
                 elapsed_ms), so each is a round of its own)",
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
        // Two rows of one round number that did not run at once (no times here): two rounds,
        // 2/0.01 and 2/0.03 calls/s, averaged.
        assert!((c.calls_per_sec - (200.0 + 2.0 / 0.03) / 2.0).abs() < 1e-9);
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
    fn socket_options_are_rows_of_their_own() {
        let mut nagle = row("tcp-binary", "single", "lossy", 80, &[80_000]);
        nagle.nodelay = Some(false);
        nagle.write_pattern = Some("split".into());
        let mut nodelay = row("tcp-binary", "single", "lossy", 20, &[20_000]);
        nodelay.nodelay = Some(true);
        nodelay.write_pattern = Some("one".into());
        // A row from before the columns: the same cell as today's defaults.
        let old = row("tcp-binary", "single", "lossy", 20, &[20_000]);
        let t = Table::build(&[nagle, nodelay, old], RoundSummary::Mean).unwrap();
        assert_eq!(
            t.rows,
            ["tcp-binary single nagle split", "tcp-binary single"]
        );
        assert_eq!(t.cells[&(1, 0)].rows, 2);
    }

    /// A row measured by process `run` on `host`, starting at `start` (RFC 3339).
    fn timed(mut r: Row, run: &str, host: &str, start: &str) -> Row {
        r.run_id = run.into();
        r.host = host.into();
        r.started_at = start.into();
        r
    }

    #[test]
    fn the_median_round_stands_for_the_cell() {
        let mut rows = Vec::new();
        // Rounds 1..=3 take 50, 10 and 30 ms; round 2 is measured by two hosts at once (10 and
        // 20 ms, combined to 15 ms), so the median round is round 3 (30 ms) with its one slow
        // call.
        for (round, host, start, elapsed, lat) in [
            (1, "a", "2026-03-01T10:00:00.000Z", 50, 900),
            (2, "a", "2026-03-01T10:00:01.000Z", 10, 100),
            (2, "b", "2026-03-01T10:00:01.005Z", 20, 200),
            (3, "a", "2026-03-01T10:00:02.000Z", 30, 300),
        ] {
            let r = row("grpc", "single", "local", elapsed, &[lat, lat]);
            let mut r = timed(r, &format!("bench-{host}-{round}"), host, start);
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

    /// Rows of one round whose measured intervals (started_at + elapsed_ms) overlap, from
    /// different processes, ran at once: their calls/s add up. Any other rows (another run
    /// appended to the same CSV, hosts one after the other, a file given twice) are rounds of
    /// their own, so their calls/s are averaged.
    #[test]
    fn only_rows_that_ran_at_once_add_their_calls_per_second() {
        // 10 calls in 100 ms: 100 calls/s each.
        let at = |run: &str, host: &str, start: &str| {
            timed(
                row("grpc", "single", "local", 100, &[100; 10]),
                run,
                host,
                start,
            )
        };
        let a = at("bench-1", "a", "2026-03-01T10:00:00.000Z");
        let b = at("bench-2", "b", "2026-03-01T10:00:00.050Z"); // while a ran
        let c = at("bench-3", "a", "2026-03-01T11:00:00.000Z"); // an hour later
        let d = at("bench-4", "b", "2026-03-01T11:00:00.200Z"); // after c ended
        let same_host = at("bench-5", "a", "2026-03-01T10:00:00.020Z"); // a second process on a
        let rate = |rows: &[&Row]| {
            let rows: Vec<Row> = rows.iter().map(|&r| r.clone()).collect();
            let t = Table::build(&rows, RoundSummary::Mean).unwrap();
            t.cells[&(0, 0)].calls_per_sec
        };
        let close = |x: f64, y: f64| (x - y).abs() < 1e-6;
        assert!(close(rate(&[&a, &b]), 200.0), "two hosts at once");
        assert!(
            close(rate(&[&a, &same_host]), 200.0),
            "two processes of one host at once"
        );
        assert!(
            close(rate(&[&a, &c]), 100.0),
            "two runs appended to one CSV"
        );
        assert!(
            close(rate(&[&c, &d]), 100.0),
            "two hosts one after the other"
        );
        assert!(close(rate(&[&a, &a]), 100.0), "one file given twice");
        assert!(close(
            rate(&[&a, &b, &c, &d]),
            (200.0 + 100.0 + 100.0) / 3.0
        ));
        // Whole-second times (older files) may be up to a second early: a row one second on
        // that began within the first's (widened) interval counts as at once.
        let e = at("bench-6", "a", "2026-03-01T12:00:00Z");
        let f = at("bench-7", "b", "2026-03-01T12:00:01Z");
        let g = at("bench-8", "b", "2026-03-01T12:00:02Z");
        assert!(close(rate(&[&e, &f]), 200.0));
        assert!(close(rate(&[&e, &g]), 100.0));
        let t = Table::build(&[a.clone(), b.clone()], RoundSummary::Mean).unwrap();
        let text = t.render();
        assert!(text.contains("rows of 2 hosts combined: a, b"), "{text}");
        let t = Table::build(&[a, d], RoundSummary::Mean).unwrap();
        let text = t.render();
        assert!(text.contains("none ran at the same time"), "{text}");
    }
}
