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

/// Ratio cells whose whole bootstrap 95 % interval lies outside the tolerance band, as
/// (workload, statistic, description). Point misses inside the noise are printed only.
fn significant_misses(dir: &Path) -> Vec<(String, &'static str, String)> {
    let mut r = csv::Reader::from_path(dir.join("calibrate.csv")).unwrap();
    let header = r.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let mut significant = Vec::new();
    for rec in r.records().map(Result::unwrap) {
        if &rec[2] != "ratio" {
            continue;
        }
        // The bulk flow is judged on its mean rate alone.
        let stats: &[(&'static str, f64)] = if &rec[1] == "bulk" {
            &[("mean", 0.10)]
        } else {
            &[("mean", 0.10), ("p50", 0.10), ("p90", 0.15), ("p99", 0.15)]
        };
        for &(stat, tol) in stats {
            let num = |c: String| rec[col(&c)].parse::<f64>().unwrap_or(f64::NAN);
            let (point, low, high) = (
                num(stat.to_string()),
                num(format!("{stat}_low")),
                num(format!("{stat}_high")),
            );
            if (point - 1.0).abs() > tol {
                println!(
                    "{} {stat}: ratio {point:.2} out of tolerance, interval {low:.2}-{high:.2}",
                    &rec[1]
                );
            }
            if !(low <= 1.0 + tol && high >= 1.0 - tol) {
                significant.push((
                    rec[1].to_string(),
                    stat,
                    format!("{} {stat} {point:.2} [{low:.2}-{high:.2}]", &rec[1]),
                ));
            }
        }
    }
    significant
}

/// Runs `calibrate` with `args` (on `workloads`, or all those `args` name) into `dir`; its
/// stdout.
fn calibrate(args: &[&str], dir: &Path, workloads: Option<&str>) -> String {
    let mut all = vec!["calibrate", "--out", dir.to_str().unwrap()];
    all.extend(args);
    if let Some(w) = workloads {
        all.extend(["--workloads", w]);
    }
    let out = faultrig(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}");
    // Exit 1 is a verdict (a cell out of tolerance), judged by `assert_fidelity`; anything else
    // is a failure.
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "calibrate failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The model's fidelity in the run `calibrate(args, dir, None)` printed as `stdout`.
///
/// The run's own verdict (and exit code) uses the point ratios; on a shared machine a tail
/// quantile moves by more than the tolerance from run to run (a p90 that falls in the gap
/// between one- and two-round-trip calls, a 4-second bulk flow, a p99 of 200 calls that is their
/// second-slowest, which one late wake-up of either engine decides). A cell fails when it is out
/// of tolerance beyond sampling noise (its whole bootstrap 95 % interval lies outside the band)
/// in this run and again when its workload is run a second time: a model defect repeats, a busy
/// moment of the machine does not.
fn assert_fidelity(args: &[&str], dir: &Path, stdout: &str) {
    let first = significant_misses(dir);
    if first.is_empty() {
        return;
    }
    let mut workloads: Vec<&str> = first.iter().map(|(w, _, _)| w.as_str()).collect();
    workloads.dedup();
    println!("significant misses {first:?}; running {workloads:?} again");
    let again = tempdir();
    let stdout_again = calibrate(args, again.path(), Some(&workloads.join(",")));
    let second = significant_misses(again.path());
    let repeated: Vec<&String> = first
        .iter()
        .filter(|(w, s, _)| second.iter().any(|(w2, s2, _)| w2 == w && s2 == s))
        .map(|(_, _, d)| d)
        .collect();
    assert!(
        repeated.is_empty(),
        "the model is out of tolerance beyond sampling noise, twice: {repeated:?} \
         (second run: {second:?})\n{stdout}\n{stdout_again}"
    );
}

// Wall-clock latencies of the kernel engine move when other tests load the two cores (a p90 of
// new-connection calls went from 44 to 52 ms while the model's stayed at 41), so this test runs
// alone: scripts/test.sh runs the ignored tests after the rest, one at a time.
#[test]
#[ignore = "timing: runs alone, after the other tests (scripts/test.sh does)"]
fn quick_suite_model_within_tolerance_of_the_kernel() {
    if !privileged("calibrate::quick_suite_model_within_tolerance_of_the_kernel") {
        return;
    }
    let dir = tempdir();
    let stdout = calibrate(&["--quick"], dir.path(), None);
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
    assert_fidelity(&["--quick"], dir.path(), &stdout);
}

// The kernel's tail is wall-clock time too: with the other tests on both cores its p99 of
// one-segment calls went from 20.4 to 28 ms (CI, a460764) while the model's stayed at 21; and
// the model's is as well: alone, on a busy CI machine, it went to 26.2 ms (98deb03) while the
// kernel's stayed at 21, its p50 and p90 agreeing within 3 %.
#[test]
#[ignore = "timing: runs alone, after the other tests (scripts/test.sh does)"]
fn one_segment_calls_on_a_clean_path_agree() {
    if !privileged("calibrate::one_segment_calls_on_a_clean_path_agree") {
        return;
    }
    let dir = tempdir();
    let args = ["--calls", "200", "--profiles", "clean-10ms"];
    let stdout = calibrate(&args, dir.path(), Some("order"));
    assert!(stdout.contains("clean-10ms"), "{stdout}");
    assert!(
        stdout.lines().any(|l| l.starts_with("order")),
        "no order row: {stdout}"
    );
    let rows = csv_rows(dir.path());
    assert_eq!(rows.len(), 3, "model, kernel and ratio rows: {rows:?}");
    assert_fidelity(&args, dir.path(), &stdout);
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
