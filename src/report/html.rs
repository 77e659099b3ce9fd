//! The HTML report: one self-contained file (inline CSS and SVG, nothing fetched), with the
//! comparison tables and plots drawn by plotters' SVG backend: a latency CDF per profile (one
//! line per flavour × mode, log-scale time), p50/p99 bars in a panel per profile, and for
//! sweeps the charts against concurrency and payload size ([`super::sweep`]). The gates'
//! verdicts and the baseline comparison come right after the findings when given.

use std::fmt::Write;

use plotters::prelude::*;

use super::compare::Comparison;
use super::gate::Check;
use super::Table;

const WIDTH: u32 = 900;

/// The whole page for a table built from `rows` rows, with the gates' verdicts and the
/// baseline comparison when there are any: findings and verdicts first (what a reader came
/// for), then the tables, then the plots.
pub fn page(
    title: &str,
    table: &Table,
    rows: usize,
    checks: &[Check],
    baseline: Option<&Comparison>,
) -> Result<String, PlotError> {
    let mut html = head(title);
    html += &findings_html(table);
    html += &gates_html(checks);
    if let Some(c) = baseline {
        html += &baseline_html(c);
    }
    let _ = writeln!(
        html,
        "<p>{rows} rows; {}. Hover over a column's name for what it means; - is not measured.</p>",
        escape(table.summary.explain()),
    );
    html += &html_tables(table);
    for (pi, profile) in table.profiles.iter().enumerate() {
        let _ = writeln!(html, "<h2>Latency CDF: {}</h2>", escape(profile));
        html += &cdf_svg(table, pi)?;
    }
    html += "<h2>p50 and p99 latency per cell</h2>\n";
    html += &bar_panels(table)?;
    html += &super::sweep::charts(table)?;
    html += "</body></html>\n";
    Ok(html)
}

/// The page up to its title heading: the one stylesheet every faultrig page uses.
pub(crate) fn head(title: &str) -> String {
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>\
         body{{font-family:sans-serif;margin:2em;color:#222}}\
         table{{border-collapse:collapse;margin:1em 0}}\
         td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}\
         th{{background:#f4f4f4}} td:first-child{{text-align:left}}\
         .legend{{display:flex;flex-wrap:wrap;gap:2px 16px;max-width:900px;font-size:13px}}\
         .legend i{{display:inline-block;width:26px;height:0;margin:0 6px 4px 0}}\
         .legend .gap{{width:24px}}\
         .panels{{display:flex;flex-wrap:wrap;gap:8px 24px}}\
         figure{{margin:0}} figcaption{{font-weight:bold;text-align:center}}\
         .pass{{color:#060}} .fail{{color:#b00;font-weight:bold}}\
         td.regressed{{background:#fdd;color:#900}}\
         </style></head><body>\n<h1>{t}</h1>\n",
        t = escape(title),
    )
}

pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The findings, as a list at the top of the page (or why there are none).
fn findings_html(t: &Table) -> String {
    let found = super::findings::findings(t);
    if found.is_empty() {
        return format!("<p><b>Findings:</b> {}</p>\n", super::findings::NONE);
    }
    let mut h = String::from("<h2>Findings</h2>\n<ul class=findings>\n");
    for f in found {
        let _ = writeln!(h, "<li>{}</li>", escape(&f));
    }
    h + "</ul>\n"
}

/// A table per profile, every column ([`super::COLUMNS`], their meaning on hover).
fn html_tables(t: &Table) -> String {
    let mut h = String::new();
    for (pi, profile) in t.profiles.iter().enumerate() {
        let _ = write!(
            h,
            "<h2>{}</h2>\n<table class=cells><tr><th>flavour mode</th>",
            escape(profile)
        );
        for (name, meaning) in super::COLUMNS {
            let _ = write!(h, "<th title=\"{}\">{}</th>", escape(meaning), escape(name));
        }
        h += "</tr>\n";
        for (ri, name) in t.rows.iter().enumerate() {
            let Some(columns) = t.columns(ri, pi) else {
                continue;
            };
            let _ = write!(h, "<tr><td>{}</td>", escape(name));
            for c in columns {
                let _ = write!(h, "<td>{}</td>", escape(&c));
            }
            h += "</tr>\n";
        }
        h += "</table>\n";
    }
    h
}

pub(crate) type PlotResult = Result<String, Box<dyn std::error::Error>>;

/// A plot that could not be drawn, for every page that has plots (the report's and
/// calibrate's). plotters' error is kept as its text: it is not `Send`, and an error must be
/// to reach the binary's edge.
#[derive(Debug, thiserror::Error)]
#[error("plot: {0}")]
pub struct PlotError(String);

impl From<Box<dyn std::error::Error>> for PlotError {
    fn from(e: Box<dyn std::error::Error>) -> PlotError {
        PlotError(e.to_string())
    }
}

/// Colours told apart by most eyes (Okabe and Ito's eight, less yellow, which vanishes on
/// white, plus three): a flavour keeps its colour in every panel.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(213, 94, 0),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(140, 86, 75),
    RGBColor(128, 128, 128),
    RGBColor(188, 189, 34),
];

/// Dash and gap, px, by mode in the order modes first appear: solid, dashed, dotted, long.
const DASHES: [Option<(u32, u32)>; 4] = [None, Some((9, 5)), Some((2, 4)), Some((16, 5))];

/// How a line looks: colour by flavour, dash by mode.
#[derive(Clone, Copy)]
pub(crate) struct Look {
    pub(crate) colour: RGBColor,
    pub(crate) dash: Option<(u32, u32)>,
}

impl Look {
    fn css(self) -> String {
        let RGBColor(r, g, b) = self.colour;
        let style = match self.dash {
            None => "solid",
            Some((d, _)) if d <= 3 => "dotted",
            Some(_) => "dashed",
        };
        format!("border-top:3px {style} #{r:02x}{g:02x}{b:02x}")
    }
}

/// One line of a CDF: its name in the legend, its look, (value, fraction at or below) points
/// in increasing order.
pub(crate) struct Series {
    name: String,
    look: Look,
    points: Vec<(f64, f64)>,
}

/// The table's flavours or modes (`axis` picks which) in the order first seen: the order
/// their colours and dashes are given in.
fn first_seen(t: &Table, axis: fn(&super::RowKey) -> &str) -> Vec<&str> {
    let mut seen: Vec<&str> = Vec::new();
    for k in &t.keys {
        if !seen.contains(&axis(k)) {
            seen.push(axis(k));
        }
    }
    seen
}

fn flavour_of(k: &super::RowKey) -> &str {
    &k.flavour
}

fn mode_of(k: &super::RowKey) -> &str {
    &k.mode
}

/// A row's look in the report's plots: its flavour's colour and its mode's dash, by the order
/// flavours and modes first appear in the table.
pub(crate) fn look(t: &Table, ri: usize) -> Look {
    let at = |axis: fn(&super::RowKey) -> &str| {
        first_seen(t, axis)
            .iter()
            .position(|x| *x == axis(&t.keys[ri]))
            .unwrap_or(0)
    };
    Look {
        colour: PALETTE[at(flavour_of) % PALETTE.len()],
        dash: DASHES[at(mode_of) % DASHES.len()],
    }
}

/// One legend for a set of panels, factored: a colour per flavour, a line style per mode (in
/// grey), then `note`. Thirty "flavour mode" entries would be read one by one; ten are learnt.
pub(crate) fn legend(t: &Table, note: &str) -> String {
    let mut h = String::from("<div class=legend>");
    for (i, flavour) in first_seen(t, flavour_of).iter().enumerate() {
        let swatch = Look {
            colour: PALETTE[i % PALETTE.len()],
            dash: None,
        };
        let _ = write!(
            h,
            "<span><i style=\"{}\"></i>{}</span>",
            swatch.css(),
            escape(flavour)
        );
    }
    h += "<span class=gap></span>";
    for (i, mode) in first_seen(t, mode_of).iter().enumerate() {
        let swatch = Look {
            colour: RGBColor(90, 90, 90),
            dash: DASHES[i % DASHES.len()],
        };
        let _ = write!(
            h,
            "<span><i style=\"{}\"></i>{}</span>",
            swatch.css(),
            escape(mode)
        );
    }
    if !note.is_empty() {
        let _ = write!(h, "<span>{}</span>", escape(note));
    }
    h + "</div>\n"
}

fn cdf_svg(t: &Table, profile: usize) -> PlotResult {
    let mut series = Vec::new();
    for (ri, name) in t.rows.iter().enumerate() {
        let Some(cell) = t.cells.get(&(ri, profile)) else {
            continue;
        };
        let h = &cell.latency;
        if h.is_empty() {
            continue;
        }
        let total = h.len() as f64;
        let mut seen = 0u64;
        let points: Vec<(f64, f64)> = h
            .iter_recorded()
            .map(|v| {
                seen += v.count_at_value();
                (
                    h.highest_equivalent(v.value_iterated_to()) as f64 / 1e3,
                    seen as f64 / total,
                )
            })
            .collect();
        series.push(Series {
            name: name.clone(),
            look: look(t, ri),
            points,
        });
    }
    styled_cdf_plot(&series, "latency, ms (log scale)")
}

/// Cumulative distributions overlaid on one log-scale plot, one line per named series of
/// (value, fraction at or below it) points in increasing order, each in a colour of its own,
/// with an HTML legend under it.
pub(crate) fn cdf_plot(series: &[(String, Vec<(f64, f64)>)], x_desc: &str) -> PlotResult {
    let series: Vec<Series> = series
        .iter()
        .enumerate()
        .map(|(i, (name, points))| Series {
            name: name.clone(),
            look: Look {
                colour: PALETTE[i % PALETTE.len()],
                dash: None,
            },
            points: points.clone(),
        })
        .collect();
    styled_cdf_plot(&series, x_desc)
}

/// Tick values for a log axis from `lo` to `hi`: the powers of ten, and 2× and 5× them too
/// when fewer than three powers fall inside (so a narrow axis still has labels near its
/// lines). Decades only otherwise: 1-2-5 steps on a wide axis crowd into each other near every
/// power.
pub(crate) fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let decades = |steps: &[f64]| -> Vec<f64> {
        let mut ticks = Vec::new();
        for e in lo.log10().floor() as i32..=hi.log10().ceil() as i32 {
            for s in steps {
                // Formatted and read back, so 10^-3 is 0.001 and not 0.0010000000000000002.
                let v: f64 = format!("{:e}", s * 10f64.powi(e)).parse().unwrap_or(0.0);
                if (lo..=hi).contains(&v) {
                    ticks.push(v);
                }
            }
        }
        ticks
    };
    match decades(&[1.0]) {
        ticks if ticks.len() >= 3 => ticks,
        _ => decades(&[1.0, 2.0, 5.0]),
    }
}

/// A tick's label: `0.01`, `1`, `1000`, never `1e3`.
pub(crate) fn tick_label(v: &f64) -> String {
    format!("{v}")
}

fn styled_cdf_plot(series: &[Series], x_desc: &str) -> PlotResult {
    let series: Vec<_> = series.iter().filter(|s| !s.points.is_empty()).collect();
    if series.is_empty() {
        return Ok("<p>no successful calls</p>\n".into());
    }
    let lo = series
        .iter()
        .map(|s| s.points[0].0)
        .fold(f64::MAX, f64::min);
    let hi = series
        .iter()
        .map(|s| s.points[s.points.len() - 1].0)
        .fold(0f64, f64::max);
    let mut svg = String::new();
    let (lo, hi) = ((lo * 0.8).max(0.001), (hi * 1.25).max(0.002));
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 420)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(
                (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
                0f64..1.0,
            )?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc("fraction of calls")
            .x_label_formatter(&tick_label)
            // The fine grid between ticks is noise behind a dozen lines.
            .light_line_style(TRANSPARENT)
            .draw()?;
        for s in &series {
            let style = s.look.colour.stroke_width(2);
            let points = s.points.iter().copied();
            match s.look.dash {
                None => chart.draw_series(LineSeries::new(points, style))?,
                Some((dash, gap)) => {
                    chart.draw_series(DashedLineSeries::new(points, dash, gap, style))?
                }
            };
        }
        root.present()?;
    }
    // The legend is HTML under the plot: drawn inside it, a sweep's thirty series would cover
    // the very lines they name.
    let mut legend = String::from("<div class=legend>");
    for s in &series {
        let _ = write!(
            legend,
            "<span><i style=\"{}\"></i>{}</span>",
            s.look.css(),
            escape(&s.name)
        );
    }
    Ok(svg + "\n" + &legend + "</div>\n")
}

/// p50 and p99 bars, a panel per profile (the rows of that profile, named without it), all on
/// one log scale so panels compare at a glance; under them one legend.
fn bar_panels(t: &Table) -> Result<String, PlotError> {
    let mut panels: Vec<(&str, Vec<Bar>)> = Vec::new();
    for (pi, profile) in t.profiles.iter().enumerate() {
        let mut bars = Vec::new();
        for (ri, name) in t.rows.iter().enumerate() {
            if let Some(c) = t.cell(ri, pi).filter(|c| !c.latency.is_empty()) {
                let ms = |q| c.latency.value_at_quantile(q) as f64 / 1e3;
                bars.push((name.as_str(), ms(0.5), ms(0.99), look(t, ri)));
            }
        }
        if !bars.is_empty() {
            panels.push((profile, bars));
        }
    }
    let all = || panels.iter().flat_map(|p| p.1.iter());
    if panels.is_empty() {
        return Ok("<p>no successful calls</p>\n".into());
    }
    let lo = all().map(|b| b.1).fold(f64::MAX, f64::min).max(0.001) * 0.5;
    let hi = all().map(|b| b.2).fold(0f64, f64::max) * 1.5;
    // Wide enough for the longest row name beside the bars.
    let label_px = 40 + 7 * all().map(|b| b.0.len()).max().unwrap_or(0) as u32;
    let mut html = String::from("<div class=panels>\n");
    for (profile, bars) in &panels {
        let svg = bars_svg(bars, lo, hi, label_px)?;
        let _ = writeln!(
            html,
            "<figure class=bars><figcaption>{}</figcaption>{svg}</figure>",
            escape(profile)
        );
    }
    html += "</div>\n";
    Ok(html + &legend(t, "bar: dark to p50, light to p99"))
}

const BAR_PANEL_WIDTH: u32 = 640;

/// A row's bar: its name, p50 and p99 (ms), and its look.
type Bar<'a> = (&'a str, f64, f64, Look);

fn bars_svg(bars: &[Bar], lo: f64, hi: f64, label_px: u32) -> PlotResult {
    let n = bars.len();
    let mut svg = String::new();
    {
        let height = 60 + 22 * n as u32;
        let width = BAR_PANEL_WIDTH.max(label_px + 320);
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(label_px)
            .build_cartesian_2d(
                (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
                (0..n).into_segmented(),
            )?;
        // Segment i is drawn from the bottom; list the first cell at the top.
        let row = |i: usize| n - 1 - i;
        chart
            .configure_mesh()
            .x_desc("latency, ms (log scale)")
            .x_label_formatter(&tick_label)
            .light_line_style(TRANSPARENT)
            .y_labels(n)
            // Plotters' default shrinks with the panel's width, too small to read a row name.
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 13))
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) if *i < n => bars[row(*i)].0.to_string(),
                _ => String::new(),
            })
            .draw()?;
        for (i, (_, p50, p99, look)) in bars.iter().enumerate() {
            let (bottom, top) = (SegmentValue::Exact(row(i)), SegmentValue::Exact(row(i) + 1));
            chart.draw_series([
                Rectangle::new(
                    [(lo, bottom.clone()), (*p99, top.clone())],
                    look.colour.mix(0.3).filled(),
                ),
                Rectangle::new([(lo, bottom), (*p50, top)], look.colour.filled()),
            ])?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// The gates' verdicts: per assertion whether it held, and the cells that broke it.
fn gates_html(checks: &[Check]) -> String {
    if checks.is_empty() {
        return String::new();
    }
    let mut h = String::from("<h2>Gates</h2>\n");
    for (name, mine, failed) in super::gate::by_assertion(checks) {
        if failed.is_empty() {
            let _ = writeln!(
                h,
                "<p class=pass>✓ <code>{}</code> holds in all {} cells</p>",
                escape(name),
                mine.len()
            );
            continue;
        }
        let _ = writeln!(
            h,
            "<p class=fail>✗ <code>{}</code> fails in {} of {} cells</p>\n\
             <table class=gate><tr><th>cell</th><th>profile</th><th>measured</th></tr>",
            escape(name),
            failed.len(),
            mine.len()
        );
        for c in failed {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(c.row.as_deref().unwrap_or("(none)")),
                escape(c.profile.as_deref().unwrap_or("")),
                escape(&c.says)
            );
        }
        h += "</table>\n";
    }
    h
}

/// The baseline comparison: a row per cell, each figure old → new with its change, the ones
/// that regressed marked.
fn baseline_html(c: &Comparison) -> String {
    let mut h = format!(
        "<h2>Against the baseline</h2>\n<p>{} of {} cells regressed (p50 or p99 up, or calls/s \
         down, by more than {}%, or a larger share of calls failed; marked red).</p>\n\
         <table class=baseline><tr><th>cell</th>",
        c.regressions(),
        c.deltas.len(),
        c.threshold_pct
    );
    for m in super::compare::COMPARED {
        let _ = write!(h, "<th>{}</th>", escape(m.name()));
    }
    h += "</tr>\n";
    for d in &c.deltas {
        let _ = write!(
            h,
            "<tr><td>{} @ {}</td>",
            escape(&d.row),
            escape(&d.profile)
        );
        for ch in &d.changes {
            let v = |v: Option<f64>| v.map_or("-".into(), |v| super::compare::figure(ch.of, v));
            let pct = ch
                .change_pct
                .map_or(String::new(), |p| format!(" ({p:+.0}%)"));
            let class = if ch.regressed { " class=regressed" } else { "" };
            let _ = write!(
                h,
                "<td{class}>{} → {}{pct}</td>",
                escape(&v(ch.old)),
                escape(&v(ch.new))
            );
        }
        h += "</tr>\n";
    }
    h += "</table>\n";
    for (what, cells) in [
        ("Only in the baseline", &c.only_baseline),
        ("Only in the new results", &c.only_new),
    ] {
        if !cells.is_empty() {
            let _ = writeln!(h, "<p>{what}: {}</p>", escape(&cells.join(", ")));
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::crafted;
    use crate::report::RoundSummary;

    #[test]
    fn the_page_opens_with_findings_and_has_a_table_and_a_cdf_per_profile() {
        let t = Table::build(&crafted(), RoundSummary::Mean).unwrap();
        let page = page("t", &t, 8, &[], None).unwrap();
        let findings = page.find("<h2>Findings</h2>").expect("findings");
        assert!(
            findings < page.find("<table").unwrap(),
            "findings come first"
        );
        assert!(page.contains("costs 2.70–2.80× the p50"));
        assert!(page.contains("<td>tcp-binary per-call</td>"));
        assert!(page.contains("<td>2.80</td><td>1.06</td></tr>"));
        let mut twice: Vec<String> = vec![
            "<table class=cells>".into(), // a table per profile
            "<h2>Latency CDF: ".into(),   // a CDF per profile
            // Colour by flavour, dash by mode: grpc's lines one colour, per-call's dashed.
            "border-top:3px dashed #0072b2".into(),
            "border-top:3px dashed #e69f00".into(),
        ];
        twice.extend(crate::report::COLUMNS.map(|(name, _)| format!(">{}</th>", escape(name))));
        for needle in twice {
            assert_eq!(page.matches(&needle).count(), 2, "{needle}");
        }
        // grpc single's line in each CDF's legend, and grpc in the bars' legend.
        assert_eq!(page.matches("border-top:3px solid #0072b2").count(), 3);
        assert_eq!(page.matches("<li>").count(), 4);
        assert!(page.contains("stroke=\"#E69F00\"") || page.contains("stroke=\"#e69f00\""));
    }

    #[test]
    fn the_bars_are_a_panel_per_profile_under_one_legend() {
        let t = Table::build(&crafted(), RoundSummary::Mean).unwrap();
        let page = page("t", &t, 8, &[], None).unwrap();
        assert_eq!(page.matches("<figure class=bars>").count(), 2);
        for profile in ["local", "lossy"] {
            assert!(
                page.contains(&format!(
                    "<figure class=bars><figcaption>{profile}</figcaption>"
                )),
                "{profile}"
            );
        }
        // Row names without the profile: the panel names it.
        assert!(!page.contains(" @ "));
        // One factored legend for the bars: each flavour once, each mode once.
        let bars = &page[page.find("<figure class=bars>").unwrap()..];
        let legend = &bars[bars.find("<div class=legend>").unwrap()..];
        let legend = &legend[..legend.find("</div>").unwrap()];
        assert_eq!(legend.matches("<span><i").count(), 4, "{legend}");
        assert!(legend.contains("solid #0072b2\"></i>grpc<"));
        assert!(legend.contains("dashed #5a5a5a\"></i>per-call<"));
        assert!(legend.contains("dark to p50, light to p99"));
        // No sweep in these results, so no sweep charts, and no gates or baseline unasked.
        assert!(!page.contains("<figure class=sweep>"));
        assert!(!page.contains("<h2>Gates</h2>") && !page.contains("Against the baseline"));
    }

    #[test]
    fn a_sweep_gets_its_charts_on_the_page() {
        let t = Table::build(&crate::report::sweep::tests::swept(), RoundSummary::Mean).unwrap();
        let page = page("t", &t, 24, &[], None).unwrap();
        assert!(page.contains("<h2>Calls per second against concurrency</h2>"));
        assert!(page.contains("<h2>p99 latency against payload size</h2>"));
        assert!(
            page.find("<figure class=bars>").unwrap() < page.find("<figure class=sweep>").unwrap()
        );
    }

    #[test]
    fn gates_and_the_baseline_are_shown_when_given_after_the_findings() {
        use crate::report::{compare, gate};
        let t = Table::build(&crafted(), RoundSummary::Mean).unwrap();
        let gates = ["p99 < 50ms", "failed == 0"].map(|a| gate::Assertion::parse(a).unwrap());
        let checks = gate::check(&t, &gates);
        // The baseline: every cell 10 % faster than now, so p50 and p99 rose by 11 %.
        let old: Vec<_> = crafted()
            .into_iter()
            .map(|r| {
                let us = r.lat_p50_us.unwrap() * 9 / 10;
                crate::report::tests::row(
                    &r.flavour,
                    &r.mode,
                    r.profile.as_deref().unwrap(),
                    r.elapsed_ms,
                    &[us; 10],
                )
            })
            .collect();
        let old = Table::build(&old, RoundSummary::Mean).unwrap();
        let c = compare::compare(&old, &t, 10.0);
        let page = page("t", &t, 8, &checks, Some(&c)).unwrap();
        let at = |s: &str| page.find(s).unwrap_or_else(|| panic!("{s}"));
        assert!(at("<h2>Findings</h2>") < at("<h2>Gates</h2>"));
        assert!(at("<h2>Gates</h2>") < at("<h2>Against the baseline</h2>"));
        assert!(at("<h2>Against the baseline</h2>") < at("<table class=cells>"));
        assert!(page.contains("<code>failed == 0</code> holds in all 8 cells"));
        assert!(page.contains("<code>p99 &lt; 50ms</code> fails in 2 of 8 cells"));
        assert!(
            page.contains("<tr><td>grpc per-call</td><td>lossy</td><td>p99 = 54.0 ms</td></tr>")
        );
        assert!(page.contains("8 of 8 cells regressed"));
        assert_eq!(
            page.matches("<td class=regressed>").count(),
            16,
            "p50 and p99 of 8 cells"
        );
        assert!(page.contains("<td>grpc per-call @ lossy</td>"));
    }

    #[test]
    fn log_axes_tick_decades_and_add_steps_only_on_a_narrow_axis() {
        assert_eq!(log_ticks(0.03, 1500.0), [0.1, 1.0, 10.0, 100.0, 1000.0]);
        assert_eq!(log_ticks(0.0008, 0.2), [0.001, 0.01, 0.1]);
        assert_eq!(
            log_ticks(16.0, 1300.0),
            [20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        );
        assert_eq!(tick_label(&0.001), "0.001");
        assert_eq!(tick_label(&1000.0), "1000");
    }
}
