//! `--json`: the report's summary for other tools. Field names are part of the interface
//! (README, "JSON summary"); a new field may be added, an existing one is never renamed.
//! Missing measurements are `null`, never 0.

use serde::Serialize;

use super::compare::Comparison;
use super::gate::Check;
use super::metric::Metric;
use super::Table;

/// The format's version: raised only if a field changes meaning or goes.
const VERSION: u32 = 1;

#[derive(Serialize)]
struct Summary<'a> {
    version: u32,
    /// CSV rows combined.
    rows: usize,
    round_summary: &'static str,
    hosts: &'a [String],
    findings: Vec<String>,
    cells: Vec<CellSummary>,
    assertions: &'a [Check],
    baseline: Option<&'a Comparison>,
}

#[derive(Serialize)]
struct CellSummary {
    /// The table's row name and the profile column.
    name: String,
    profile: String,
    flavour: String,
    mode: String,
    workload: String,
    concurrency: u32,
    nodelay: bool,
    write_pattern: String,
    rows: usize,
    rounds: usize,
    calls: u64,
    failed: u64,
    total_ms: f64,
    calls_per_sec: f64,
    p50_ms: Option<f64>,
    p90_ms: Option<f64>,
    p99_ms: Option<f64>,
    p999_ms: Option<f64>,
    max_ms: Option<f64>,
    mean_ms: Option<f64>,
    req_bytes_per_call: Option<f64>,
    resp_bytes_per_call: Option<f64>,
    server_cpu_ms_per_1k_calls: Option<f64>,
    server_rss_peak_kib: Option<u64>,
    conns_opened_per_round: f64,
    stalls_per_1k_calls: Option<f64>,
    /// p50 over the single-connection cell of the same flavour, axes and profile.
    over_single_p50: Option<f64>,
    /// p50 over the fastest flavour's of the same mode, axes and profile, and that flavour.
    over_fastest_p50: Option<f64>,
    fastest_flavour: Option<String>,
}

/// The summary as pretty-printed JSON.
pub fn summary(t: &Table, rows: usize, checks: &[Check], baseline: Option<&Comparison>) -> String {
    let mut cells = Vec::new();
    for (&(ri, pi), c) in &t.cells {
        let key = &t.keys[ri];
        let fastest = t.over_fastest(ri, pi, Metric::P50);
        cells.push(CellSummary {
            name: t.rows[ri].clone(),
            profile: t.profiles[pi].clone(),
            flavour: key.flavour.clone(),
            mode: key.mode.clone(),
            workload: key.workload.clone(),
            concurrency: key.concurrency,
            nodelay: !key.nagle,
            write_pattern: key.write_pattern.clone().unwrap_or_else(|| "one".into()),
            rows: c.rows,
            rounds: c.rounds,
            calls: c.calls,
            failed: c.failed,
            total_ms: c.mean_total_ms,
            calls_per_sec: c.calls_per_sec,
            p50_ms: c.value(Metric::P50),
            p90_ms: c.value(Metric::P90),
            p99_ms: c.value(Metric::P99),
            p999_ms: c.value(Metric::P999),
            max_ms: c.value(Metric::Max),
            mean_ms: c.value(Metric::Mean),
            req_bytes_per_call: c.req_bytes,
            resp_bytes_per_call: c.resp_bytes,
            server_cpu_ms_per_1k_calls: c.server_cpu_ms_per_1k,
            server_rss_peak_kib: c.server_rss_peak_kb,
            conns_opened_per_round: c.conns_opened,
            stalls_per_1k_calls: c.stalls_per_1k,
            over_single_p50: t.over_single(ri, pi),
            over_fastest_p50: fastest.map(|(_, r)| r),
            fastest_flavour: fastest.map(|(o, _)| t.keys[o].flavour.clone()),
        });
    }
    let summary = Summary {
        version: VERSION,
        rows,
        round_summary: t.summary.name(),
        hosts: &t.hosts,
        findings: super::findings::findings(t),
        cells,
        assertions: checks,
        baseline,
    };
    serde_json::to_string_pretty(&summary).expect("a summary of numbers and strings serialises")
}
