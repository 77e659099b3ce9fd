//! The HTML report: one self-contained file (inline CSS and SVG, nothing fetched), with the
//! comparison tables and plots drawn by plotters' SVG backend: a latency CDF per profile (one
//! line per flavour × mode, log-scale time) and p50/p99 bars per cell.

use std::fmt::Write;

use plotters::prelude::*;

use super::Table;

const WIDTH: u32 = 900;

/// The whole page for a table built from `rows` rows.
pub fn page(title: &str, table: &Table, rows: usize) -> Result<String, String> {
    let mut html = head(title);
    html += &findings_html(table);
    let _ = writeln!(
        html,
        "<p>{rows} rows; {}. Hover over a column's name for what it means; - is not measured.</p>",
        escape(table.summary.explain()),
    );
    html += &html_tables(table);
    for (pi, profile) in table.profiles.iter().enumerate() {
        let _ = writeln!(html, "<h2>Latency CDF: {}</h2>", escape(profile));
        html += &cdf_svg(table, pi).map_err(|e| format!("plot: {e}"))?;
    }
    html += "<h2>p50 and p99 latency per cell</h2>\n";
    html += &bars_svg(table).map_err(|e| format!("plot: {e}"))?;
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
         .legend i{{display:inline-block;width:18px;height:3px;margin:0 6px 4px 0}}\
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
        series.push((name.clone(), points));
    }
    cdf_plot(&series, "latency, ms (log scale)")
}

/// Cumulative distributions overlaid on one log-scale plot, one line per named series of
/// (value, fraction at or below it) points in increasing order, with an HTML legend under it.
pub(crate) fn cdf_plot(series: &[(String, Vec<(f64, f64)>)], x_desc: &str) -> PlotResult {
    let series: Vec<_> = series.iter().filter(|(_, p)| !p.is_empty()).collect();
    if series.is_empty() {
        return Ok("<p>no successful calls</p>\n".into());
    }
    let lo = series.iter().map(|(_, p)| p[0].0).fold(f64::MAX, f64::min);
    let hi = series
        .iter()
        .map(|(_, p)| p[p.len() - 1].0)
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
            .build_cartesian_2d((lo..hi).log_scale(), 0f64..1.0)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc("fraction of calls")
            .draw()?;
        for (i, (_, points)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart.draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?;
        }
        root.present()?;
    }
    // The legend is HTML under the plot: drawn inside it, a sweep's thirty series would cover
    // the very lines they name.
    let mut legend = String::from("<div class=legend>");
    for (i, (name, _)) in series.iter().enumerate() {
        let (r, g, b) = Palette99::pick(i).to_rgba().rgb();
        let _ = write!(
            legend,
            "<span><i style=\"background:#{r:02x}{g:02x}{b:02x}\"></i>{}</span>",
            escape(name)
        );
    }
    Ok(svg + "\n" + &legend + "</div>\n")
}

fn bars_svg(t: &Table) -> PlotResult {
    let mut bars = Vec::new();
    for (ri, name) in t.rows.iter().enumerate() {
        for (pi, profile) in t.profiles.iter().enumerate() {
            if let Some(c) = t.cells.get(&(ri, pi)).filter(|c| !c.latency.is_empty()) {
                let ms = |q| c.latency.value_at_quantile(q) as f64 / 1e3;
                bars.push((format!("{name} @ {profile}"), ms(0.5), ms(0.99)));
            }
        }
    }
    if bars.is_empty() {
        return Ok("<p>no successful calls</p>\n".into());
    }
    let lo = bars.iter().map(|b| b.1).fold(f64::MAX, f64::min).max(0.001) * 0.5;
    let hi = bars.iter().map(|b| b.2).fold(0f64, f64::max) * 1.5;
    let n = bars.len();
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let mut svg = String::new();
    {
        let height = 60 + 22 * n as u32;
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(260)
            .build_cartesian_2d((lo..hi).log_scale(), (0..n).into_segmented())?;
        // Segment i is drawn from the bottom; list the first cell at the top.
        let row = |i: usize| n - 1 - i;
        chart
            .configure_mesh()
            .x_desc("latency, ms (log scale): p50 dark, p99 light")
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) if *i < n => labels[row(*i)].clone(),
                _ => String::new(),
            })
            .draw()?;
        for (i, (_, p50, p99)) in bars.iter().enumerate() {
            let (bottom, top) = (SegmentValue::Exact(row(i)), SegmentValue::Exact(row(i) + 1));
            chart.draw_series([
                Rectangle::new(
                    [(lo, bottom.clone()), (*p99, top.clone())],
                    BLUE.mix(0.3).filled(),
                ),
                Rectangle::new([(lo, bottom), (*p50, top)], BLUE.filled()),
            ])?;
        }
        root.present()?;
    }
    Ok(svg + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::crafted;
    use crate::report::RoundSummary;

    #[test]
    fn the_page_opens_with_findings_and_has_a_table_and_a_cdf_per_profile() {
        let t = Table::build(&crafted(), RoundSummary::Mean).unwrap();
        let page = page("t", &t, 8).unwrap();
        let findings = page.find("<h2>Findings</h2>").expect("findings");
        assert!(
            findings < page.find("<table").unwrap(),
            "findings come first"
        );
        assert_eq!(page.matches("<li>").count(), 4);
        assert!(page.contains("costs 2.70–2.80× the p50"));
        assert_eq!(
            page.matches("<table class=cells>").count(),
            2,
            "a table per profile"
        );
        assert_eq!(
            page.matches("<h2>Latency CDF: ").count(),
            2,
            "a CDF per profile"
        );
        for (name, _) in crate::report::COLUMNS {
            assert_eq!(
                page.matches(&format!(">{}</th>", escape(name))).count(),
                2,
                "{name}"
            );
        }
        assert!(page.contains("<td>tcp-binary per-call</td>"));
        assert!(page.contains("<td>2.80</td><td>1.06</td></tr>"));
    }
}
