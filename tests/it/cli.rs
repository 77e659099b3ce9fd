//! The real binary: profile commands, clear errors with exit code 2, and a proxy process.

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::util::*;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn profiles_list_shows_every_builtin() {
    let o = faultrig(&["profiles", "list"]);
    assert!(o.status.success());
    for name in [
        "local",
        "lan",
        "lan-wifi",
        "lossy-10ms-1pct",
        "wan",
        "longhaul",
        "bursty",
    ] {
        assert!(
            stdout(&o).lines().any(|l| l.starts_with(name)),
            "{name} missing"
        );
    }
}

#[test]
fn profiles_show_prints_effective_values_that_check_accepts() {
    let o = faultrig(&["profiles", "show", "lossy-10ms-1pct"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for line in [
        "delay = \"10ms\"",
        "loss = 0.01",
        "rto_min = \"200ms\"",
        "syn_rto = \"1s\"",
        "mss = 1448",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    let dir = tempdir();
    let file = dir.path().join("shown.toml");
    std::fs::write(&file, &text).unwrap();
    let o = faultrig(&["profiles", "check", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("ok (lossy-10ms-1pct)"));
}

#[test]
fn bad_profiles_name_file_line_and_key_and_exit_2() {
    let dir = tempdir();
    let cases = [
        (
            "[link]\ndelay = \"10ms\"\nloss = 1.5\n",
            ":3: key `link.loss`",
            "outside [0, 1]",
        ),
        (
            "[link]\n\ndelay = \"-5ms\"\n",
            ":3: key `link.delay`",
            "negative",
        ),
        (
            "[link]\nrate = \"12parsecs\"\n",
            ":2: key `link.rate`",
            "rate unit",
        ),
        (
            "name = \"x\"\n[upstream]\nlatency = \"5ms\"\n",
            ":3: key `upstream.latency`",
            "unknown field",
        ),
        // Durations the model would overflow multiplying (RTO backoff, Pareto tails).
        (
            "[link]\ndelay = \"300000000000years\"\n",
            ":2: key `link.delay`",
            "longer than",
        ),
        (
            "[link]\njitter = \"2h\"\njitter_distribution = \"pareto\"\n",
            ":2: key `link.jitter`",
            "longer than the 1h",
        ),
        (
            "[link]\nloss = 0.01\n[link.burst]\np = 0.1\nr = 0.2\n",
            ":2: key `link.loss`",
            "give one",
        ),
    ];
    for (i, (src, location, message)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&file, src).unwrap();
        let path = file.to_str().unwrap();
        for args in [
            vec!["profiles", "check", path],
            vec!["proxy", "--upstream", "127.0.0.1:9", "--profile", path],
        ] {
            let o = faultrig(&args);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
            let err = stderr(&o);
            assert_eq!(err.lines().count(), 1, "one message: {err}");
            assert!(err.contains(&format!("{path}{location}")), "{err}");
            assert!(err.contains(message), "{err}");
        }
    }
}

#[test]
fn unknown_profile_name_and_bad_flags_exit_2() {
    let o = faultrig(&["proxy", "--upstream", "127.0.0.1:9", "--profile", "no-such"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("lossy-10ms-1pct"),
        "lists the built-ins"
    );
    let o = faultrig(&["proxy", "--upstream", "127.0.0.1:9", "--listen", "nowhere"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--listen"));
}

/// `faultrig proxy` as its own process: prints the bound address, forwards, stops on SIGTERM.
#[test]
fn proxy_process_forwards_and_stops_on_sigterm() {
    let echo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let echo_addr = echo.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in echo.incoming() {
            let mut s = s.unwrap();
            let mut r = s.try_clone().unwrap();
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut r, &mut s);
            });
        }
    });
    let echo_addr = echo_addr.to_string();
    let mut proxy = Listening::start(&["proxy", "--upstream", &echo_addr, "--profile", "lan"]);
    let addr = proxy.addr.clone();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let mut c = TcpStream::connect(&addr).unwrap();
    c.write_all(b"hello through a process").unwrap();
    let mut got = [0u8; 23];
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello through a process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(proxy.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = proxy.child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// The columns of the README's "Results CSV", verbatim.
const README_HEADER: &str = "run_id,started_at,host,round,profile,flavour,mode,workload,payload_bytes,concurrency,calls,ok,failed,err_connect,err_timeout,err_reset,err_protocol,err_other,elapsed_ms,throughput_rps,lat_min_us,lat_mean_us,lat_p50_us,lat_p90_us,lat_p99_us,lat_p999_us,lat_max_us,conns_opened,req_bytes,resp_bytes,bytes_up,bytes_down,stalls_up,stalls_down,server_cpu_ms,server_rss_kb,seed,hdr,engine,nodelay,write_pattern";

#[test]
fn bench_writes_design_columns_and_rows_merge() {
    let server = Listening::start(&["serve", "--flavour", "tcp-binary"]);
    let dir = tempdir();
    let csv = dir.path().join("bench.csv");
    for concurrency in ["1", "4"] {
        let o = faultrig(&[
            "bench",
            "--flavour",
            "tcp-binary",
            "--target",
            &server.addr,
            "--mode",
            "pool:2",
            "--workload",
            "blob:1KiB",
            "--concurrency",
            concurrency,
            "--calls",
            "50",
            "--csv",
            csv.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stdout(&o).contains("50 calls"), "{}", stdout(&o));
    }
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().next().unwrap(), README_HEADER);
    let rows = faultrig::results::read(&csv).unwrap();
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert_eq!((row.calls, row.ok, row.conns_opened), (50, 50, 2));
        assert_eq!(row.profile, None, "the bench cannot know the profile");
        assert_eq!(row.stalls_up, None, "nor the proxy's counters");
        assert!(row.req_bytes.unwrap() > 1024);
        assert_eq!(
            (row.nodelay, row.write_pattern.as_deref()),
            (Some(true), Some("one")),
            "the socket options it used"
        );
    }
    let mut merged = rows[0].histogram().unwrap();
    merged.add(rows[1].histogram().unwrap()).unwrap();
    assert_eq!(merged.len(), 100);
}

#[test]
fn a_down_target_is_data_not_an_error() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dir = tempdir();
    let csv = dir.path().join("down.csv");
    let o = faultrig(&[
        "bench",
        "--flavour",
        "grpc",
        "--target",
        &dead.to_string(),
        "--calls",
        "5",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = faultrig::results::read(&csv).unwrap();
    assert_eq!((rows[0].calls, rows[0].err_connect, rows[0].ok), (5, 5, 0));
    assert_eq!(
        rows[0].lat_p50_us, None,
        "no latency without a successful call"
    );
}

/// Bad flags, numbers out of range included, are one message naming the flag, and exit 2:
/// never a panic, and never a run that starts.
/// `serve --listen-stdin` serves the listening socket it is given (how `run --engine link`
/// hands a server a socket made in another namespace), and refuses anything else; `bench`
/// records the socket options it dialled with.
#[test]
fn serve_takes_its_listener_on_stdin_and_bench_its_socket_options() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_faultrig"));
    command
        .args([
            "serve",
            "--flavour",
            "thrift",
            "--listen-stdin",
            "--nodelay",
            "false",
        ])
        .stdin(std::os::fd::OwnedFd::from(listener));
    let server = Listening::spawn(command);
    assert_eq!(server.addr, addr, "it announces the socket it was given");
    let dir = tempdir();
    let csv = dir.path().join("bench.csv");
    let o = faultrig(&[
        "bench",
        "--flavour",
        "thrift",
        "--target",
        &addr,
        "--calls",
        "20",
        "--nodelay",
        "false",
        "--write-pattern",
        "split",
        "--congestion-control",
        "reno",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = faultrig::results::read(&csv).unwrap();
    assert_eq!((rows[0].ok, rows[0].failed), (20, 0));
    assert_eq!(
        (rows[0].nodelay, rows[0].write_pattern.as_deref()),
        (Some(false), Some("split"))
    );

    // Standard input that is not a listening socket: one message, exit 2.
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_faultrig"));
    command.args(["serve", "--flavour", "grpc", "--listen-stdin"]);
    // (output_within gives it /dev/null as standard input.)
    let o = output_within(command, COMMAND_DEADLINE);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("--listen-stdin"), "{}", stderr(&o));
}

#[test]
fn bad_bench_and_serve_flags_name_the_flag_and_exit_2() {
    let bench = |extra: &[&'static str]| {
        let mut args = vec!["bench", "--flavour", "grpc", "--target", "127.0.0.1:1"];
        args.extend(extra);
        args
    };
    for (args, says) in [
        (
            vec![
                "bench",
                "--flavour",
                "soap",
                "--target",
                "127.0.0.1:1",
                "--calls",
                "1",
            ],
            "--flavour",
        ),
        (
            vec![
                "bench",
                "--flavour",
                "grpc",
                "--target",
                "nowhere",
                "--calls",
                "1",
            ],
            "--target",
        ),
        (bench(&["--calls", "0"]), "--calls"),
        (
            vec!["serve", "--flavour", "grpc", "--max-connections", "0"],
            "--max-connections",
        ),
        (
            vec![
                "proxy",
                "--upstream",
                "127.0.0.1:1",
                "--max-connections",
                "x",
            ],
            "--max-connections",
        ),
        (bench(&["--calls", "1000000000001"]), "--calls"),
        (bench(&[]), "--calls"),
        (bench(&["--calls", "1", "--mode", "pool:0"]), "--mode"),
        (
            bench(&["--calls", "1", "--write-pattern", "both"]),
            "--write-pattern",
        ),
        (bench(&["--calls", "1", "--nodelay", "maybe"]), "--nodelay"),
        (
            bench(&["--calls", "1", "--congestion-control", "vegas"]),
            "--congestion-control",
        ),
        (
            bench(&["--calls", "1", "--mode", "pool:10000000000000000000"]),
            "--mode",
        ),
        (
            bench(&["--calls", "1", "--concurrency", "100001"]),
            "--concurrency",
        ),
        (bench(&["--calls", "1", "--rate", "1e-20"]), "--rate"),
        (bench(&["--calls", "1", "--rate", "inf"]), "--rate"),
        (bench(&["--duration", "500000000000years"]), "--duration"),
        (bench(&["--calls", "1", "--warmup", "2years"]), "--warmup"),
        (bench(&["--calls", "1", "--timeout", "0s"]), "--timeout"),
        (
            bench(&["--calls", "1", "--workload", "blob:1GiB"]),
            "--workload",
        ),
        (
            bench(&["--calls", "1", "--csv", "/nonexistent/x.csv"]),
            "--csv",
        ),
        (
            vec!["serve", "--flavour", "grpc", "--backend", "carrier-pigeon"],
            "--backend",
        ),
        (
            vec![
                "proxy",
                "--upstream",
                "127.0.0.1:9",
                "--window",
                "4 parsecs",
            ],
            "--window",
        ),
        (
            vec![
                "proxy",
                "--upstream",
                "127.0.0.1:9",
                "--window",
                "99999999999999999999",
            ],
            "--window",
        ),
        (
            vec![
                "proxy",
                "--upstream",
                "127.0.0.1:9",
                "--connect-timeout",
                "2years",
            ],
            "--connect-timeout",
        ),
    ] {
        let o = faultrig(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?} should name {says}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// Two bench runs appended to one CSV are two rounds, not two hosts at once: the report
/// averages their calls/s instead of adding them up.
#[test]
fn two_runs_appended_to_one_csv_are_not_added_up() {
    let server = Listening::start(&["serve", "--flavour", "tcp-binary"]);
    let dir = tempdir();
    let csv = dir.path().join("twice.csv");
    for _ in 0..2 {
        let o = faultrig(&[
            "bench",
            "--flavour",
            "tcp-binary",
            "--target",
            &server.addr,
            "--calls",
            "200",
            "--csv",
            csv.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let rows = faultrig::results::read(&csv).unwrap();
    let rate = |r: &faultrig::results::Row| r.calls as f64 / (r.elapsed_ms.max(1) as f64 / 1e3);
    let mean = (rate(&rows[0]) + rate(&rows[1])) / 2.0;
    let table =
        faultrig::report::Table::build(&rows, faultrig::report::RoundSummary::Mean).unwrap();
    let cell = &table.cells[&(0, 0)];
    assert!(
        (cell.calls_per_sec - mean).abs() < 1e-6,
        "{} calls/s, expected the mean {mean}",
        cell.calls_per_sec
    );
}

/// scripts/bench-load.sh stops the servers it started, with stand-ins for wrk, h2load and
/// taskset (so it needs neither the tools nor two cores): no process carrying its mark is left.
#[test]
fn bench_load_script_leaves_no_server_behind() {
    use std::os::unix::fs::PermissionsExt;
    let stubs = tempdir();
    for (name, body) in [
        ("wrk", "echo 'Requests/sec: 1000'"),
        ("h2load", "echo 'finished in 1.00s, 1000.00 req/s, 1MB/s'"),
        (
            "oha",
            r#"echo '{"summary": {"requestsPerSec": 1000.0}, "statusCodeDistribution": {"200": 1000}}'"#,
        ),
        ("taskset", "shift 2\nexec \"$@\""),
    ] {
        let path = stubs.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mark = format!("FAULTRIG_TEST_MARK={}", std::process::id());
    let (key, value) = mark.split_once('=').unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench-load.sh");
    let path = format!(
        "{}:{}",
        stubs.path().display(),
        std::env::var("PATH").unwrap()
    );
    let mut command = std::process::Command::new(script);
    command
        .args([
            "1",
            "--rounds",
            "1",
            "--bin",
            env!("CARGO_BIN_EXE_faultrig"),
        ])
        .env("PATH", path)
        .env(key, value);
    let o = output_within(command, COMMAND_DEADLINE);
    let stdout = succeeded(&o);
    assert!(stdout.contains("tcp-binary, one connection"), "{stdout}");
    let marked: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == mark.as_bytes()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
        .collect();
    assert!(marked.is_empty(), "left running: {marked:?}");
}
