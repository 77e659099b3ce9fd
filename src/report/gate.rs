//! Gates for CI: `--assert 'p99 < 300ms'`, `--assert 'failed == 0'`,
//! `--assert 'per-call/single < 3'`. An expression is parsed once, when the flag is read, into
//! an [`Assertion`]; after the report it is checked against every cell it applies to, and each
//! cell that breaks it is named with the value measured.
//!
//! The grammar (README, "Gates"): `SUBJECT OP VALUE`, where OP is one of `<` `<=` `>` `>=`
//! `==` `!=`, and SUBJECT is a metric ([`Metric`]) or a ratio: `MODE/MODE [METRIC]` (one
//! connection strategy over another of the same flavour, axes and profile) or
//! `flavour/fastest [METRIC]` (a flavour over the fastest flavour of the same mode, axes and
//! profile). A ratio's metric is a latency or time, p50 when not named: the median is what a
//! typical call costs, whether the cell ran a count of calls or a fixed time (total time says
//! nothing of the latter).

use std::fmt;

use super::metric::{Kind, Metric};
use super::Table;
use crate::bench::Mode;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl Op {
    /// Longest spellings first, so `<=` is never read as `<`.
    const SPELLINGS: [(&'static str, Op); 6] = [
        ("<=", Op::Le),
        (">=", Op::Ge),
        ("==", Op::Eq),
        ("!=", Op::Ne),
        ("<", Op::Lt),
        (">", Op::Gt),
    ];

    pub fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Op::Lt => a < b,
            Op::Le => a <= b,
            Op::Gt => a > b,
            Op::Ge => a >= b,
            Op::Eq => a == b,
            Op::Ne => a != b,
        }
    }
}

/// What an assertion measures in each cell.
#[derive(Clone, Debug, PartialEq)]
pub enum Subject {
    Metric(Metric),
    /// A cell in mode `num` over the cell in mode `den` of the same flavour, axes and profile.
    Modes {
        num: String,
        den: String,
        metric: Metric,
    },
    /// A cell over the fastest flavour of the same mode, axes and profile.
    OverFastest(Metric),
}

/// One `--assert` expression, parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Assertion {
    /// As given, for messages.
    pub text: String,
    pub subject: Subject,
    pub op: Op,
    /// In the metric's unit (ms, bytes, a count), or a plain ratio.
    pub threshold: f64,
}

impl fmt::Display for Assertion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Assertion {
    /// Parses an expression; the message says what is wrong and what would be right.
    pub fn parse(text: &str) -> Result<Assertion, String> {
        let at = text
            .find(['<', '>', '=', '!'])
            .ok_or_else(|| format!("\"{text}\" has no comparison (use <, <=, >, >=, == or !=)"))?;
        let (op_text, op) = Op::SPELLINGS
            .iter()
            .find(|(s, _)| text[at..].starts_with(s))
            .ok_or_else(|| {
                format!("\"{text}\": unknown comparison (use <, <=, >, >=, == or !=)")
            })?;
        let (left, right) = (text[..at].trim(), text[at + op_text.len()..].trim());
        let subject = parse_subject(left).map_err(|e| format!("\"{text}\": {e}"))?;
        let threshold = match &subject {
            Subject::Metric(m) => parse_value(m.kind(), right),
            Subject::Modes { .. } | Subject::OverFastest(_) => parse_ratio(right),
        }
        .map_err(|e| format!("\"{text}\": {e}"))?;
        Ok(Assertion {
            text: text.trim().to_string(),
            subject,
            op: *op,
            threshold,
        })
    }

    /// The value this assertion measures in cell (ri, pi); the outer None when it does not
    /// apply there (a ratio's numerator is another mode, or the cell has no partner), the inner
    /// when it applies but the cell lacks the measurement.
    fn measure(&self, t: &Table, ri: usize, pi: usize) -> Option<Option<f64>> {
        let cell = t.cell(ri, pi)?;
        match &self.subject {
            Subject::Metric(m) => Some(cell.value(*m)),
            Subject::Modes { num, den, metric } => {
                if t.keys[ri].mode != *num {
                    return None;
                }
                let other = t.partner(ri, den)?;
                t.cell(other, pi)?;
                Some(t.over_mode(ri, pi, den, *metric))
            }
            Subject::OverFastest(m) => Some(t.over_fastest(ri, pi, *m).map(|(_, r)| r)),
        }
    }

    /// `v` as this assertion's subject reads.
    fn format(&self, v: f64) -> String {
        match &self.subject {
            Subject::Metric(m) => m.format(v),
            Subject::Modes { .. } | Subject::OverFastest(_) => format!("{v:.2}×"),
        }
    }

    /// The subject's name in messages: `p99`, `per-call/single p50`.
    fn subject_name(&self) -> String {
        match &self.subject {
            Subject::Metric(m) => m.name().to_string(),
            Subject::Modes { num, den, metric } => format!("{num}/{den} {}", metric.name()),
            Subject::OverFastest(m) => format!("flavour/fastest {}", m.name()),
        }
    }
}

fn parse_subject(left: &str) -> Result<Subject, String> {
    let words: Vec<&str> = left.split_whitespace().collect();
    let unknown = |w: &str| {
        format!(
            "unknown metric \"{w}\" (use {}, or a ratio such as per-call/single or \
             flavour/fastest)",
            Metric::all_names()
        )
    };
    let (ratio, metric) = match words[..] {
        [w] => match Metric::parse(w) {
            Some(m) => return Ok(Subject::Metric(m)),
            None if w.contains('/') => (w, Metric::P50),
            None => return Err(unknown(w)),
        },
        [r, m] => (r, Metric::parse(m).ok_or_else(|| unknown(m))?),
        [] => return Err("nothing to compare before the comparison".into()),
        _ => return Err(format!("\"{left}\" is not METRIC or RATIO [METRIC]")),
    };
    if metric.kind() != Kind::Time || metric == Metric::Cpu {
        return Err(format!(
            "a ratio compares latencies or total time (p50, p90, p99, p999, max, mean, total), \
             not {}",
            metric.name()
        ));
    }
    let (num, den) = ratio
        .split_once('/')
        .ok_or_else(|| format!("\"{ratio}\" is not a ratio (use MODE/MODE or flavour/fastest)"))?;
    if (num, den) == ("flavour", "fastest") {
        return Ok(Subject::OverFastest(metric));
    }
    // The modes' own parser, so a misspelt mode is refused here and not matched against no cell.
    let mode = |s: &str| Mode::parse(s).map(|m| m.to_string());
    Ok(Subject::Modes {
        num: mode(num)?,
        den: mode(den)?,
        metric,
    })
}

/// A threshold of `kind`, in the metric's unit.
fn parse_value(kind: Kind, s: &str) -> Result<f64, String> {
    match kind {
        Kind::Time => parse_ms(s),
        Kind::Bytes => crate::units::parse_size(s).map(|b| b as f64),
        Kind::Count => parse_number(s),
    }
}

/// A non-negative decimal number, all of `s`.
fn parse_number(s: &str) -> Result<f64, String> {
    let ok = !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '.');
    match s.parse::<f64>() {
        Ok(v) if ok => Ok(v),
        _ => Err(format!("\"{s}\" is not a number")),
    }
}

/// A time with its unit (us, µs, ms, s), in ms. A bare number is refused: `p99 < 300` could
/// mean either of two units a factor of 1000 apart.
fn parse_ms(s: &str) -> Result<f64, String> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    if number.is_empty() {
        return Err(format!(
            "\"{s}\" is not a time (a number and a unit: 300ms)"
        ));
    }
    let scale = match unit.trim() {
        "us" | "µs" => 1e-3,
        "ms" => 1.0,
        "s" => 1e3,
        "" => return Err(format!("\"{s}\" needs a unit (us, ms or s)")),
        u => return Err(format!("unknown time unit \"{u}\" (use us, ms or s)")),
    };
    Ok(parse_number(number)? * scale)
}

/// A ratio: a number, optionally followed by `x` or `×`.
fn parse_ratio(s: &str) -> Result<f64, String> {
    parse_number(s.trim_end_matches(['x', '×']).trim_end())
}

/// One cell's verdict on one assertion.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Check {
    pub assertion: String,
    /// The cell, every axis named; None for an assertion that applied to no cell at all.
    pub cell: Option<String>,
    /// The cell's row in the table (`grpc per-call`).
    pub row: Option<String>,
    pub profile: Option<String>,
    /// What was measured; None when the cell lacks the measurement.
    pub measured: Option<f64>,
    pub holds: bool,
    /// The verdict in words: `p99 = 412.3 ms`.
    pub says: String,
}

/// Checks every assertion against every cell it applies to. An assertion that applies to no
/// cell fails (a gate that checks nothing must not pass a CI job), and so does a cell that
/// lacks the measurement (it cannot be shown to hold).
pub fn check(t: &Table, assertions: &[Assertion]) -> Vec<Check> {
    let mut checks = Vec::new();
    for a in assertions {
        let before = checks.len();
        for ri in 0..t.rows.len() {
            for (pi, profile) in t.profiles.iter().enumerate() {
                let Some(measured) = a.measure(t, ri, pi) else {
                    continue;
                };
                let holds = measured.is_some_and(|v| a.op.holds(v, a.threshold));
                let says = match measured {
                    Some(v) => format!("{} = {}", a.subject_name(), a.format(v)),
                    None => format!("{} not measured in this cell", a.subject_name()),
                };
                checks.push(Check {
                    assertion: a.text.clone(),
                    cell: Some(t.keys[ri].describe()),
                    row: Some(t.rows[ri].clone()),
                    profile: Some(profile.clone()),
                    measured,
                    holds,
                    says,
                });
            }
        }
        if checks.len() == before {
            checks.push(Check {
                assertion: a.text.clone(),
                cell: None,
                row: None,
                profile: None,
                measured: None,
                holds: false,
                says: format!("applies to no cell of these results ({})", a.subject_name()),
            });
        }
    }
    checks
}

/// The checks grouped by assertion, in the order given: its name, its checks, and those that
/// failed. The text and the HTML report both list them so.
pub(crate) fn by_assertion(checks: &[Check]) -> Vec<(&str, Vec<&Check>, Vec<&Check>)> {
    let mut names: Vec<&str> = checks.iter().map(|c| c.assertion.as_str()).collect();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let mine: Vec<&Check> = checks.iter().filter(|c| c.assertion == name).collect();
            let failed = mine.iter().copied().filter(|c| !c.holds).collect();
            (name, mine, failed)
        })
        .collect()
}

/// The checks in words: a line per assertion, and one per cell that broke it.
pub(crate) fn render(checks: &[Check]) -> String {
    let mut out = String::new();
    for (name, mine, failed) in by_assertion(checks) {
        if failed.is_empty() {
            out += &format!("assert {name}: holds in all {} cells\n", mine.len());
            continue;
        }
        out += &format!(
            "assert {name}: FAILS in {} of {} cells\n",
            failed.len(),
            mine.len()
        );
        for c in failed {
            match (&c.cell, &c.profile) {
                (Some(cell), Some(profile)) => {
                    out += &format!("  {cell} profile={profile}: {}\n", c.says)
                }
                _ => out += &format!("  {}\n", c.says),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::crafted;
    use crate::report::RoundSummary;

    fn parse(s: &str) -> Assertion {
        Assertion::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn expressions_parse_into_typed_assertions() {
        let a = parse("p99 < 300ms");
        assert_eq!(
            (a.subject, a.op, a.threshold),
            (Subject::Metric(Metric::P99), Op::Lt, 300.0)
        );
        assert_eq!(parse("p999<=1.5s").threshold, 1500.0);
        assert_eq!(parse(" p99 <  300 ms ").threshold, 300.0);
        assert_eq!(parse("max < 250us").threshold, 0.25);
        assert_eq!(parse("p50 < 250µs").threshold, 0.25);
        assert_eq!(parse("failed == 0").op, Op::Eq);
        assert_eq!(
            parse("tps >= 1000").subject,
            Subject::Metric(Metric::CallsPerSec)
        );
        assert_eq!(
            parse("calls/s > 10").subject,
            Subject::Metric(Metric::CallsPerSec)
        );
        assert_eq!(parse("rss < 64MiB").threshold, 64.0 * 1024.0 * 1024.0);
        assert_eq!(
            parse("connections != 2").subject,
            Subject::Metric(Metric::Conns)
        );
        let modes = |num: &str, den: &str, metric| Subject::Modes {
            num: num.into(),
            den: den.into(),
            metric,
        };
        let a = parse("per-call/single < 3");
        assert_eq!(
            (a.subject, a.threshold),
            (modes("per-call", "single", Metric::P50), 3.0)
        );
        assert_eq!(
            parse("per-call/single p99 < 3x").subject,
            modes("per-call", "single", Metric::P99)
        );
        assert_eq!(
            parse("pool:4/per-worker total <= 2").subject,
            modes("pool:4", "per-worker", Metric::Total)
        );
        assert_eq!(
            parse("flavour/fastest < 1.5").subject,
            Subject::OverFastest(Metric::P50)
        );
        for (bad, says) in [
            ("p99 300ms", "no comparison"),
            ("p99 < 300", "needs a unit"),
            ("p99 < 3min", "unknown time unit"),
            ("p99 < -3ms", "is not a time"),
            ("p98 < 3ms", "unknown metric \"p98\""),
            ("< 3ms", "nothing to compare"),
            ("failed == zero", "is not a number"),
            ("failed =< 1", "unknown comparison"),
            ("percall/single < 3", "unknown mode \"percall\""),
            ("per-call/single failed < 3", "a ratio compares latencies"),
            ("per-call < 3", "unknown metric"),
            ("flavour/fastest p99 < x", "is not a number"),
            ("p50 p99 per-call < 1ms", "is not METRIC or RATIO"),
        ] {
            let e = Assertion::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    /// The cells that break each assertion, and only those, named with what was measured.
    #[test]
    fn assertions_name_each_cell_that_fails_them() {
        let t = Table::build(&crafted(), RoundSummary::Mean).unwrap();
        let failing = |expr: &str| -> Vec<String> {
            check(&t, &[parse(expr)])
                .into_iter()
                .filter(|c| !c.holds)
                .map(|c| match (c.row, c.profile) {
                    (Some(n), Some(p)) => format!("{n} @ {p}: {}", c.says),
                    _ => c.says,
                })
                .collect()
        };
        assert_eq!(
            failing("p99 < 30ms"),
            [
                "grpc per-call @ lossy: p99 = 54.0 ms",
                "tcp-binary per-call @ lossy: p99 = 57.2 ms"
            ]
        );
        assert_eq!(failing("p99 < 60ms"), Vec::<String>::new());
        assert_eq!(
            failing("per-call/single < 2.75"),
            ["tcp-binary per-call @ lossy: per-call/single p50 = 2.80×"]
        );
        assert_eq!(
            failing("flavour/fastest < 1.05"),
            [
                "grpc single @ local: flavour/fastest p50 = 10.00×",
                "grpc per-call @ local: flavour/fastest p50 = 10.00×",
                "tcp-binary per-call @ lossy: flavour/fastest p50 = 1.06×"
            ]
        );
        // Nothing to check is a failure, not a pass: no per-worker cell here.
        assert_eq!(
            failing("per-worker/single < 2"),
            ["applies to no cell of these results (per-worker/single p50)"]
        );
        // No server figures in these rows: every cell fails, as not measured.
        let rss = check(&t, &[parse("rss < 1GiB")]);
        assert_eq!(rss.len(), 8);
        assert!(rss
            .iter()
            .all(|c| !c.holds && c.says == "rss not measured in this cell"));
        let all = check(&t, &[parse("failed == 0"), parse("p50 >= 100us")]);
        assert!(all.iter().all(|c| c.holds) && all.len() == 16);
        let text = render(&check(&t, &[parse("failed == 0"), parse("p99 < 30ms")]));
        assert!(
            text.contains("assert failed == 0: holds in all 8 cells"),
            "{text}"
        );
        assert!(
            text.contains("assert p99 < 30ms: FAILS in 2 of 8 cells"),
            "{text}"
        );
        assert!(
            text.contains(
                "flavour=grpc mode=per-call workload=order concurrency=1 profile=lossy: p99 = \
                 54.0 ms"
            ),
            "{text}"
        );
    }
}
