//! `faultrig run` end to end on a tiny experiment, and `faultrig report` over its CSV.

use crate::util::*;

#[test]
fn a_tiny_experiment_runs_end_to_end() {
    let run = run_experiment(
        "name = \"tiny\"\nprofiles = [\"local\", \"lan\"]\nflavours = [\"grpc\", \"tcp-binary\"]\n\
         modes = [\"single\", \"per-call\"]\ncalls = 5\nrounds = 2\nseed = 7\n",
        &[],
    );
    let (rows, stdout, run_dir) = (&run.rows, &run.stdout, &run.dir);
    let csv = run_dir.join("results.csv");
    let dir = tempdir();
    assert_eq!(
        rows.len(),
        2 * 2 * 2 * 2,
        "profiles × flavours × modes × rounds"
    );
    for r in rows {
        assert_eq!((r.calls, r.ok), (5, 5), "{r:?}");
        assert!(r.bytes_up.unwrap() > 0 && r.bytes_down.unwrap() > 0);
        assert_eq!(r.stalls_up, Some(0));
        assert!(r.server_rss_kb.unwrap() > 0);
        assert!(r.server_cpu_ms.is_some());
        assert_eq!(r.seed, 7);
        let expected_conns = if r.mode == "per-call" { 5 } else { 1 };
        assert_eq!(r.conns_opened, expected_conns);
    }
    for line in [
        "grpc single",
        "grpc per-call",
        "tcp-binary single",
        "local",
        "lan",
    ] {
        assert!(stdout.contains(line), "table lacks {line}:\n{stdout}");
    }
    // The run's HTML report: tables and plots, self-contained.
    let page = std::fs::read_to_string(run_dir.join("report.html")).unwrap();
    assert!(
        page.contains("<table") && page.contains("Latency CDF: lan"),
        "tables and CDFs"
    );
    assert_eq!(
        page.matches("<svg").count(),
        4,
        "a CDF and a p50/p99 bar panel per profile"
    );
    assert!(
        page.contains("polyline") || page.contains("<path"),
        "the CDFs have lines"
    );
    assert!(
        !page.contains("src=\"http") && !page.contains("href=\"http"),
        "nothing fetched"
    );
    // The report of the CSV merges both rounds into each cell.
    let html = dir.path().join("again.html");
    let o = faultrig(&[
        "report",
        csv.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    assert!(std::fs::read_to_string(&html).unwrap().contains("<svg"));
    let table = faultrig::report::Table::build(rows, faultrig::report::RoundSummary::Mean).unwrap();
    assert!(table
        .cells
        .values()
        .all(|c| c.rows == 2 && c.latency.len() == 10));
}

/// The shipped payload sweep, shrunk by flags: warm-up, fixed duration, three rounds, and a
/// report of the median round.
#[test]
fn the_payload_sweep_reports_its_median_round() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/payload-sweep.toml");
    let run = run_experiment(
        &std::fs::read_to_string(file).unwrap(),
        &[
            "--profiles",
            "local",
            "--flavours",
            "tcp-binary",
            "--concurrency",
            "4",
            "--duration",
            "200ms",
            "--warmup",
            "50ms",
        ],
    );
    assert_eq!(run.rows.len(), 4 * 3, "four payloads, three rounds");
    for r in &run.rows {
        assert!(r.ok > 0 && r.failed == 0, "{r:?}");
        assert!(r.elapsed_ms >= 200, "ran for the duration: {r:?}");
    }
    let sizes: Vec<u64> = run.rows[..4].iter().map(|r| r.payload_bytes).collect();
    assert!(sizes.windows(2).all(|w| w[0] < w[1]) && sizes[3] > 1 << 20);
    assert!(run.stdout.contains("median round"), "{}", run.stdout);
    assert!(run.stdout.contains("tcp-binary single blob:1MiB c=4"));
}

#[test]
fn a_bad_experiment_fails_before_any_traffic() {
    let dir = tempdir();
    let exp = dir.path().join("bad.toml");
    let path = exp.to_str().unwrap();
    for (body, flags, says) in [
        (
            "profiles = [\"local\"]\nflavours = [\"soap\"]\nmodes = [\"single\"]\ncalls = 5\n",
            &[][..],
            format!("{path}:2: key `flavours`: unknown flavour"),
        ),
        (
            "profiles = [\"mars\"]\nflavours = [\"grpc\"]\nmodes = [\"single\"]\ncalls = 5\n",
            &[],
            format!("{path}:1: key `profiles`: mars"),
        ),
        (
            "profiles = [\"local\"]\nflavours = [\"grpc\"]\nmodes = [\"single\"]\ncalls = 0\n",
            &[],
            format!("{path}:4: key `calls`: must be"),
        ),
        (
            "profiles = [\"local\"]\nflavours = [\"grpc\"]\nmodes = [\"pool:99999999\"]\n\
             calls = 5\n",
            &[],
            format!("{path}:3: key `modes`: bad pool size"),
        ),
        (
            "profiles = [\"local\"]\nflavours = [\"grpc\"]\nmodes = [\"single\"]\ncalls = 5\n",
            &["--rounds", "0"],
            "--rounds: must be".to_string(),
        ),
    ] {
        std::fs::write(&exp, body).unwrap();
        let out = dir.path().join("out");
        let mut args = vec!["run", path, "--out", out.to_str().unwrap()];
        args.extend(flags);
        let o = faultrig(&args);
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.starts_with(&format!("error: {says}")), "{err}");
        assert!(!out.exists(), "nothing written before validation passed");
    }
}

/// The proxy and server columns cover the calls of the row, not the warm-up before them: the
/// bytes the proxy carried upstream are the bytes the client wrote in the measured phase.
#[test]
fn proxy_columns_leave_out_the_warmup() {
    let run = run_experiment(
        "profiles = [\"lan\"]\nflavours = [\"tcp-binary\"]\nmodes = [\"single\"]\ncalls = 20\n\
         warmup = \"300ms\"\n",
        &[],
    );
    for r in &run.rows {
        // req_bytes is rounded up per call, so calls × req_bytes is at least what was written.
        let written = r.calls * r.req_bytes.unwrap();
        let carried = r.bytes_up.unwrap();
        assert!(
            carried <= written,
            "the proxy carried {carried} bytes upstream for {} calls of {} bytes",
            r.calls,
            r.req_bytes.unwrap()
        );
        assert!(carried > 0);
    }
}

/// However `faultrig run` ends — SIGTERM (handled like Ctrl-C) or SIGKILL (no clean-up code
/// runs) — its servers and its private redis-server end with it.
#[test]
fn a_run_that_is_stopped_leaves_no_process_behind() {
    use nix::sys::signal::Signal;
    // Two flavours (two servers, plus their deduct@redis twins) and a redis-server, busy for a
    // minute per cell, so the run is mid-cell when it is stopped.
    let experiment = "profiles = [\"local\"]\nflavours = [\"grpc\", \"tcp-binary\"]\n\
                      modes = [\"single\"]\nworkloads = [\"deduct\", \"deduct@redis\"]\n\
                      duration = \"60s\"\n";
    for signal in [Signal::SIGTERM, Signal::SIGKILL] {
        // Four servers and redis-server (under its supervisor): six processes at least.
        stopping_a_run_leaves_nothing_behind(experiment, signal, 6);
    }
}
