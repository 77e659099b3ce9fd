//! `GET /metrics`: every managed proxy's counters in Prometheus' text exposition format.

use std::fmt::Write;

use super::registry::ProxyMetrics;
use crate::fault::Direction;

/// The exposition text for `proxies`.
pub(crate) fn render(proxies: &[ProxyMetrics]) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    };
    let per_proxy = |f: &dyn Fn(&ProxyMetrics) -> u64| -> Vec<(String, u64)> {
        proxies
            .iter()
            .map(|p| (format!("proxy=\"{}\"", escape(&p.name)), f(p)))
            .collect()
    };
    let per_direction = |f: &dyn Fn(&ProxyMetrics, Direction) -> u64| -> Vec<(String, u64)> {
        let mut v = Vec::new();
        for p in proxies {
            for d in [Direction::Upstream, Direction::Downstream] {
                v.push((
                    format!("proxy=\"{}\",direction=\"{}\"", escape(&p.name), d.as_str()),
                    f(p, d),
                ));
            }
        }
        v
    };
    family(
        "faultrig_proxy_bytes_total",
        "counter",
        "Bytes delivered by the proxy (upstream: client to server; downstream: server to client).",
        per_direction(&|p, d| match d {
            Direction::Upstream => p.stats.bytes_up,
            Direction::Downstream => p.stats.bytes_down,
        }),
    );
    family(
        "faultrig_proxy_stalls_total",
        "counter",
        "Segments (and SYN/SYN-ACKs) the fault model lost, each stalling delivery until retransmitted; on a kernel-engine proxy, packets its link dropped.",
        per_direction(&|p, d| match d {
            Direction::Upstream => p.stats.stalls_up,
            Direction::Downstream => p.stats.stalls_down,
        }),
    );
    family(
        "faultrig_proxy_connections_total",
        "counter",
        "Client connections accepted.",
        per_proxy(&|p| p.stats.connections),
    );
    family(
        "faultrig_proxy_connections_active",
        "gauge",
        "Client connections open now.",
        per_proxy(&|p| p.stats.active),
    );
    family(
        "faultrig_proxy_connect_failures_total",
        "counter",
        "Clients reset because the upstream could not be reached.",
        per_proxy(&|p| p.stats.connect_failures),
    );
    family(
        "faultrig_proxy_enabled",
        "gauge",
        "1 when the proxy is listening.",
        per_proxy(&|p| u64::from(p.enabled)),
    );
    let mut toxics = Vec::new();
    for p in proxies {
        let mut counted: Vec<((&str, Direction), u64)> = Vec::new();
        for (kind, d) in &p.toxics {
            let t = (kind.as_str(), *d);
            match counted.iter_mut().find(|(k, _)| *k == t) {
                Some((_, n)) => *n += 1,
                None => counted.push((t, 1)),
            }
        }
        for ((kind, d), n) in counted {
            toxics.push((
                format!(
                    "proxy=\"{}\",type=\"{kind}\",stream=\"{}\"",
                    escape(&p.name),
                    d.as_str()
                ),
                n,
            ));
        }
    }
    family(
        "faultrig_proxy_toxics_active",
        "gauge",
        "Toxics set on the proxy, by type and stream.",
        toxics,
    );
    out
}

/// Label values escape backslash, double quote and newline.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::StatsSnapshot;

    #[test]
    fn exposition_is_well_formed() {
        let text = render(&[ProxyMetrics {
            name: "a\"b".into(),
            enabled: true,
            stats: StatsSnapshot {
                bytes_up: 10,
                bytes_down: 20,
                stalls_up: 1,
                ..StatsSnapshot::default()
            },
            toxics: vec![
                ("latency".to_string(), Direction::Downstream),
                ("latency".to_string(), Direction::Downstream),
            ],
        }]);
        assert!(text.contains(
            "faultrig_proxy_bytes_total{proxy=\"a\\\"b\",direction=\"downstream\"} 20\n"
        ));
        assert!(text.contains(
            "faultrig_proxy_toxics_active{proxy=\"a\\\"b\",type=\"latency\",stream=\"downstream\"} 2\n"
        ));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<u64>().is_ok(), "{line}");
        }
    }
}
