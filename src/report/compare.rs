//! `faultrig report --baseline OLD.csv NEW.csv`: per-cell deltas of the figures a change
//! usually moves (p50, p99, calls/s, failures), cells matched by row name and profile, and a
//! regression flagged where one moved the wrong way by more than the threshold.

use std::fmt::Write;

use serde::Serialize;

use super::metric::Metric;
use super::{CellFigures, Table};

/// The figures compared, in the order shown.
pub(super) const COMPARED: [Metric; 4] = [
    Metric::P50,
    Metric::P99,
    Metric::CallsPerSec,
    Metric::Failed,
];

/// One figure of one cell, before and after.
#[derive(Clone, Debug, Serialize)]
pub struct Change {
    /// The metric's name (what JSON readers see); `of` is the metric itself.
    pub metric: &'static str,
    #[serde(skip)]
    pub of: Metric,
    pub old: Option<f64>,
    pub new: Option<f64>,
    /// (new − old) / old, in %; None when either is missing or old is 0.
    pub change_pct: Option<f64>,
    pub regressed: bool,
}

/// One cell present in both tables.
#[derive(Clone, Debug, Serialize)]
pub struct Delta {
    pub row: String,
    pub profile: String,
    pub changes: Vec<Change>,
}

impl Delta {
    pub fn regressed(&self) -> bool {
        self.changes.iter().any(|c| c.regressed)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The threshold, in %.
    pub threshold_pct: f64,
    pub deltas: Vec<Delta>,
    /// Cells (`ROW @ PROFILE`) only the baseline has, and only the new results have.
    pub only_baseline: Vec<String>,
    pub only_new: Vec<String>,
}

/// `--threshold`: a percentage, `10%` or `10`, above 0.
pub(crate) fn parse_threshold(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('%').trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("\"{s}\" is not a percentage above 0 (e.g. 10%)")),
    }
}

/// Whether `new` is worse than `old` by more than `threshold` %. Failures compare as a share
/// of calls (runs of different lengths fail different counts at one rate), and any rise in
/// that share is a regression: a failure is never noise to be let through.
fn regressed(m: Metric, old: f64, new: f64, threshold: f64, calls: (u64, u64)) -> bool {
    let limit = threshold / 100.0;
    match m {
        Metric::Failed => new / calls.1.max(1) as f64 > old / calls.0.max(1) as f64,
        m if m.lower_is_better() => new > old * (1.0 + limit),
        _ => new < old * (1.0 - limit),
    }
}

/// Compares every cell of `new` with the same row and profile in `old`.
pub(crate) fn compare(old: &Table, new: &Table, threshold: f64) -> Comparison {
    let name = |t: &Table, (ri, pi): (usize, usize)| (t.rows[ri].clone(), t.profiles[pi].clone());
    let mut c = Comparison {
        threshold_pct: threshold,
        deltas: Vec::new(),
        only_baseline: Vec::new(),
        only_new: Vec::new(),
    };
    for (&k, cell) in &new.cells {
        let (row, profile) = name(new, k);
        let Some(before) = find(old, &row, &profile) else {
            c.only_new.push(format!("{row} @ {profile}"));
            continue;
        };
        let changes = COMPARED
            .iter()
            .map(|&m| {
                let (o, n) = (before.value(m), cell.value(m));
                let change_pct = match (o, n) {
                    (Some(o), Some(n)) if o != 0.0 => Some((n - o) / o * 100.0),
                    _ => None,
                };
                let regressed = match (o, n) {
                    (Some(o), Some(n)) => regressed(m, o, n, threshold, (before.calls, cell.calls)),
                    // A latency that vanished: no call succeeded any more.
                    (Some(_), None) => true,
                    _ => false,
                };
                Change {
                    metric: m.name(),
                    of: m,
                    old: o,
                    new: n,
                    change_pct,
                    regressed,
                }
            })
            .collect();
        c.deltas.push(Delta {
            row,
            profile,
            changes,
        });
    }
    for &k in old.cells.keys() {
        let (row, profile) = name(old, k);
        if find(new, &row, &profile).is_none() {
            c.only_baseline.push(format!("{row} @ {profile}"));
        }
    }
    c
}

/// The cell of row `row` under `profile`, by name.
fn find<'a>(t: &'a Table, row: &str, profile: &str) -> Option<&'a CellFigures> {
    let ri = t.rows.iter().position(|r| r == row)?;
    let pi = t.profiles.iter().position(|p| p == profile)?;
    t.cell(ri, pi)
}

impl Comparison {
    pub(crate) fn regressions(&self) -> usize {
        self.deltas.iter().filter(|d| d.regressed()).count()
    }

    /// The deltas as text: a line per cell, `!` before each figure that regressed.
    pub(crate) fn render(&self) -> String {
        let width = self
            .deltas
            .iter()
            .map(|d| d.row.len() + d.profile.len() + 3)
            .max()
            .unwrap_or(0)
            .max(14);
        let mut out = format!(
            "\nAgainst the baseline (a regression: p50 or p99 up, or calls/s down, by more than \
             {}%, or a larger share of calls failed):\n{:<width$}",
            self.threshold_pct, "cell"
        );
        for m in COMPARED {
            let _ = write!(out, " {:>26}", m.name());
        }
        out.push('\n');
        for d in &self.deltas {
            let _ = write!(out, "{:<width$}", format!("{} @ {}", d.row, d.profile));
            for ch in &d.changes {
                let v = |v: Option<f64>| v.map_or("-".into(), |v| figure(ch.of, v));
                let pct = ch
                    .change_pct
                    .map_or(String::new(), |p| format!(" ({p:+.0}%)"));
                let mark = if ch.regressed { "!" } else { "" };
                let text = format!("{mark}{}→{}{pct}", v(ch.old), v(ch.new));
                let _ = write!(out, " {text:>26}");
            }
            out.push('\n');
        }
        for (what, cells) in [
            ("only in the baseline", &self.only_baseline),
            ("only in the new results", &self.only_new),
        ] {
            if !cells.is_empty() {
                let _ = writeln!(out, "{what}: {}", cells.join(", "));
            }
        }
        let _ = writeln!(
            out,
            "{} of {} cells regressed",
            self.regressions(),
            self.deltas.len()
        );
        out
    }
}

/// A figure without its unit (the column names the metric): ms for latencies.
pub(super) fn figure(m: Metric, v: f64) -> String {
    match m {
        Metric::P50 | Metric::P99 => super::metric::format_ms(v),
        _ => format!("{v:.0}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{crafted, row};
    use crate::report::RoundSummary;

    #[test]
    fn deltas_flag_what_moved_the_wrong_way_beyond_the_threshold() {
        let old = Table::build(&crafted(), RoundSummary::Mean).unwrap();
        let mut rows = crafted();
        // grpc single @ local: p50 and p99 up 5 % (within 10 %); tcp-binary single @ local:
        // up 50 %; grpc per-call @ lossy: a failed call; lossy's tcp-binary per-call is gone,
        // and a per-worker cell is new.
        rows[0] = row("grpc", "single", "local", 10, &[1050; 10]);
        rows[2] = row("tcp-binary", "single", "local", 1, &[150; 10]);
        rows[5].failed = 1;
        rows[7] = row("grpc", "per-worker", "lossy", 200, &[20_000; 10]);
        let new = Table::build(&rows, RoundSummary::Mean).unwrap();
        let c = compare(&old, &new, 10.0);
        let regressed: Vec<(String, Vec<&str>)> = c
            .deltas
            .iter()
            .filter(|d| d.regressed())
            .map(|d| {
                let what = d.changes.iter().filter(|c| c.regressed).map(|c| c.metric);
                (format!("{} @ {}", d.row, d.profile), what.collect())
            })
            .collect();
        assert_eq!(
            regressed,
            [
                ("grpc per-call @ lossy".to_string(), vec!["failed"]),
                ("tcp-binary single @ local".to_string(), vec!["p50", "p99"]),
            ]
        );
        let grpc = &c.deltas[0];
        assert_eq!(grpc.row, "grpc single");
        assert_eq!(grpc.changes[0].change_pct.map(f64::round), Some(5.0));
        assert_eq!(c.only_baseline, ["tcp-binary per-call @ lossy"]);
        assert_eq!(c.only_new, ["grpc per-worker @ lossy"]);
        assert_eq!(c.regressions(), 2);
        let text = c.render();
        assert!(text.contains("2 of 7 cells regressed"), "{text}");
        let line = text
            .lines()
            .find(|l| l.starts_with("tcp-binary single @ local"))
            .unwrap();
        assert!(line.contains("!0.100→0.150 (+50%)"), "{line}");
        // A wider threshold lets the 50 % through; the failure never is.
        assert_eq!(compare(&old, &new, 60.0).regressions(), 1);
    }

    #[test]
    fn thresholds_are_percentages_above_zero() {
        assert_eq!(parse_threshold("10%"), Ok(10.0));
        assert_eq!(parse_threshold("2.5"), Ok(2.5));
        for bad in ["0", "-5%", "ten", "", "inf"] {
            assert!(parse_threshold(bad).is_err(), "{bad}");
        }
    }
}
