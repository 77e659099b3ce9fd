//! External flavours (`[external.NAME]`): the Python echo of scripts/external/ run by
//! `faultrig run` behind the lossy proxy; clients that fail; servers that do not start; bad
//! tables; and no process left behind when a run is stopped.

use crate::util::*;

/// The example flavour's table, its scripts named by absolute path so the test runs anywhere.
fn echo_table(name: &str, client_suffix: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/external");
    format!(
        "[external.{name}]\n\
         serve = \"python3 {dir}/echo_server.py --port {{port}} --nodelay {{nodelay}}\"\n\
         client = \"\"\"{client_suffix}python3 {dir}/echo_client.py --target {{target}} \
         --mode {{mode}} --calls {{calls}} --duration-ms {{duration_ms}} \
         --concurrency {{concurrency}} --workload {{workload}} --timeout-ms {{timeout_ms}} \
         --warmup-ms {{warmup_ms}}\"\"\"\n"
    )
}

/// Runs `experiment` (expected to fail with exit code 1); returns its stdout, stderr, and the
/// run directory's rows and failed-cells.txt.
fn failing_run(experiment: &str) -> (String, String, Vec<faultrig::results::Row>, String) {
    let ran = run_experiment_file(experiment, &[]);
    let o = &ran.output;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    let (dir, rows) = only_run(&ran.out);
    let failed = std::fs::read_to_string(dir.join("failed-cells.txt")).unwrap_or_default();
    (stdout, stderr, rows, failed)
}

/// The example Python flavour through `lossy-10ms-1pct`, single vs per-call, one worker and
/// four: rows with the proxy's bytes and stalls, the client's connection counts, its threads
/// overlapping, and the warm-up left out of every counter.
#[test]
fn a_python_flavour_runs_behind_the_lossy_proxy() {
    let run = run_experiment(
        &format!(
            "profiles = [\"lossy-10ms-1pct\"]\nflavours = [\"echo-py\"]\n\
             modes = [\"single\", \"per-call\"]\nconcurrency = [1, 4]\ncalls = 100\n\
             warmup = \"300ms\"\nseed = 3\n{}",
            echo_table("echo-py", "")
        ),
        &[],
    );
    assert_eq!(run.rows.len(), 4, "{}", run.stdout);
    let row = |mode: &str, concurrency: u32| {
        run.rows
            .iter()
            .find(|r| r.mode == mode && r.concurrency == concurrency)
            .unwrap_or_else(|| panic!("no {mode} {concurrency} row in {:?}", run.rows))
    };
    let mut stalls = 0;
    for r in &run.rows {
        let what = format!("{} {}", r.mode, r.concurrency);
        assert_eq!(r.flavour, "echo-py");
        assert_eq!(r.profile.as_deref(), Some("lossy-10ms-1pct"));
        assert_eq!((r.calls, r.ok, r.failed), (100, 100, 0), "{what}");
        // 100 frames of 4 + 64 bytes each way, the warm-up's (some 15 frames a worker) not
        // among them: the counters were read when the client said `begin`. The proxy counts a
        // frame just after writing it, so on a busy machine the frame at either edge may be
        // counted on the other side of a reading.
        let frames = 100 * 68;
        for (way, bytes) in [("up", r.bytes_up), ("down", r.bytes_down)] {
            let bytes = bytes.expect("proxy bytes");
            assert!(
                bytes.abs_diff(frames) <= 2 * 68,
                "{what}: {bytes} bytes {way}, not {frames}"
            );
        }
        stalls += r.stalls_up.expect("proxy stalls") + r.stalls_down.expect("proxy stalls");
        // 10 ms each way: no call is faster than a round trip.
        assert!(r.lat_min_us.unwrap() >= 20_000, "{what}: {r:?}");
        // The runner cannot see the client's sockets or its server's CPU.
        assert_eq!((r.req_bytes, r.server_cpu_ms), (None, None), "{what}");
        assert!(!r.hdr.is_empty());
    }
    // Some 1 600 segments at 1 % loss: stalls, almost surely (and the seed fixes them).
    assert!(stalls > 0, "{:?}", run.rows);
    // The client's own counts: one connection carried over from the warm-up, or one per call.
    assert_eq!(row("single", 1).conns_opened, 1);
    assert_eq!(row("single", 4).conns_opened, 1);
    assert_eq!(row("per-call", 1).conns_opened, 100);
    assert_eq!(row("per-call", 4).conns_opened, 100);
    // A new connection per call costs a round trip more.
    assert!(row("per-call", 1).lat_p50_us.unwrap() >= 40_000);
    // Four threads with their own connections overlap their calls.
    assert!(
        row("per-call", 4).elapsed_ms * 2 < row("per-call", 1).elapsed_ms,
        "{:?}",
        run.rows
    );
    assert!(run.stdout.contains("echo-py per-call"), "{}", run.stdout);
}

/// A client that exits non-zero and one that prints garbage fail their cells, each with its
/// reason; every other cell (and a client that leaves its connections for the proxy to count)
/// still gets its row and the report; so does README's ten-line client.
#[test]
fn broken_clients_fail_their_cells_and_the_run_goes_on() {
    let dead = dead_addr();
    let experiment = format!(
        "profiles = [\"local\"]\n\
         flavours = [\"echo-py\", \"exits\", \"garbage\", \"quiet\", \"tiny\"]\n\
         modes = [\"single\", \"per-call\"]\ncalls = 5\n{}{}\
         [external.tiny]\nserve = \"python3 {dir}/echo_server.py --port {{port}}\"\n\
         client = \"python3 {dir}/tiny_client.py --target {{target}} --mode {{mode}} --calls {{calls}}\"\n\
         [external.exits]\ntarget = \"{addr}\"\n\
         client = \"sh -c 'echo 100 ok; echo no such framework >&2; exit 3'\"\n\
         [external.garbage]\ntarget = \"{addr}\"\n\
         client = \"sh -c 'echo 100 ok; echo hello world; exec sleep 60'\"\n",
        echo_table("echo-py", ""),
        // The same client, its `conns` line filtered out.
        echo_table("quiet", "sh -c '\\\"$0\\\" \\\"$@\\\" | grep --line-buffered -v ^conns' "),
        addr = dead.addr,
        dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/external"),
    );
    let started = std::time::Instant::now();
    let (stdout, stderr, rows, failed) = failing_run(&experiment);
    // The garbage client was stopped at its garbage, not waited for.
    assert!(started.elapsed() < std::time::Duration::from_secs(50));
    let mut measured: Vec<(String, String, u64)> = rows
        .iter()
        .map(|r| (r.flavour.clone(), r.mode.clone(), r.conns_opened))
        .collect();
    measured.sort();
    assert_eq!(
        measured,
        [
            ("echo-py".into(), "per-call".into(), 5),
            ("echo-py".into(), "single".into(), 1),
            ("quiet".into(), "per-call".into(), 5),
            ("quiet".into(), "single".into(), 1),
            ("tiny".into(), "per-call".into(), 5),
            ("tiny".into(), "single".into(), 1),
        ],
        "{stdout}\n{stderr}"
    );
    assert!(rows.iter().all(|r| (r.calls, r.ok) == (5, 5)), "{rows:?}");
    let lines: Vec<&str> = failed.lines().collect();
    assert_eq!(lines.len(), 4, "{failed}");
    for mode in ["single", "per-call"] {
        let exits = format!("round 1, profile local, flavour exits, mode {mode}, workload order, concurrency 1: external flavour exits: its client exited");
        let line = lines
            .iter()
            .find(|l| l.starts_with(&exits))
            .unwrap_or_else(|| panic!("{exits}\n{failed}"));
        assert!(
            line.contains("no such framework") && line.contains("exit status: 3"),
            "{line}"
        );
        let garbage = format!("round 1, profile local, flavour garbage, mode {mode}");
        let line = lines
            .iter()
            .find(|l| l.starts_with(&garbage))
            .unwrap_or_else(|| panic!("{garbage}\n{failed}"));
        assert!(
            line.contains("stdout line 2 is not in the format") && line.contains("\"hello world\""),
            "{line}"
        );
    }
    // The report, then the failed cells, each with its reason.
    assert!(stdout.contains("quiet per-call"), "{stdout}");
    assert!(
        stderr.contains("4 cell(s) failed and have no row"),
        "{stderr}"
    );
    assert!(
        stderr.contains("flavour garbage, mode per-call"),
        "{stderr}"
    );
}

/// README's ten-line client is the file the test above runs, word for word.
#[test]
fn the_readme_shows_the_tiny_client_that_is_tested() {
    let readme = include_str!("../../README.md");
    let client = include_str!("../../scripts/external/tiny_client.py");
    assert!(readme.contains(&format!("```python\n{client}```\n")));
}

/// A server that exits before it accepts fails the run before any cell, naming the flavour
/// and quoting its standard error; a bad table is refused with exit code 2 before anything
/// starts.
#[test]
fn a_server_that_does_not_start_or_a_bad_table_stops_the_run_early() {
    let axes = "profiles = [\"local\"]\nflavours = [\"dead\"]\nmodes = [\"single\"]\ncalls = 5\n\
                [external.dead]\n";
    let scratch = tempdir();
    let file = scratch.path().join("e.toml");
    let out = scratch.path().join("out");
    let run = |table: &str| {
        std::fs::write(&file, format!("{axes}{table}")).unwrap();
        let o = faultrig(&[
            "run",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, stderr) =
        run("serve = \"sh -c 'echo cannot bind port {port} >&2; exit 4'\"\nclient = \"true\"\n");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("external flavour dead: its server (sh -c")
            && stderr.contains("before accepting on 127.0.0.1:")
            && stderr.contains("its stderr ends: cannot bind port "),
        "{stderr}"
    );
    let (code, stderr) = run("serve = \"srv --port {prot}\"\nclient = \"c {target}\"\n");
    assert_eq!(code, Some(2), "{stderr}");
    let at = format!(
        "{}:6: key `external.dead.serve`: unknown placeholder {{prot}}",
        file.display()
    );
    assert!(stderr.contains(&at), "{stderr}");
}

/// However a run ends — SIGTERM or SIGKILL — an external flavour's server and its running
/// client end with it.
#[test]
fn a_stopped_run_leaves_no_external_process_behind() {
    use nix::sys::signal::Signal;
    let experiment = format!(
        "profiles = [\"local\"]\nflavours = [\"echo-py\"]\nmodes = [\"single\"]\n\
         duration = \"60s\"\n{}",
        echo_table("echo-py", "")
    );
    for signal in [Signal::SIGTERM, Signal::SIGKILL] {
        // The server and the client, each under its supervisor.
        stopping_a_run_leaves_nothing_behind(&experiment, signal, 4);
    }
}
