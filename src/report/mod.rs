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

pub mod compare;
pub mod findings;
pub mod gate;
pub mod html;
pub mod json;
pub mod metric;
pub mod sweep;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, SystemTime};

use hdrhistogram::Histogram;

use crate::results::{new_histogram, HdrError, Row};
use metric::Metric;

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

    /// The name `--rounds` takes.
    pub fn name(self) -> &'static str {
        match self {
            RoundSummary::Mean => "mean",
            RoundSummary::Median => "median",
        }
    }

    /// One sentence for the report, saying what the numbers are.
    pub(crate) fn explain(self) -> &'static str {
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
pub struct CellFigures {
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
    /// Client bytes written and read per call, all framing included: the calls-weighted mean
    /// of the rows that have them; None when no row does (so unknown never reads as 0).
    pub req_bytes: Option<f64>,
    pub resp_bytes: Option<f64>,
    /// The server's CPU time per 1000 calls, ms, over the rows that measured it.
    pub server_cpu_ms_per_1k: Option<f64>,
    /// The largest server RSS any row saw, KiB.
    pub server_rss_peak_kb: Option<u64>,
    /// Connections opened per round (rows that ran at once add up, as their calls/s do).
    pub conns_opened: f64,
    /// Retransmission stalls (both directions) per 1000 calls, over the rows that count them.
    pub stalls_per_1k: Option<f64>,
}

impl CellFigures {
    /// Combines rows: counts summed, histograms merged, total time averaged.
    fn combine(rows: &[&Row]) -> Result<CellFigures, HdrError> {
        let rounds = rounds_as_run(rows);
        let mut cell = CellFigures {
            rows: rows.len(),
            rounds: rounds.len(),
            mean_total_ms: 0.0,
            calls_per_sec: 0.0,
            calls: 0,
            failed: 0,
            latency: new_histogram(),
            req_bytes: per_call(
                rows,
                |r| r.req_bytes.map(|b| b as f64 * r.calls as f64),
                1.0,
            ),
            resp_bytes: per_call(
                rows,
                |r| r.resp_bytes.map(|b| b as f64 * r.calls as f64),
                1.0,
            ),
            server_cpu_ms_per_1k: per_call(rows, |r| r.server_cpu_ms.map(|ms| ms as f64), 1e3),
            server_rss_peak_kb: rows.iter().filter_map(|r| r.server_rss_kb).max(),
            conns_opened: rows.iter().map(|r| r.conns_opened as f64).sum::<f64>()
                / rounds.len().max(1) as f64,
            stalls_per_1k: per_call(
                rows,
                |r| match (r.stalls_up, r.stalls_down) {
                    (None, None) => None,
                    (up, down) => Some((up.unwrap_or(0) + down.unwrap_or(0)) as f64),
                },
                1e3,
            ),
        };
        for r in rows {
            cell.calls += r.calls;
            cell.failed += r.failed;
            cell.latency.add(r.histogram()?).map_err(HdrError::Merge)?;
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
    fn median_round(rows: &[&Row]) -> Result<CellFigures, HdrError> {
        let mut rounds = rounds_as_run(rows)
            .iter()
            .map(|rs| CellFigures::combine(rs))
            .collect::<Result<Vec<_>, _>>()?;
        rounds.sort_by(|a, b| a.mean_total_ms.total_cmp(&b.mean_total_ms));
        let middle = (rounds.len() - 1) / 2;
        Ok(rounds.swap_remove(middle))
    }
}

/// `scale` × the sum of `total` over the rows that have it, divided by those rows' calls: a
/// per-call figure that neither counts a row without the measurement as 0 nor lets rows of
/// different lengths weigh the same. None when no row has it, or those rows made no calls.
fn per_call(rows: &[&Row], total: impl Fn(&Row) -> Option<f64>, scale: f64) -> Option<f64> {
    let (sum, calls) = rows
        .iter()
        .filter_map(|r| total(r).map(|t| (t, r.calls)))
        .fold((None, 0u64), |(sum, calls), (t, c)| {
            (Some(sum.unwrap_or(0.0) + t), calls + c)
        });
    sum.filter(|_| calls > 0).map(|s| scale * s / calls as f64)
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
    /// Row names, and the keys they name (the same order).
    pub rows: Vec<String>,
    pub keys: Vec<RowKey>,
    pub profiles: Vec<String>,
    pub cells: BTreeMap<(usize, usize), CellFigures>,
    /// How the cells' rounds were combined.
    pub summary: RoundSummary,
    /// The hosts whose rows were combined, in first-seen order.
    pub hosts: Vec<String>,
}

/// What a table row stands for: the axes a cell varies over, besides the profile. Rows of
/// the same key are one cell; the ratios compare rows that differ in one axis only (the mode,
/// or the flavour), so the key is kept whole, not only as its display name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowKey {
    pub flavour: String,
    pub mode: String,
    pub workload: String,
    pub concurrency: u32,
    /// Only when off: rows from before the column had it on, and are the same cell.
    pub nagle: bool,
    /// Only when not `one` (the default, and what older rows did).
    pub write_pattern: Option<String>,
}

impl RowKey {
    fn of(r: &Row) -> RowKey {
        RowKey {
            flavour: r.flavour.clone(),
            mode: r.mode.clone(),
            workload: r.workload.clone(),
            concurrency: r.concurrency,
            nagle: r.nodelay == Some(false),
            write_pattern: r.write_pattern.clone().filter(|p| p != "one"),
        }
    }

    /// The axes besides flavour and mode, as the row's name shows them (defaults left out).
    fn axes(&self) -> String {
        let mut key = String::new();
        if self.workload != "order" {
            key += &format!(" {}", self.workload);
        }
        if self.concurrency != 1 {
            key += &format!(" c={}", self.concurrency);
        }
        // The socket-option axes, named only when they differ from the defaults older rows had.
        if self.nagle {
            key += " nagle";
        }
        if let Some(pattern) = &self.write_pattern {
            key += &format!(" {pattern}");
        }
        key
    }

    /// The row's name in tables: `FLAVOUR MODE` and any axis off its default.
    pub fn name(&self) -> String {
        format!("{} {}{}", self.flavour, self.mode, self.axes())
    }

    /// Every axis spelt out, for messages that must name a cell without the table around them.
    pub(crate) fn describe(&self) -> String {
        let mut d = format!(
            "flavour={} mode={} workload={} concurrency={}",
            self.flavour, self.mode, self.workload, self.concurrency
        );
        if self.nagle {
            d += " nodelay=false";
        }
        if let Some(pattern) = &self.write_pattern {
            d += &format!(" write_pattern={pattern}");
        }
        d
    }

    /// Whether `other` is this row but for the mode.
    fn same_but_mode(&self, other: &RowKey) -> bool {
        self.flavour == other.flavour && self.axes() == other.axes()
    }

    /// Whether `other` is this row but for the flavour.
    fn same_but_flavour(&self, other: &RowKey) -> bool {
        self.mode == other.mode && self.axes() == other.axes()
    }
}

impl Table {
    pub fn build(rows: &[Row], summary: RoundSummary) -> Result<Table, HdrError> {
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
            let key = RowKey::of(r);
            let ri = index_of(&mut t.rows, key.name());
            if ri == t.keys.len() {
                t.keys.push(key);
            }
            let pi = index_of(&mut t.profiles, profile);
            groups.entry((ri, pi)).or_default().push(r);
        }
        for (k, group) in groups {
            let cell = match summary {
                RoundSummary::Mean => CellFigures::combine(&group)?,
                RoundSummary::Median => CellFigures::median_round(&group)?,
            };
            t.cells.insert(k, cell);
        }
        Ok(t)
    }

    /// The cell at row `ri`, profile `pi`.
    pub fn cell(&self, ri: usize, pi: usize) -> Option<&CellFigures> {
        self.cells.get(&(ri, pi))
    }

    /// The row of `ri`'s flavour and other axes, in `mode`.
    pub(crate) fn partner(&self, ri: usize, mode: &str) -> Option<usize> {
        let key = &self.keys[ri];
        self.keys
            .iter()
            .position(|k| k.mode == mode && key.same_but_mode(k))
    }

    /// `m` of the cell (ri, pi) over `m` of the same flavour, axes and profile in `mode`: how
    /// many times a connection strategy costs another. None without both values, or when the
    /// denominator is 0.
    pub(crate) fn over_mode(&self, ri: usize, pi: usize, mode: &str, m: Metric) -> Option<f64> {
        let other = self.partner(ri, mode)?;
        ratio(
            self.cell(ri, pi)?.value(m)?,
            self.cell(other, pi)?.value(m)?,
        )
    }

    /// A cell's p50 over its single-connection partner's: the table's `÷single`. None for a
    /// single cell itself (its ratio to itself says nothing).
    pub(crate) fn over_single(&self, ri: usize, pi: usize) -> Option<f64> {
        (self.keys[ri].mode != "single")
            .then(|| self.over_mode(ri, pi, "single", Metric::P50))
            .flatten()
    }

    /// The rows that differ from `ri` in flavour only (`ri` too), with their `m` under
    /// profile `pi`, those that have it.
    pub fn flavours(&self, ri: usize, pi: usize, m: Metric) -> Vec<(usize, f64)> {
        let key = &self.keys[ri];
        (0..self.keys.len())
            .filter(|&o| key.same_but_flavour(&self.keys[o]))
            .filter_map(|o| Some((o, self.cell(o, pi)?.value(m)?)))
            .collect()
    }

    /// The flavour with the lowest `m` among the rows that differ from `ri` in flavour only,
    /// under profile `pi`; and `ri`'s `m` over it. `m` is a latency (lower is faster). None
    /// unless two flavours or more have the figure.
    pub(crate) fn over_fastest(&self, ri: usize, pi: usize, m: Metric) -> Option<(usize, f64)> {
        let flavours = self.flavours(ri, pi, m);
        // One flavour alone is not the fastest of anything.
        if flavours.len() < 2 {
            return None;
        }
        let fastest = flavours.iter().min_by(|a, b| a.1.total_cmp(&b.1))?;
        Some((fastest.0, ratio(self.cell(ri, pi)?.value(m)?, fastest.1)?))
    }

    /// A cell's figures as the table columns ([`COLUMNS`]) show them; `-` for a measurement
    /// the cell lacks, empty for a ratio that has no partner.
    pub fn columns(&self, ri: usize, pi: usize) -> Option<Vec<String>> {
        let c = self.cell(ri, pi)?;
        let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".into(), f);
        let ms = |m| opt(c.value(m), &metric::format_ms);
        let whole = |v: Option<f64>| opt(v, &|v| format!("{v:.0}"));
        let tenths = |v: Option<f64>| opt(v, &|v| format!("{v:.1}"));
        let times = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.2}"));
        let single = self.over_single(ri, pi);
        Some(vec![
            format!("{:.1}", c.mean_total_ms),
            format!("{:.0}", c.calls_per_sec),
            ms(Metric::P50),
            ms(Metric::P99),
            c.failed.to_string(),
            whole(c.req_bytes),
            whole(c.resp_bytes),
            tenths(c.server_cpu_ms_per_1k),
            tenths(c.server_rss_peak_kb.map(|kb| kb as f64 / 1024.0)),
            tenths(Some(c.conns_opened)),
            tenths(c.stalls_per_1k),
            times(single),
            times(self.over_fastest(ri, pi, Metric::P50).map(|(_, r)| r)),
        ])
    }

    /// What the text report says first: how the numbers were made, and which rows were taken
    /// to have run at once (calls/s depend on it).
    pub(crate) fn preamble(&self) -> String {
        let mut out = format!("({})\n", self.summary.explain());
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
        out
    }

    /// Plain-text rendering: the findings, then a table per profile with every column.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        match findings::findings(self).as_slice() {
            [] => {
                let _ = writeln!(out, "Findings: {}", findings::NONE);
            }
            found => {
                out += "Findings:\n";
                for f in found {
                    let _ = writeln!(out, "- {f}");
                }
            }
        }
        out.push('\n');
        out += &self.preamble();
        let width = self.rows.iter().map(String::len).max().unwrap_or(0).max(14);
        for (pi, profile) in self.profiles.iter().enumerate() {
            let _ = write!(out, "\n{:<width$}", profile);
            for (name, _) in COLUMNS {
                let _ = write!(out, " {name:>9}");
            }
            out.push('\n');
            for (ri, name) in self.rows.iter().enumerate() {
                let Some(columns) = self.columns(ri, pi) else {
                    continue;
                };
                let _ = write!(out, "{name:<width$}");
                for c in columns {
                    let _ = write!(out, " {c:>9}");
                }
                out.push('\n');
            }
        }
        out += COLUMNS_NOTE;
        out.push('\n');
        out
    }
}

/// The table's columns, with what each means (the HTML shows it on hover).
pub(crate) const COLUMNS: [(&str, &str); 13] = [
    (
        "total ms",
        "time the cell's calls took (mean over rounds, or the median round's)",
    ),
    (
        "calls/s",
        "calls per second: rows that ran at once add up, rounds are averaged",
    ),
    (
        "p50 ms",
        "median latency of successful calls, every round merged",
    ),
    (
        "p99 ms",
        "99th percentile latency of successful calls, every round merged",
    ),
    ("failed", "failed calls, every round"),
    (
        "req B",
        "bytes the client wrote per call, framing and per-call handshakes included",
    ),
    (
        "resp B",
        "bytes the client read per call, framing and per-call handshakes included",
    ),
    ("cpu/1k", "server CPU ms per 1000 calls"),
    ("rss MiB", "peak server resident memory"),
    ("conns", "connections opened per round"),
    (
        "stalls/1k",
        "retransmission stalls (both directions) per 1000 calls",
    ),
    (
        "÷single",
        "p50 over the single-connection cell of the same flavour and profile",
    ),
    (
        "÷fastest",
        "p50 over the fastest flavour's of the same mode and profile",
    ),
];

/// One line under the text tables saying what the less obvious columns are.
const COLUMNS_NOTE: &str =
    "\n(cpu/1k: server CPU ms per 1000 calls; conns: opened per round; stalls/1k: \
     retransmission stalls per 1000 calls; ÷single: p50 over the single-connection cell of the \
     same flavour and profile; ÷fastest: p50 over the fastest flavour's, same mode and profile; \
     - not measured)";

/// `a / b`, None when `b` is not positive (a ratio to nothing says nothing).
fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
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

    pub(crate) fn row(
        flavour: &str,
        mode: &str,
        profile: &str,
        elapsed_ms: u64,
        latencies: &[u64],
    ) -> Row {
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

    /// A table whose answers are known: on `local` per-call costs 2× single for both flavours
    /// and the flavours are 10× apart; on `lossy` per-call costs 2.70× (grpc) and 2.80×
    /// (tcp-binary), and the flavours are within 2 % (single) and 6 % (per-call). Ten calls
    /// per cell, all at the given latency (µs), one round.
    pub(crate) fn crafted() -> Vec<Row> {
        [
            ("grpc", "single", "local", 1000),
            ("grpc", "per-call", "local", 2000),
            ("tcp-binary", "single", "local", 100),
            ("tcp-binary", "per-call", "local", 200),
            ("grpc", "single", "lossy", 20_000),
            ("grpc", "per-call", "lossy", 54_000),
            ("tcp-binary", "single", "lossy", 20_400),
            ("tcp-binary", "per-call", "lossy", 57_120),
        ]
        .into_iter()
        .map(|(flavour, mode, profile, us)| row(flavour, mode, profile, us * 10 / 1000, &[us; 10]))
        .collect()
    }

    /// The server's and the proxy's figures: per call weighted by calls, rows without the
    /// measurement left out (not counted as 0), the peak RSS the largest, connections per round.
    #[test]
    fn per_call_figures_weigh_rows_by_calls_and_skip_the_unmeasured() {
        let mut a = row("grpc", "per-call", "lossy", 100, &[1000; 10]);
        a.req_bytes = Some(100);
        a.resp_bytes = Some(50);
        a.server_cpu_ms = Some(20);
        a.server_rss_kb = Some(4096);
        a.stalls_up = Some(1);
        a.stalls_down = Some(2);
        a.conns_opened = 10;
        let mut b = row("grpc", "per-call", "lossy", 300, &[1000; 30]);
        b.req_bytes = Some(200);
        b.server_rss_kb = Some(8192);
        b.conns_opened = 30;
        let t = Table::build(&[a, b], RoundSummary::Mean).unwrap();
        let c = &t.cells[&(0, 0)];
        assert_eq!(c.req_bytes, Some((100.0 * 10.0 + 200.0 * 30.0) / 40.0));
        assert_eq!(c.resp_bytes, Some(50.0), "b has none: a's alone");
        assert_eq!(
            c.server_cpu_ms_per_1k,
            Some(2000.0),
            "20 ms over a's 10 calls"
        );
        assert_eq!(c.server_rss_peak_kb, Some(8192));
        assert_eq!(c.stalls_per_1k, Some(300.0));
        assert_eq!(c.conns_opened, 20.0, "two rounds");
        assert_eq!(c.value(Metric::Rss), Some(8192.0 * 1024.0));
        let text = t.render();
        let line = text
            .lines()
            .find(|l| l.starts_with("grpc per-call"))
            .unwrap();
        for figure in ["175", "50", "2000.0", "8.0", "20.0", "300.0"] {
            assert!(
                line.split_whitespace().any(|w| w == figure),
                "{figure}: {line}"
            );
        }
        // Nothing measured at all: `-`, never 0.
        let bare =
            Table::build(&[row("grpc", "single", "x", 10, &[5])], RoundSummary::Mean).unwrap();
        let line = bare.render();
        let line = line.lines().find(|l| l.starts_with("grpc single")).unwrap();
        assert_eq!(
            line.split_whitespace().filter(|w| *w == "-").count(),
            5,
            "{line}"
        );
    }

    #[test]
    fn the_ratio_columns_compare_modes_and_flavours_of_one_profile() {
        let t = Table::build(&crafted(), RoundSummary::Mean).unwrap();
        let ri = |name: &str| t.rows.iter().position(|r| r == name).unwrap();
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 0.01;
        assert!(close(t.over_single(ri("grpc per-call"), 0), 2.0));
        assert!(close(t.over_single(ri("tcp-binary per-call"), 1), 2.80));
        assert_eq!(t.over_single(ri("grpc single"), 0), None);
        let (fastest, r) = t.over_fastest(ri("grpc single"), 0, Metric::P50).unwrap();
        assert_eq!(
            (t.rows[fastest].as_str(), (r * 100.0).round()),
            ("tcp-binary single", 1000.0)
        );
        let (fastest, r) = t
            .over_fastest(ri("tcp-binary per-call"), 1, Metric::P50)
            .unwrap();
        assert_eq!(
            (t.rows[fastest].as_str(), (r * 1000.0).round()),
            ("grpc per-call", 1058.0)
        );
        let columns = t.columns(ri("tcp-binary per-call"), 1).unwrap();
        assert_eq!(columns[COLUMNS.len() - 2..], ["2.80", "1.06"]);
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
