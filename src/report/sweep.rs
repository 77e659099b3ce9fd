//! The sweep charts of the HTML report: calls/s and p99 against concurrency, p50 and p99
//! against payload size. A panel per profile (and per value of the axes that stay fixed, so
//! two lines of one flavour and mode never share a panel), a line per flavour × mode in the
//! looks the other plots use. Drawn only for data that sweeps: some line with two values or
//! more on the axis.

use std::fmt::Write;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;

use super::html::{escape, legend, log_ticks, look, tick_label, Look, PlotError, PlotResult};
use super::metric::Metric;
use super::{RowKey, Table};
use crate::workload::Workload;

/// What a sweep varies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Axis {
    Concurrency,
    /// The blob workloads' size; other workloads are not on this axis.
    Payload,
}

impl Axis {
    /// Where a row sits on the axis, and the axes that stay fixed along it (the panel's name
    /// beside the profile); None for a row the axis does not cover.
    fn place(self, k: &RowKey) -> Option<(f64, String)> {
        let mut fixed = String::new();
        let x = match self {
            Axis::Concurrency => {
                if k.workload != "order" {
                    fixed += &format!(" {}", k.workload);
                }
                f64::from(k.concurrency)
            }
            Axis::Payload => {
                let Ok(Workload::Blob(size)) = Workload::parse(&k.workload) else {
                    return None;
                };
                fixed += &format!(" c={}", k.concurrency);
                size as f64
            }
        };
        if k.nagle {
            fixed += " nagle";
        }
        if let Some(pattern) = &k.write_pattern {
            let _ = write!(fixed, " {pattern}");
        }
        Some((x, fixed))
    }

    fn describe(self) -> &'static str {
        match self {
            Axis::Concurrency => "concurrent calls",
            Axis::Payload => "payload size",
        }
    }
}

/// One line: a flavour × mode's cells along the axis, in the row's look.
struct Line {
    look: Look,
    /// (x, the table row) in increasing x.
    cells: Vec<(f64, usize)>,
}

/// One panel: a profile and the fixed axes, and its lines.
struct Panel {
    profile: usize,
    title: String,
    lines: Vec<Line>,
}

/// The panels along `axis`: only those with a line of two x values or more, so a table that
/// does not sweep the axis has none.
fn panels(t: &Table, axis: Axis) -> Vec<Panel> {
    // (profile, fixed axes, the lines by name) as first seen.
    type Named = (usize, String, Vec<(String, Line)>);
    let mut panels: Vec<Named> = Vec::new();
    for (ri, key) in t.keys.iter().enumerate() {
        let Some((x, fixed)) = axis.place(key) else {
            continue;
        };
        for pi in 0..t.profiles.len() {
            if t.cell(ri, pi).is_none() {
                continue;
            }
            let at = match panels.iter().position(|p| p.0 == pi && p.1 == fixed) {
                Some(at) => at,
                None => {
                    panels.push((pi, fixed.clone(), Vec::new()));
                    panels.len() - 1
                }
            };
            let lines = &mut panels[at].2;
            let name = format!("{} {}", key.flavour, key.mode);
            match lines.iter_mut().find(|(n, _)| *n == name) {
                Some((_, line)) => line.cells.push((x, ri)),
                None => lines.push((
                    name,
                    Line {
                        look: look(t, ri),
                        cells: vec![(x, ri)],
                    },
                )),
            }
        }
    }
    // Profiles in the table's order, then the fixed axes as first seen.
    panels.sort_by_key(|p| p.0);
    panels
        .into_iter()
        .filter_map(|(profile, fixed, lines)| {
            let mut lines: Vec<Line> = lines.into_iter().map(|(_, l)| l).collect();
            for l in &mut lines {
                l.cells.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
            let sweeps = lines
                .iter()
                .any(|l| l.cells.windows(2).any(|w| w[0].0 != w[1].0));
            sweeps.then(|| Panel {
                profile,
                title: format!("{}{fixed}", t.profiles[profile]),
                lines,
            })
        })
        .collect()
}

/// The sweep charts, each under its heading with a legend; empty when nothing sweeps.
pub(crate) fn charts(t: &Table) -> Result<String, PlotError> {
    let mut html = String::new();
    for (axis, metric, heading) in [
        (
            Axis::Concurrency,
            Metric::CallsPerSec,
            "Calls per second against concurrency",
        ),
        (
            Axis::Concurrency,
            Metric::P99,
            "p99 latency against concurrency",
        ),
        (
            Axis::Payload,
            Metric::P50,
            "p50 latency against payload size",
        ),
        (
            Axis::Payload,
            Metric::P99,
            "p99 latency against payload size",
        ),
    ] {
        let panels = panels(t, axis);
        if panels.is_empty() {
            continue;
        }
        let _ = writeln!(html, "<h2>{heading}</h2>\n<div class=panels>");
        for p in &panels {
            let svg = panel_svg(t, p, axis, metric)?;
            let _ = writeln!(
                html,
                "<figure class=sweep><figcaption>{}</figcaption>{svg}</figure>",
                escape(&p.title)
            );
        }
        html += "</div>\n";
        html += &legend(t, "");
    }
    Ok(html)
}

/// An axis over `lo..=hi` (the data's extent): log10 of the values with decade ticks when the
/// data spans a decade or more, the values themselves from 0 otherwise. Returns the range
/// drawn, the ticks (in the same space) and whether it is log.
fn scale(lo: f64, hi: f64) -> (std::ops::Range<f64>, Vec<f64>, bool) {
    if lo > 0.0 && hi / lo >= 10.0 {
        let (lo, hi) = (lo / 1.5, hi * 1.5);
        let ticks = log_ticks(lo, hi).iter().map(|v| v.log10()).collect();
        return (lo.log10()..hi.log10(), ticks, true);
    }
    let hi = if hi > 0.0 { hi * 1.15 } else { 1.0 };
    // A 1-2-5 step giving at most six ticks.
    let mut step = 10f64.powf((hi / 6.0).log10().floor());
    for m in [2.0, 2.5, 2.0] {
        if hi / step > 6.0 {
            step *= m;
        }
    }
    let ticks = (0..=(hi / step) as u32)
        .map(|i| clean(f64::from(i) * step))
        .collect();
    (0.0..hi, ticks, false)
}

/// `v` with float noise removed (0.30000000000000004 -> 0.3).
fn clean(v: f64) -> f64 {
    format!("{v:.6e}").parse().unwrap_or(v)
}

/// A payload size for tick labels, in decimal units (the ticks are powers of ten).
fn bytes_label(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{} MB", clean(v / 1e6)),
        v if v >= 1e3 => format!("{} kB", clean(v / 1e3)),
        v => format!("{} B", clean(v)),
    }
}

/// A linear f64 axis with the given ticks. Plotters' `with_key_points` over a linear f64 axis
/// cannot take a label formatter, and these axes need one: a log axis is drawn as the linear
/// axis of log10 of the values, labelled with the values.
struct Ticked {
    range: std::ops::Range<f64>,
    ticks: Vec<f64>,
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, (from, to): (i32, i32)) -> i32 {
        let at = (v - self.range.start) / (self.range.end - self.range.start);
        from + (at * f64::from(to - from)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, _: H) -> Vec<f64> {
        self.ticks.clone()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

const PANEL: (u32, u32) = (440, 300);

fn panel_svg(t: &Table, p: &Panel, axis: Axis, metric: Metric) -> PlotResult {
    let lines: Vec<(Look, Vec<(f64, f64)>)> = p
        .lines
        .iter()
        .map(|l| {
            let points = l
                .cells
                .iter()
                .filter_map(|&(x, ri)| Some((x, t.cell(ri, p.profile)?.value(metric)?)))
                .collect();
            (l.look, points)
        })
        .collect();
    let all = || lines.iter().flat_map(|(_, pts)| pts.iter().copied());
    let extent = |f: fn((f64, f64)) -> f64| {
        all()
            .map(f)
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
    };
    let (x_lo, x_hi) = extent(|p| p.0);
    let (y_lo, y_hi) = extent(|p| p.1);
    if x_lo > x_hi {
        return Ok("<p>no successful calls</p>".into());
    }
    let (x_range, x_ticks, x_log) = scale(x_lo, x_hi);
    let (y_range, y_ticks, y_log) = scale(y_lo, y_hi);
    let to = |log: bool| move |v: f64| if log { v.log10() } else { v };
    let (tx, ty) = (to(x_log), to(y_log));
    let label = |log: bool, bytes: bool| {
        move |v: &f64| {
            let v = if log { clean(10f64.powf(*v)) } else { *v };
            if bytes {
                bytes_label(v)
            } else {
                tick_label(&v)
            }
        }
    };
    let x_label = label(x_log, axis == Axis::Payload);
    let y_label = label(y_log, false);
    let log_note = |log: bool| if log { " (log scale)" } else { "" };
    let y_desc = match metric {
        Metric::CallsPerSec => format!("calls/s{}", log_note(y_log)),
        m => format!("{} ms{}", m.name(), log_note(y_log)),
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, PANEL).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(58)
            .build_cartesian_2d(
                Ticked {
                    range: x_range,
                    ticks: x_ticks,
                },
                Ticked {
                    range: y_range,
                    ticks: y_ticks,
                },
            )?;
        chart
            .configure_mesh()
            .x_desc(format!("{}{}", axis.describe(), log_note(x_log)))
            .y_desc(y_desc)
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label)
            .light_line_style(TRANSPARENT)
            // Plotters' default shrinks with the panel, to a size hard to read.
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 13))
            .draw()?;
        for (look, points) in &lines {
            let style = look.colour.stroke_width(2);
            let points: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (tx(x), ty(y))).collect();
            match look.dash {
                None => chart.draw_series(LineSeries::new(points.iter().copied(), style))?,
                Some((dash, gap)) => chart.draw_series(DashedLineSeries::new(
                    points.iter().copied(),
                    dash,
                    gap,
                    style,
                ))?,
            };
            // A marker at each measured value: the line between two is not measured.
            chart.draw_series(
                points
                    .iter()
                    .map(|&p| Circle::new(p, 3, look.colour.filled())),
            )?;
        }
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::tests::row;
    use crate::report::RoundSummary;
    use crate::results::Row;

    /// Two flavours at 1, 10 and 100 concurrent calls with blobs of 128 B and 16 KiB, on two
    /// profiles: both axes sweep.
    pub(crate) fn swept() -> Vec<Row> {
        let mut rows = Vec::new();
        for profile in ["local", "lossy"] {
            for (fi, flavour) in ["grpc", "thrift"].into_iter().enumerate() {
                for c in [1, 10, 100] {
                    for (wi, workload) in ["blob:128B", "blob:16KiB"].into_iter().enumerate() {
                        let us = 100 * (1 + fi as u64) * (1 + wi as u64) * c;
                        let mut r = row(flavour, "single", profile, 100, &[us; 10]);
                        r.concurrency = c as u32;
                        r.workload = workload.into();
                        rows.push(r);
                    }
                }
            }
        }
        rows
    }

    #[test]
    fn a_sweep_has_a_panel_per_profile_and_fixed_axis_and_a_line_per_flavour_and_mode() {
        let t = Table::build(&swept(), RoundSummary::Mean).unwrap();
        let c = panels(&t, Axis::Concurrency);
        let titles: Vec<&str> = c.iter().map(|p| p.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "local blob:128B",
                "local blob:16KiB",
                "lossy blob:128B",
                "lossy blob:16KiB"
            ]
        );
        assert_eq!(c[0].lines.len(), 2);
        let xs: Vec<f64> = c[0].lines[0].cells.iter().map(|c| c.0).collect();
        assert_eq!(xs, [1.0, 10.0, 100.0]);
        let p = panels(&t, Axis::Payload);
        assert_eq!(p.len(), 6, "2 profiles × 3 concurrencies");
        assert_eq!(p[0].title, "local c=1");
        let xs: Vec<f64> = p[0].lines[1].cells.iter().map(|c| c.0).collect();
        assert_eq!(xs, [128.0, 16384.0]);
        let html = charts(&t).unwrap();
        assert_eq!(html.matches("<figure class=sweep>").count(), 4 * 2 + 6 * 2);
        for heading in [
            "Calls per second against concurrency",
            "p99 latency against concurrency",
            "p50 latency against payload size",
            "p99 latency against payload size",
        ] {
            assert!(html.contains(heading), "{heading}");
        }
        // 100 µs .. 40 ms spans decades: log, labelled in decades, payloads in bytes.
        assert!(html.contains("(log scale)"));
        assert!(html.contains("\n10 kB\n"), "payload ticks in bytes");
    }

    #[test]
    fn a_table_that_does_not_sweep_has_no_sweep_charts() {
        let t = Table::build(&crate::report::tests::crafted(), RoundSummary::Mean).unwrap();
        assert!(panels(&t, Axis::Concurrency).is_empty());
        assert!(panels(&t, Axis::Payload).is_empty());
        assert_eq!(charts(&t).unwrap(), "");
        // One blob size at several concurrencies: a concurrency sweep, not a payload one.
        let rows: Vec<Row> = swept()
            .into_iter()
            .filter(|r| r.workload == "blob:128B")
            .collect();
        let t = Table::build(&rows, RoundSummary::Mean).unwrap();
        let html = charts(&t).unwrap();
        assert!(html.contains("against concurrency"));
        assert!(!html.contains("against payload size"));
    }

    #[test]
    fn scales_are_log_only_across_decades() {
        let (range, ticks, log) = scale(1.0, 100.0);
        assert!(log);
        assert_eq!(ticks, [0.0, 1.0, 2.0]);
        assert!(range.start < 0.0 && range.end > 2.0);
        let (range, ticks, log) = scale(20.0, 90.0);
        assert!(!log);
        assert_eq!(range.start, 0.0);
        assert_eq!(ticks, [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert_eq!(bytes_label(1e3), "1 kB");
        assert_eq!(bytes_label(1e6), "1 MB");
        assert_eq!(bytes_label(100.0), "100 B");
    }
}
