//! `faultrig calibrate`: the model against the kernel engine, run as CI runs it.
//!
//! The quick suite asserts the model's fidelity (it prints the table that says where it does
//! not hold); the clean-profile run and the flag checks do not depend on the model's fidelity.
//! Everything but the flag checks needs root.

use std::path::Path;

use crate::util::*;

const QUICK_WORKLOADS: [&str; 5] = ["order", "3seg", "16k", "per-call", "bulk"];

/// The (profile, workload, engine) rows of calibrate.csv.
fn csv_rows(dir: &Path) -> Vec<(String, String, String)> {
    let mut r = csv::Reader::from_path(dir.join("calibrate.csv")).expect("calibrate.csv");
    let header = r.headers().unwrap().clone();
    let first: Vec<_> = header.iter().take(3).collect();
    assert_eq!(first, ["profile", "workload", "engine"]);
    assert!(header.iter().any(|h| h == "p99_high"), "{header:?}");
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            (rec[0].to_string(), rec[1].to_string(), rec[2].to_string())
        })
        .collect()
}

fn has(rows: &[(String, String, String)], profile: &str, workload: &str, engine: &str) -> bool {
    rows.iter()
        .any(|(p, w, e)| p == profile && w == workload && e == engine)
}

#[test]
fn quick_suite_model_within_tolerance_of_the_kernel() {
    if !privileged("calibrate::quick_suite_model_within_tolerance_of_the_kernel") {
        return;
    }
    let dir = tempdir();
    let out = faultrig(&[
        "calibrate",
        "--quick",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    // What the run must produce whatever the model's fidelity: every quick workload for both
    // engines and their ratios, and the page.
    let rows = csv_rows(dir.path());
    for w in QUICK_WORKLOADS {
        for e in ["model", "kernel", "ratio"] {
            assert!(
                has(&rows, "lossy-10ms-1pct", w, e),
                "no {w} {e} row: {rows:?}"
            );
        }
    }
    let html = std::fs::read_to_string(dir.path().join("calibrate.html")).expect("html");
    assert_eq!(
        html.matches("<svg").count(),
        QUICK_WORKLOADS.len(),
        "one CDF plot each"
    );
    // The model's fidelity: exit 1 names the workloads out of tolerance in the table above.
    // One miss is known and explained (README, "Engines"): after a loss the kernel's window
    // climbs back from two segments faster than the model's, so a 3-segment reply takes a
    // second round trip after a loss more often in the model, and its p90 — which falls in the
    // gap between the one- and two-round-trip modes — may land on the far side. Any other cell
    // out of tolerance fails the test.
    let out_cells: Vec<&str> = stdout.lines().filter(|l| l.contains("| OUT")).collect();
    let known = |l: &&str| l.starts_with("3seg ") && l.trim_end().ends_with("OUT p90");
    if out.status.code() == Some(1) && !out_cells.is_empty() && out_cells.iter().all(known) {
        println!("KNOWN MISS: 3seg p90 out of tolerance (see README, \"Engines\")");
        return;
    }
    assert_eq!(
        out.status.code(),
        Some(0),
        "the model is out of tolerance (see the table):\n{stdout}\n{stderr}"
    );
}

#[test]
fn one_segment_calls_on_a_clean_path_agree() {
    if !privileged("calibrate::one_segment_calls_on_a_clean_path_agree") {
        return;
    }
    let dir = tempdir();
    let out = faultrig(&[
        "calibrate",
        "--workloads",
        "order",
        "--calls",
        "200",
        "--profiles",
        "clean-10ms",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    let stdout = succeeded(&out);
    assert!(stdout.contains("clean-10ms"), "{stdout}");
    let order = stdout
        .lines()
        .find(|l| l.starts_with("order"))
        .unwrap_or_else(|| panic!("no order row: {stdout}"));
    assert!(order.ends_with("| ok"), "{order}");
    let rows = csv_rows(dir.path());
    assert_eq!(rows.len(), 3, "model, kernel and ratio rows: {rows:?}");
}

#[test]
fn bad_input_is_one_message_and_exit_2() {
    let dir = tempdir();
    let out_dir = dir.path().to_str().unwrap();
    for (args, names) in [
        (vec!["--workloads", "order,nope"], "nope"),
        (vec!["--calls", "0"], "--calls"),
        (vec!["--connections", "0"], "--connections"),
        (vec!["--profiles", "no-such-profile"], "--profiles"),
    ] {
        let mut all = vec!["calibrate", "--out", out_dir];
        all.extend(&args);
        let out = faultrig(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(names), "{args:?}: {stderr}");
        assert!(
            !dir.path().join("calibrate.csv").exists(),
            "{args:?} wrote results"
        );
    }

    // Without the privilege: the kernel engine's own message, exit 2, nothing written.
    refused_without_the_privilege(&["calibrate", "--quick", "--out", out_dir]);
    assert!(!dir.path().join("calibrate.csv").exists());
}
