//! The figures a cell has, by name: what `--assert`, `--baseline` and `--json` speak of. One
//! list, so a gate, a delta and a JSON field can never mean different things by one name.

use super::CellFigures;

/// How a metric's values are read and written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Milliseconds; a threshold needs a unit (us, µs, ms, s).
    Time,
    /// A plain number.
    Count,
    /// Bytes; a threshold takes a size (`4MiB`, `1500B`, a bare number of bytes).
    Bytes,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    P50,
    P90,
    P99,
    P999,
    Max,
    Mean,
    /// The time a cell's calls took (mean over rounds, or the median round's).
    Total,
    CallsPerSec,
    Failed,
    /// Connections opened per round.
    Conns,
    /// Retransmission stalls per 1000 calls.
    Stalls,
    /// Server CPU time per 1000 calls.
    Cpu,
    /// Peak server RSS.
    Rss,
    ReqBytes,
    RespBytes,
}

impl Metric {
    /// Every metric with its names: the first is the one messages use.
    const NAMES: [(Metric, &'static [&'static str]); 15] = [
        (Metric::P50, &["p50"]),
        (Metric::P90, &["p90"]),
        (Metric::P99, &["p99"]),
        (Metric::P999, &["p999", "p99.9"]),
        (Metric::Max, &["max"]),
        (Metric::Mean, &["mean"]),
        (Metric::Total, &["total", "total-time"]),
        (Metric::CallsPerSec, &["calls/s", "tps"]),
        (Metric::Failed, &["failed"]),
        (Metric::Conns, &["conns", "connections"]),
        (Metric::Stalls, &["stalls"]),
        (Metric::Cpu, &["cpu"]),
        (Metric::Rss, &["rss"]),
        (Metric::ReqBytes, &["req-bytes"]),
        (Metric::RespBytes, &["resp-bytes"]),
    ];

    pub fn parse(s: &str) -> Option<Metric> {
        Self::NAMES
            .iter()
            .find(|(_, names)| names.contains(&s))
            .map(|(m, _)| *m)
    }

    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(m, _)| *m == self)
            .map_or("?", |(_, names)| names[0])
    }

    /// The names, for a message listing what may be used.
    pub(crate) fn all_names() -> String {
        Self::NAMES
            .iter()
            .map(|(_, names)| names[0])
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn kind(self) -> Kind {
        match self {
            Metric::P50
            | Metric::P90
            | Metric::P99
            | Metric::P999
            | Metric::Max
            | Metric::Mean
            | Metric::Total
            | Metric::Cpu => Kind::Time,
            Metric::Rss | Metric::ReqBytes | Metric::RespBytes => Kind::Bytes,
            Metric::CallsPerSec | Metric::Failed | Metric::Conns | Metric::Stalls => Kind::Count,
        }
    }

    /// Whether a smaller value is the better one (latencies, failures, costs), as against
    /// calls/s: what a regression and "the fastest" mean.
    pub(crate) fn lower_is_better(self) -> bool {
        self != Metric::CallsPerSec
    }

    /// `v` (in the metric's unit: ms, bytes or a count) as a person reads it.
    pub fn format(self, v: f64) -> String {
        let unit = match self {
            Metric::Cpu => " ms per 1000 calls",
            Metric::Stalls => " per 1000 calls",
            Metric::Conns => " per round",
            _ => "",
        };
        let number = match self.kind() {
            Kind::Time => format!("{} ms", format_ms(v)),
            Kind::Bytes if v >= 1024.0 * 1024.0 => format!("{:.1} MiB", v / (1024.0 * 1024.0)),
            Kind::Bytes if v >= 1024.0 => format!("{:.1} KiB", v / 1024.0),
            Kind::Bytes => format!("{v:.0} B"),
            Kind::Count if v.fract() == 0.0 => format!("{v:.0}"),
            Kind::Count => format!("{v:.1}"),
        };
        number + unit
    }
}

/// Milliseconds with the digits that matter: 0.123, 4.56, 78.9, 1234.
pub fn format_ms(v: f64) -> String {
    match v.abs() {
        a if a < 1.0 => format!("{v:.3}"),
        a if a < 10.0 => format!("{v:.2}"),
        a if a < 1000.0 => format!("{v:.1}"),
        _ => format!("{v:.0}"),
    }
}

impl CellFigures {
    /// The cell's value of `m` in the metric's unit; None when the cell has no such
    /// measurement (no successful call for a latency, a bare bench for the server's figures).
    pub fn value(&self, m: Metric) -> Option<f64> {
        let quantile = |q: f64| {
            (!self.latency.is_empty()).then(|| self.latency.value_at_quantile(q) as f64 / 1e3)
        };
        match m {
            Metric::P50 => quantile(0.5),
            Metric::P90 => quantile(0.9),
            Metric::P99 => quantile(0.99),
            Metric::P999 => quantile(0.999),
            Metric::Max => (!self.latency.is_empty()).then(|| self.latency.max() as f64 / 1e3),
            Metric::Mean => (!self.latency.is_empty()).then(|| self.latency.mean() / 1e3),
            Metric::Total => Some(self.mean_total_ms),
            Metric::CallsPerSec => Some(self.calls_per_sec),
            Metric::Failed => Some(self.failed as f64),
            Metric::Conns => Some(self.conns_opened),
            Metric::Stalls => self.stalls_per_1k,
            Metric::Cpu => self.server_cpu_ms_per_1k,
            Metric::Rss => self.server_rss_peak_kb.map(|kb| kb as f64 * 1024.0),
            Metric::ReqBytes => self.req_bytes,
            Metric::RespBytes => self.resp_bytes,
        }
    }
}
