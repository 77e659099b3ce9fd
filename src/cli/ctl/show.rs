//! How `ctl` shows an answer without `--json`: toxiproxy-cli's one-line messages, and aligned
//! tables of proxies and toxics.

use serde_json::Value;

/// How an answer is shown without `--json`: a table, or toxiproxy-cli's one-line message.
pub(super) enum Show {
    /// `/metrics`: text, printed as it is.
    Text,
    /// `GET /proxies`: an object of proxies by name.
    Proxies,
    /// One proxy with its toxics.
    Proxy,
    /// An array of toxics.
    Toxics,
    /// `POST /populate`: `{"proxies": [...]}`.
    Populated,
    Created,
    /// A proxy enabled or disabled.
    Switched,
    Deleted(String),
    ToxicAdded(String),
    ToxicUpdated(String),
    ToxicRemoved {
        proxy: String,
        toxic: String,
    },
    Reset,
}

impl Show {
    /// The answer `v` for people: toxiproxy-cli's messages, and aligned tables.
    pub(super) fn render(&self, v: &Value) -> String {
        let text = |key: &str| v[key].as_str().unwrap_or_default().to_string();
        match self {
            // Printed as it came, by the caller: it is no JSON to render.
            Show::Text => String::new(),
            Show::Proxies => {
                let list: Vec<&Value> = v
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(_, p)| p)
                    .collect();
                proxy_table(&list)
            }
            Show::Proxy => {
                let toxics = v["toxics"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                format!("{}\n{}", proxy_table(&[v]), toxic_table(toxics))
            }
            Show::Toxics => toxic_table(v.as_array().map(Vec::as_slice).unwrap_or_default()),
            Show::Populated => {
                let list: Vec<&Value> = v["proxies"].as_array().into_iter().flatten().collect();
                proxy_table(&list)
            }
            Show::Created => format!(
                "Created new proxy {} listening on {} -> {}\n",
                text("name"),
                text("listen"),
                text("upstream")
            ),
            Show::Switched => format!(
                "Proxy {} is now {}\n",
                text("name"),
                enabled_text(&v["enabled"])
            ),
            Show::Deleted(name) => format!("Deleted proxy {name}\n"),
            Show::ToxicAdded(proxy) => format!(
                "Added {} {} toxic '{}' on proxy '{proxy}'\n",
                text("stream"),
                text("type"),
                text("name")
            ),
            Show::ToxicUpdated(proxy) => {
                format!("Updated toxic '{}' on proxy '{proxy}'\n", text("name"))
            }
            Show::ToxicRemoved { proxy, toxic } => {
                format!("Removed toxic '{toxic}' on proxy '{proxy}'\n")
            }
            Show::Reset => "Enabled every proxy and removed every toxic\n".into(),
        }
    }
}

fn enabled_text(enabled: &Value) -> &'static str {
    match enabled.as_bool() {
        Some(true) => "enabled",
        _ => "disabled",
    }
}

/// One row per proxy, sorted by name: NAME, LISTEN, UPSTREAM, ENABLED, TOXICS (their number).
fn proxy_table(proxies: &[&Value]) -> String {
    let mut rows: Vec<Vec<String>> = proxies
        .iter()
        .map(|p| {
            vec![
                p["name"].as_str().unwrap_or_default().to_string(),
                p["listen"].as_str().unwrap_or_default().to_string(),
                p["upstream"].as_str().unwrap_or_default().to_string(),
                enabled_text(&p["enabled"]).to_string(),
                p["toxics"].as_array().map_or(0, Vec::len).to_string(),
            ]
        })
        .collect();
    rows.sort();
    table(&["NAME", "LISTEN", "UPSTREAM", "ENABLED", "TOXICS"], &rows)
}

/// One row per toxic, in the API's order: NAME, TYPE, STREAM, TOXICITY, ATTRIBUTES (KEY=VALUE,
/// by key).
fn toxic_table(toxics: &[Value]) -> String {
    if toxics.is_empty() {
        return "no toxics\n".into();
    }
    let rows: Vec<Vec<String>> = toxics
        .iter()
        .map(|t| {
            let attributes: Vec<String> = t["attributes"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| match v {
                    Value::String(s) => format!("{k}={s}"),
                    other => format!("{k}={other}"),
                })
                .collect();
            vec![
                t["name"].as_str().unwrap_or_default().to_string(),
                t["type"].as_str().unwrap_or_default().to_string(),
                t["stream"].as_str().unwrap_or_default().to_string(),
                t["toxicity"].to_string(),
                attributes.join(" "),
            ]
        })
        .collect();
    table(
        &["TOXIC", "TYPE", "STREAM", "TOXICITY", "ATTRIBUTES"],
        &rows,
    )
}

/// Columns padded to their widest cell, two spaces apart; the last is not padded.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            match i == last {
                true => s.push_str(cell),
                false => s.push_str(&format!("{cell:<w$}  ")),
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![
            vec!["a".to_string(), "1".to_string()],
            vec!["long".to_string(), "2".to_string()],
        ];
        assert_eq!(table(&["N", "V"], &rows), "N     V\na     1\nlong  2\n");
    }
}
