//! Findings in words, computed from a table: the answers to the question the default run asks
//! (what does a new connection per call cost on this network, and does the RPC style matter
//! once the network is bad?), each with its numbers. A sentence is made only when the cells it
//! speaks of are there: no pair of modes, no sentence about their ratio.

use std::collections::BTreeMap;

use super::metric::{format_ms, Metric};
use super::Table;

/// The metric findings compare by: the median call, meaningful whether a cell ran a count of
/// calls or a fixed time (the same choice as the table's ratio columns).
const BY: Metric = Metric::P50;

/// What the report says when the table supports no finding.
pub(crate) const NONE: &str =
    "none the data supports (they need a single and a per-call cell of one \
                        flavour, two flavours under one profile, or a failed call)";

/// Every finding the table supports, in reading order.
pub fn findings(t: &Table) -> Vec<String> {
    let mut out = per_call_cost(t);
    out.extend(flavour_spread(t));
    out.extend(failures(t));
    out
}

/// `a–b×`, or `a×` when both read the same.
fn range(lo: f64, hi: f64) -> String {
    let (lo, hi) = (times(lo), times(hi));
    if lo == hi {
        format!("{lo}×")
    } else {
        format!("{lo}–{hi}×")
    }
}

fn times(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1}")
    }
}

/// `on PROFILE` with the row's axes besides flavour and mode, when it has any.
fn on(profile: &str, axes: &str) -> String {
    if axes.is_empty() {
        format!("on {profile}")
    } else {
        format!("on {profile} ({})", axes.trim())
    }
}

/// "On lossy a new connection per call costs 2.00–2.01× the p50 of one shared connection and
/// 2.90–3.10× its mean latency, for all 5 flavours": per profile and axes, over every flavour
/// with both a per-call and a single cell. The median is the typical call; the mean adds what
/// the tail costs (a lost SYN waits a whole RTO), so the two together say how much of the cost
/// is the extra round trip and how much the stalls.
fn per_call_cost(t: &Table) -> Vec<String> {
    let mut out = Vec::new();
    for (pi, profile) in t.profiles.iter().enumerate() {
        // Per axes (workload, concurrency, socket options), the flavours' ratios.
        let mut groups: BTreeMap<String, Vec<(String, f64, Option<f64>)>> = BTreeMap::new();
        for (ri, key) in t.keys.iter().enumerate() {
            if key.mode != "per-call" {
                continue;
            }
            if let Some(r) = t.over_mode(ri, pi, "single", BY) {
                let mean = t.over_mode(ri, pi, "single", Metric::Mean);
                groups
                    .entry(key.axes())
                    .or_default()
                    .push((key.flavour.clone(), r, mean));
            }
        }
        for (axes, ratios) in groups {
            let (lo, hi) = bounds(ratios.iter().map(|r| r.1));
            let whom = match &ratios[..] {
                [(flavour, ..)] => flavour.clone(),
                _ => format!("all {} flavours", ratios.len()),
            };
            let what = if lo > 1.0 {
                format!(
                    "a new connection per call costs {} the p50 of one shared connection",
                    range(lo, hi)
                )
            } else if hi < 1.0 {
                format!(
                    "a new connection per call is faster than one shared connection: {} its p50",
                    range(lo, hi)
                )
            } else {
                format!(
                    "a new connection per call takes {} the p50 of one shared connection",
                    range(lo, hi)
                )
            };
            // The mean only when every flavour has it, so the range covers the same flavours.
            let means: Option<Vec<f64>> = ratios.iter().map(|r| r.2).collect();
            let mean = match means {
                Some(m) => {
                    let (lo, hi) = bounds(m.into_iter());
                    format!(" and {} its mean latency,", range(lo, hi))
                }
                None => String::new(),
            };
            out.push(format!(
                "{} {what}{mean} for {whom}.",
                capitalise(&on(profile, &axes))
            ));
        }
    }
    out
}

/// The smallest and the largest of `values`.
fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

/// "With single connections the flavours' p50 are 12.0× apart on local (tcp-binary 0.100 ms
/// fastest, grpc 1.20 ms slowest) against within 3 % of each other on lossy": per mode and
/// axes, every profile with two flavours or more.
fn flavour_spread(t: &Table) -> Vec<String> {
    // (mode, axes) in first-seen order, each with its profiles' spreads.
    let mut groups: Vec<((String, String), Vec<String>)> = Vec::new();
    for (ri, key) in t.keys.iter().enumerate() {
        let group = (key.mode.clone(), key.axes());
        if groups.iter().any(|(g, _)| *g == group) {
            continue;
        }
        let mut spreads = Vec::new();
        for (pi, profile) in t.profiles.iter().enumerate() {
            let values: Vec<(&str, f64)> = t
                .flavours(ri, pi, BY)
                .into_iter()
                .map(|(o, v)| (t.keys[o].flavour.as_str(), v))
                .collect();
            if values.len() < 2 {
                continue;
            }
            let fastest = values.iter().min_by(|a, b| a.1.total_cmp(&b.1));
            let slowest = values.iter().max_by(|a, b| a.1.total_cmp(&b.1));
            let (Some(&(fast, lo)), Some(&(slow, hi))) = (fastest, slowest) else {
                continue;
            };
            if lo <= 0.0 {
                continue;
            }
            let spread = hi / lo;
            let apart = if spread < 1.1 {
                format!("within {:.1} % of each other", (spread - 1.0) * 100.0)
            } else {
                format!("{}× apart", times(spread))
            };
            spreads.push(format!(
                "{apart} on {profile} ({fast} fastest at {} ms, {slow} slowest at {} ms)",
                format_ms(lo),
                format_ms(hi)
            ));
        }
        groups.push((group, spreads));
    }
    groups
        .into_iter()
        .filter(|(_, spreads)| !spreads.is_empty())
        .map(|((mode, axes), spreads)| {
            let axes = if axes.is_empty() {
                String::new()
            } else {
                format!(" ({})", axes.trim())
            };
            format!(
                "In mode {mode}{axes} the flavours' p50 are {}.",
                spreads.join("; against ")
            )
        })
        .collect()
}

/// "2 of 20 cells had failed calls, the most in …": only when a call failed.
fn failures(t: &Table) -> Option<String> {
    let failing: Vec<_> = t.cells.iter().filter(|(_, c)| c.failed > 0).collect();
    let ((ri, pi), worst) = failing.iter().max_by_key(|(_, c)| c.failed)?;
    Some(format!(
        "{} of {} cells had failed calls, the most in {} on {} ({} of {} calls).",
        failing.len(),
        t.cells.len(),
        t.rows[*ri],
        t.profiles[*pi],
        worst.failed,
        worst.calls
    ))
}

fn capitalise(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{crafted, row};
    use crate::report::RoundSummary;

    #[test]
    fn the_crafted_table_gives_the_known_answers() {
        let t = Table::build(&crafted(), RoundSummary::Mean).unwrap();
        assert_eq!(
            findings(&t),
            [
                "On local a new connection per call costs 2.00× the p50 of one shared \
                 connection and 2.00× its mean latency, for all 2 flavours.",
                "On lossy a new connection per call costs 2.70–2.80× the p50 of one shared \
                 connection and 2.70–2.80× its mean latency, for all 2 flavours.",
                "In mode single the flavours' p50 are 10.0× apart on local (tcp-binary fastest \
                 at 0.100 ms, grpc slowest at 1.00 ms); against within 2.0 % of each other on \
                 lossy (grpc fastest at 20.0 ms, tcp-binary slowest at 20.4 ms).",
                "In mode per-call the flavours' p50 are 10.0× apart on local (tcp-binary \
                 fastest at 0.200 ms, grpc slowest at 2.00 ms); against within 5.8 % of each \
                 other on lossy (grpc fastest at 54.0 ms, tcp-binary slowest at 57.2 ms).",
            ]
        );
    }

    #[test]
    fn no_sentence_is_made_up_when_no_statement_holds() {
        // One flavour, one mode, no failures: no pair of modes, no two flavours to compare.
        let rows = [
            row("grpc", "single", "local", 10, &[1000; 10]),
            row("grpc", "single", "lossy", 200, &[20_000; 10]),
            // Another flavour under another mode and workload: still no pair.
            {
                let mut r = row("thrift", "per-call", "lossy", 200, &[20_000; 10]);
                r.workload = "wide".into();
                r
            },
        ];
        let t = Table::build(&rows, RoundSummary::Mean).unwrap();
        assert_eq!(findings(&t), Vec::<String>::new());
        assert!(t.render().starts_with(&format!("Findings: {NONE}\n")));
    }

    #[test]
    fn failures_and_a_faster_per_call_are_said_as_they_are() {
        // Per-call's median call is faster, but one call in ten stalls: the mean says so.
        let mut rows = vec![
            row("grpc", "single", "wan", 10, &[3000; 10]),
            row(
                "grpc",
                "per-call",
                "wan",
                10,
                &[1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 15_000],
            ),
        ];
        rows[1].failed = 4;
        let t = Table::build(&rows, RoundSummary::Mean).unwrap();
        assert_eq!(
            findings(&t),
            [
                "On wan a new connection per call is faster than one shared connection: 0.50× \
                 its p50 and 0.95× its mean latency, for grpc.",
                "1 of 2 cells had failed calls, the most in grpc per-call on wan (4 of 10 calls).",
            ]
        );
    }
}
