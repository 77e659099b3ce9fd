//! `faultrig report` and `run` as CI uses them: gates (`--assert`), a baseline comparison and
//! the JSON summary, on CSVs whose answers are known.

use faultrig::results::{new_histogram, ResultsWriter, Row};

use crate::util::*;

/// A row of ten calls at `us` µs each, and `failed` more that failed.
fn row(flavour: &str, mode: &str, profile: &str, us: u64, failed: u64) -> Row {
    let mut h = new_histogram();
    h.record_n(us, 10).unwrap();
    let mut r = Row {
        run_id: "run-1".into(),
        flavour: flavour.into(),
        mode: mode.into(),
        workload: "order".into(),
        concurrency: 1,
        profile: Some(profile.into()),
        calls: 10 + failed,
        ok: 10,
        failed,
        elapsed_ms: (us * 10).div_ceil(1000),
        conns_opened: if mode == "per-call" { 10 } else { 1 },
        ..Row::default()
    };
    r.set_latency(&h);
    r
}

/// On lossy, per-call costs 2.7× (grpc) and 3.2× (tcp-binary) single; tcp-binary per-call had
/// two failed calls.
fn known() -> Vec<Row> {
    vec![
        row("grpc", "single", "local", 1000, 0),
        row("grpc", "per-call", "local", 2000, 0),
        row("tcp-binary", "single", "local", 100, 0),
        row("tcp-binary", "per-call", "local", 200, 0),
        row("grpc", "single", "lossy", 20_000, 0),
        row("grpc", "per-call", "lossy", 54_000, 0),
        row("tcp-binary", "single", "lossy", 20_000, 0),
        row("tcp-binary", "per-call", "lossy", 64_000, 2),
    ]
}

fn write_csv(dir: &std::path::Path, name: &str, rows: &[Row]) -> String {
    let path = dir.join(name);
    let mut w = ResultsWriter::append(&path).unwrap();
    for r in rows {
        w.write(r).unwrap();
    }
    path.to_str().unwrap().to_string()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn report_gates_name_each_cell_that_fails_and_exit_1() {
    let dir = tempdir();
    let csv = write_csv(dir.path(), "r.csv", &known());
    let o = faultrig(&[
        "report",
        &csv,
        "--assert",
        "p99 < 60ms",
        "--assert",
        "failed == 0",
        "--assert",
        "per-call/single < 3",
        "--assert",
        "conns <= 10",
    ]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    let cell = "flavour=tcp-binary mode=per-call workload=order concurrency=1 profile=lossy";
    for line in [
        "assert p99 < 60ms: FAILS in 1 of 8 cells".to_string(),
        format!("  {cell}: p99 = 64.0 ms"),
        "assert failed == 0: FAILS in 1 of 8 cells".to_string(),
        format!("  {cell}: failed = 2"),
        "assert per-call/single < 3: FAILS in 1 of 4 cells".to_string(),
        format!("  {cell}: per-call/single p50 = 3.20×"),
        "assert conns <= 10: holds in all 8 cells".to_string(),
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "no line {line:?} in:\n{stdout}"
        );
    }
    assert!(
        stderr.contains(
            "--assert failed: 'p99 < 60ms' in 1 cell(s), 'failed == 0' in 1 cell(s), \
                         'per-call/single < 3' in 1 cell(s)"
        ),
        "{stderr}"
    );
    // The same gates, met: exit 0.
    let o = faultrig(&[
        "report",
        &csv,
        "--assert",
        "p99 < 65ms",
        "--assert",
        "per-call/single <= 3.2",
    ]);
    let stdout = succeeded(&o);
    assert!(
        stdout.contains("assert p99 < 65ms: holds in all 8 cells"),
        "{stdout}"
    );
}

#[test]
fn a_bad_gate_or_threshold_is_refused_naming_its_flag() {
    let dir = tempdir();
    let csv = write_csv(dir.path(), "r.csv", &known());
    for (args, says) in [
        (vec!["--assert", "p99 < 300"], "'--assert <EXPR>'"),
        (vec!["--assert", "p98 < 3ms"], "unknown metric \"p98\""),
        (
            vec!["--baseline", &csv, "--threshold", "ten"],
            "'--threshold <THRESHOLD>'",
        ),
        (vec!["--threshold", "5%"], "--baseline"),
    ] {
        let mut all = vec!["report", &csv];
        all.extend(&args);
        let o = faultrig(&all);
        let stderr = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    // `run` refuses it too, before any server starts or a run directory is made.
    let out = dir.path().join("out");
    let o = faultrig(&[
        "run",
        "--out",
        out.to_str().unwrap(),
        "--assert",
        "p99 << 3ms",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("--assert"), "{}", text(&o.stderr));
    assert!(!out.exists());
}

#[test]
fn a_baseline_shows_deltas_and_flags_regressions() {
    let dir = tempdir();
    let old = write_csv(dir.path(), "old.csv", &known());
    let mut rows = known();
    rows[0] = row("grpc", "single", "local", 1050, 0); // +5 %: within 10 %
    rows[4] = row("grpc", "single", "lossy", 30_000, 0); // +50 %
    let new = write_csv(dir.path(), "new.csv", &rows);
    let o = faultrig(&["report", &new, "--baseline", &old]);
    let stdout = succeeded(&o);
    assert!(stdout.contains("1 of 8 cells regressed"), "{stdout}");
    let line = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {stdout}"))
            .to_string()
    };
    assert!(line("grpc single @ lossy").contains("!20.0→30.0 (+50%)"));
    assert!(line("grpc single @ local").contains(" 1.00→1.05 (+5%)"));
    // Exit 1 when asked to; a threshold above the rise lets it through.
    let o = faultrig(&["report", &new, "--baseline", &old, "--fail-on-regression"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("1 of 8 cells regressed against the baseline"));
    let o = faultrig(&[
        "report",
        &new,
        "--baseline",
        &old,
        "--threshold",
        "60%",
        "--fail-on-regression",
    ]);
    succeeded(&o);
}

#[test]
fn the_json_summary_has_every_cell_the_findings_and_the_gates() {
    let dir = tempdir();
    let csv = write_csv(dir.path(), "r.csv", &known());
    let o = faultrig(&["report", &csv, "--json", "-", "--assert", "failed == 0"]);
    assert_eq!(o.status.code(), Some(1));
    let stdout = text(&o.stdout);
    let json: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(json["version"], 1);
    assert_eq!(json["rows"], 8);
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 8);
    let cell = cells
        .iter()
        .find(|c| c["name"] == "tcp-binary per-call" && c["profile"] == "lossy")
        .unwrap();
    assert_eq!(cell["failed"], 2);
    assert_eq!(cell["p50_ms"], 64.031);
    assert_eq!(
        cell["over_fastest_p50"]
            .as_f64()
            .map(|r| (r * 100.0).round()),
        Some(119.0)
    );
    assert_eq!(cell["fastest_flavour"], "grpc");
    assert!(
        cell["server_rss_peak_kib"].is_null(),
        "unknown is null, not 0"
    );
    assert_eq!(cell["conns_opened_per_round"], 10.0);
    let findings = json["findings"].as_array().unwrap();
    assert!(findings[1]
        .as_str()
        .unwrap()
        .starts_with("On lossy a new connection per call costs 2.70–3.20×"));
    let failing: Vec<_> = json["assertions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["holds"] == false)
        .collect();
    assert_eq!(failing.len(), 1);
    assert_eq!(failing[0]["row"], "tcp-binary per-call");
    assert_eq!(failing[0]["measured"], 2.0);
    // To a file, with the text table still on standard output.
    let file = dir.path().join("s.json");
    let o = faultrig(&["report", &csv, "--json", file.to_str().unwrap()]);
    assert!(succeeded(&o).starts_with("Findings:\n- On local"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert!(json["baseline"].is_null() && json["assertions"].as_array().unwrap().is_empty());
}

/// `run --assert`: the gates are checked after the report, which is written either way.
#[test]
fn a_run_fails_its_gates_after_writing_its_report() {
    let ran = run_experiment_file(
        "profiles = [\"local\"]\nflavours = [\"tcp-binary\"]\nmodes = [\"single\", \"per-call\"]\n\
         calls = 5\nrounds = 1\n",
        &[
            "--assert",
            "failed == 0",
            "--assert",
            "conns > 1",
            "--assert",
            "per-call/single p99 < 1000",
        ],
    );
    let o = &ran.output;
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("assert failed == 0: holds in all 2 cells"),
        "{stdout}"
    );
    assert!(
        stdout.contains("assert conns > 1: FAILS in 1 of 2 cells"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "  flavour=tcp-binary mode=single workload=order concurrency=1 profile=local: conns \
             = 1 per round"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("assert per-call/single p99 < 1000: holds in all 1 cells"));
    let (dir, rows) = only_run(&ran.out);
    assert_eq!(rows.len(), 2);
    assert!(dir.join("report.html").exists());
}
