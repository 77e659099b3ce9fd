//! Reports from results CSVs (of one run, or many runs and hosts): the comparison table people
//! use for connection strategies on clean vs lossy links. Rounds and hosts are combined by
//! merging histograms and summing counts, never by averaging percentiles.

pub mod html;

use std::collections::BTreeMap;
use std::fmt::Write;

use hdrhistogram::Histogram;

use crate::results::{new_histogram, Row};

/// Everything measured for one (flavour, mode, workload, concurrency) under one profile.
#[derive(Debug)]
pub struct Cell {
    /// Rows combined (rounds × hosts).
    pub rows: usize,
    /// Mean over rows of the time the cell's calls took, ms.
    pub mean_total_ms: f64,
    pub calls: u64,
    pub failed: u64,
    /// All rows' latency histograms merged.
    pub latency: Histogram<u64>,
}

/// A table: row keys in first-seen order, profile columns in first-seen order.
#[derive(Debug, Default)]
pub struct Table {
    pub rows: Vec<String>,
    pub profiles: Vec<String>,
    pub cells: BTreeMap<(usize, usize), Cell>,
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
    pub fn build(rows: &[Row]) -> Result<Table, String> {
        let mut t = Table::default();
        let mut totals: BTreeMap<(usize, usize), f64> = BTreeMap::new();
        for r in rows {
            let key = row_key(r);
            let profile = r.profile.clone().unwrap_or_else(|| "(unknown)".into());
            let ri = index_of(&mut t.rows, key);
            let pi = index_of(&mut t.profiles, profile);
            let cell = t.cells.entry((ri, pi)).or_insert_with(|| Cell {
                rows: 0,
                mean_total_ms: 0.0,
                calls: 0,
                failed: 0,
                latency: new_histogram(),
            });
            cell.rows += 1;
            cell.calls += r.calls;
            cell.failed += r.failed;
            cell.latency
                .add(r.histogram()?)
                .map_err(|e| format!("cannot merge histograms: {e:?}"))?;
            *totals.entry((ri, pi)).or_default() += r.elapsed_ms as f64;
        }
        for (k, total) in totals {
            let cell = t.cells.get_mut(&k).expect("built together");
            cell.mean_total_ms = total / cell.rows as f64;
        }
        Ok(t)
    }

    /// Plain-text rendering: mean total time, p99 and failures per cell.
    pub fn render(&self) -> String {
        let width = self.rows.iter().map(String::len).max().unwrap_or(0).max(14);
        let mut out = format!("{:<width$}", "flavour mode");
        for p in &self.profiles {
            let _ = write!(out, " | {:^30}", p);
        }
        out.push('\n');
        let _ = write!(out, "{:<width$}", "");
        for _ in &self.profiles {
            let _ = write!(
                out,
                " | {:>10} {:>10} {:>8}",
                "total ms", "p99 ms", "failed"
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
                            " | {:>10.1} {:>10} {:>8}",
                            c.mean_total_ms, p99, c.failed
                        );
                    }
                    None => {
                        let _ = write!(out, " | {:>10} {:>10} {:>8}", "", "", "");
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
        let t = Table::build(&rows).unwrap();
        assert_eq!(t.rows, ["grpc single", "grpc per-call"]);
        assert_eq!(t.profiles, ["local", "lossy"]);
        let c = &t.cells[&(0, 0)];
        assert_eq!((c.rows, c.calls, c.latency.len()), (2, 4, 4));
        assert_eq!(c.mean_total_ms, 20.0);
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
}
