//! Runs across hosts, on loopback: an experiment whose servers and fault proxy are "remote"
//! (`faultrig serve` and `faultrig proxy --api` processes the runner only talks to), hosts
//! that are unreachable or die, several load hosts' CSVs merged by `faultrig report`, and the
//! three-namespace script when the tests run as root.

use std::time::{Duration, Instant};

use faultrig::api::client::Client;
use faultrig::api::wire::ProxyJson;
use faultrig::report::{RoundSummary, Table};
use faultrig::results::Row;

use crate::util::*;

/// `faultrig serve` of each flavour, and the `[remote]` table naming them and `api`.
fn servers(flavours: &[&str]) -> Vec<Listening> {
    flavours
        .iter()
        .map(|f| Listening::start(&["serve", "--flavour", f, "--listen", "127.0.0.1:0"]))
        .collect()
}

fn remote_table(api: &str, flavours: &[&str], servers: &[Listening]) -> String {
    let mut t = format!("[remote]\napi = \"{api}\"\n[remote.servers]\n");
    for (f, s) in flavours.iter().zip(servers) {
        t += &format!("\"{f}\" = \"{}\"\n", s.addr);
    }
    t
}

/// The proxies the API at `api` holds.
fn proxies(api: &str) -> std::collections::BTreeMap<String, ProxyJson> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(Client::new(api).proxies()).unwrap()
}

#[test]
fn a_remote_run_drives_the_proxy_host_through_its_api() {
    let flavours = ["grpc", "thrift"];
    let servers = servers(&flavours);
    let api = Listening::start(&["proxy", "--api", "127.0.0.1:0", "--seed", "3"]);
    // A profile file the proxy host does not have: it travels as text.
    let scratch = tempdir();
    let slow = scratch.path().join("slow.toml");
    std::fs::write(&slow, "name = \"slow\"\n[link]\ndelay = \"4ms\"\n").unwrap();
    let experiment = format!(
        "name = \"remote\"\nprofiles = [\"local\", \"{}\", \"lossy-10ms-1pct\"]\n\
         flavours = [\"grpc\", \"thrift\"]\nmodes = [\"single\", \"per-call\"]\ncalls = 60\n\
         rounds = 1\n{}",
        slow.display(),
        remote_table(&api.addr, &flavours, &servers)
    );
    let run = run_experiment(&experiment, &["--host", "load-1"]);
    assert_eq!(run.rows.len(), 3 * 2 * 2, "{}", run.stdout);
    for r in &run.rows {
        let what = format!("{:?} {} {}", r.profile, r.flavour, r.mode);
        assert_eq!(r.host, "load-1");
        assert_eq!(r.failed, 0, "{what}");
        assert!(
            r.bytes_up.unwrap() > 0 && r.bytes_down.unwrap() > 0,
            "{what}"
        );
        assert_eq!(
            r.server_cpu_ms, None,
            "a remote server's CPU is not ours to read"
        );
        let p50 = r.histogram().unwrap().value_at_quantile(0.5);
        match r.profile.as_deref().unwrap() {
            "local" => assert!(p50 < 4_000, "{what}: p50 {p50} µs"),
            // 4 ms each way: every call takes at least one 8 ms round trip.
            "slow" => assert!(p50 >= 8_000, "{what}: p50 {p50} µs"),
            _ => assert!(p50 >= 20_000, "{what}: p50 {p50} µs"),
        }
    }
    let lossy_stalls: u64 = run
        .rows
        .iter()
        .filter(|r| r.profile.as_deref() == Some("lossy-10ms-1pct"))
        .map(|r| r.stalls_up.unwrap() + r.stalls_down.unwrap())
        .sum();
    assert!(lossy_stalls > 0, "the proxy host's stalls reach the CSV");
    let clean_stalls: u64 = run
        .rows
        .iter()
        .filter(|r| r.profile.as_deref() != Some("lossy-10ms-1pct"))
        .map(|r| r.stalls_up.unwrap() + r.stalls_down.unwrap())
        .sum();
    assert_eq!(clean_stalls, 0);
    // The run removed its proxies from the proxy host.
    assert!(proxies(&api.addr).is_empty());
}

/// `faultrig run` of `experiment` expected to fail: its exit code, stderr, and how long it took.
fn failing_run(experiment: &str) -> (i32, String, Duration) {
    let start = Instant::now();
    let ran = run_experiment_file(experiment, &[]);
    let took = start.elapsed();
    let o = &ran.output;
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    // Nothing was measured: no row in any CSV.
    for dir in std::fs::read_dir(&ran.out).into_iter().flatten().flatten() {
        let rows = faultrig::results::read(&dir.path().join("results.csv")).unwrap_or_default();
        assert!(rows.is_empty(), "{stderr}");
    }
    (o.status.code().unwrap_or(-1), stderr, took)
}

#[test]
fn unreachable_hosts_fail_the_run_before_any_cell_naming_the_address() {
    let axes = "profiles = [\"lan\"]\nflavours = [\"grpc\"]\nmodes = [\"single\"]\ncalls = 5\n";
    let held = dead_addr();
    let dead = held.addr.to_string();

    let server = servers(&["grpc"]);
    let no_api = format!(
        "{axes}[remote]\napi = \"{dead}\"\n[remote.servers]\ngrpc = \"{}\"\n",
        server[0].addr
    );
    let (code, stderr, took) = failing_run(&no_api);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&dead) && stderr.contains("faultrig proxy --api"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");

    let api = Listening::start(&["proxy", "--api", "127.0.0.1:0"]);
    let no_server = format!(
        "{axes}[remote]\napi = \"{}\"\n[remote.servers]\ngrpc = \"{dead}\"\n",
        api.addr
    );
    let (code, stderr, took) = failing_run(&no_server);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "grpc server at {dead} is unreachable from the proxy host"
        )),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn a_server_dying_mid_run_costs_only_its_cells() {
    let flavours = ["grpc", "tcp-binary"];
    let mut servers = servers(&flavours);
    let api = Listening::start(&["proxy", "--api", "127.0.0.1:0"]);
    let scratch = tempdir();
    let file = scratch.path().join("e.toml");
    // Cells in order: local grpc, local tcp-binary, lan grpc, lan tcp-binary; then round 2.
    std::fs::write(
        &file,
        format!(
            "profiles = [\"local\", \"lan\"]\nflavours = [\"grpc\", \"tcp-binary\"]\n\
             modes = [\"single\"]\nduration = \"600ms\"\nrounds = 2\ntimeout = \"5s\"\n{}",
            remote_table(&api.addr, &flavours, &servers)
        ),
    )
    .unwrap();
    let out = scratch.path().join("out");
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_faultrig"))
        .args([
            "run",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // When the first row (local grpc) is written, the tcp-binary server dies.
    let deadline = Instant::now() + Duration::from_secs(60);
    let csv = loop {
        assert!(Instant::now() < deadline, "no row within a minute");
        let csv = std::fs::read_dir(&out)
            .into_iter()
            .flatten()
            .flatten()
            .map(|d| d.path().join("results.csv"))
            .next();
        if let Some(csv) = csv {
            if !faultrig::results::read(&csv).unwrap_or_default().is_empty() {
                break csv;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    servers[1].child.kill().unwrap();
    let status = run.wait().unwrap();
    assert!(status.success(), "the run finishes");
    let rows = faultrig::results::read(&csv).unwrap();
    assert_eq!(rows.len(), 8);
    for r in &rows {
        let what = format!("round {} {:?} {}", r.round, r.profile, r.flavour);
        if r.flavour == "grpc" {
            assert!(r.failed == 0 && r.ok > 0, "{what}: {} failed", r.failed);
        } else if r.round == 2 || r.profile.as_deref() == Some("lan") {
            assert!(
                r.ok == 0 && r.failed > 0,
                "{what}: {} ok, {} failed",
                r.ok,
                r.failed
            );
        }
    }
}

/// Two load hosts at once against one server: their CSVs merge in `faultrig report` exactly —
/// counts summed, histograms merged, calls/s added up, since their measured times overlap (each
/// runs for seconds, and both start together).
#[test]
fn bench_csvs_of_several_load_hosts_merge_into_one_report() {
    let server = Listening::start(&[
        "serve",
        "--flavour",
        "tcp-binary",
        "--listen",
        "127.0.0.1:0",
    ]);
    let scratch = tempdir();
    let csv = |host: &str| scratch.path().join(format!("{host}.csv"));
    let bench = |host: &str, duration: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_faultrig"))
            .args(["bench", "--flavour", "tcp-binary", "--target", &server.addr])
            .args([
                "--mode",
                "per-worker",
                "--concurrency",
                "2",
                "--duration",
                duration,
            ])
            .args(["--host", host, "--profile-label", "direct", "--csv"])
            .arg(csv(host))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (bench("load-a", "2s"), bench("load-b", "3s"));
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success());

    let mut rows: Vec<Row> = faultrig::results::read(&csv("load-a")).unwrap();
    rows.extend(faultrig::results::read(&csv("load-b")).unwrap());
    assert_eq!(rows.len(), 2);
    let table = Table::build(&rows, RoundSummary::Mean).unwrap();
    assert_eq!(table.hosts, ["load-a", "load-b"]);
    assert_eq!(
        (table.rows.len(), table.profiles.as_slice()),
        (1, &["direct".to_string()][..])
    );
    let cell = &table.cells[&(0, 0)];
    let calls = rows[0].calls + rows[1].calls;
    assert_eq!(
        (cell.calls, cell.failed, cell.rows, cell.rounds),
        (calls, 0, 2, 1)
    );
    let mut merged = rows[0].histogram().unwrap();
    merged.add(rows[1].histogram().unwrap()).unwrap();
    assert_eq!(cell.latency.len(), calls);
    for q in [0.5, 0.9, 0.99, 1.0] {
        assert_eq!(
            cell.latency.value_at_quantile(q),
            merged.value_at_quantile(q)
        );
    }
    let rate = |r: &Row| r.calls as f64 / (r.elapsed_ms.max(1) as f64 / 1e3);
    assert!((cell.calls_per_sec - (rate(&rows[0]) + rate(&rows[1]))).abs() < 1e-6);

    let o = faultrig(&[
        "report",
        csv("load-a").to_str().unwrap(),
        csv("load-b").to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(
        text.contains("rows of 2 hosts combined: load-a, load-b"),
        "{text}"
    );
    let p99 = faultrig::report::metric::format_ms(merged.value_at_quantile(0.99) as f64 / 1e3);
    let line = text
        .lines()
        .find(|l| l.starts_with("tcp-binary per-worker"))
        .unwrap();
    assert!(
        line.contains(&p99),
        "{line} should show the merged p99 {p99}"
    );
}

/// scripts/lan-netns.sh, short: client, proxy and server in three network namespaces. Needs
/// root for `ip netns` (CI runs as root); elsewhere it is reported as skipped ([`skip`]).
#[test]
fn the_three_namespace_run() {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the effective user.
    if std::fs::metadata("/proc/self").map_or(true, |m| m.uid() != 0) {
        return skip(
            "remote::the_three_namespace_run",
            "network namespaces need root (CI runs this as root)",
        );
    }
    let scratch = tempdir();
    let out = scratch.path().join("out");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/lan-netns.sh");
    let mut command = std::process::Command::new(script);
    command
        .args([
            "--calls",
            "50",
            "--rounds",
            "1",
            "--bin",
            env!("CARGO_BIN_EXE_faultrig"),
        ])
        .arg("--out")
        .arg(&out);
    let o = output_within(command, COMMAND_DEADLINE);
    let stdout = succeeded(&o);
    let (_, rows) = only_run(&out);
    // Every cell: 3 profiles × 5 flavours × 2 modes.
    let mut cells: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            (
                r.profile.clone().unwrap(),
                r.flavour.clone(),
                r.mode.clone(),
            )
        })
        .collect();
    cells.sort();
    cells.dedup();
    assert_eq!((rows.len(), cells.len()), (30, 30), "{stdout}");
    for r in &rows {
        assert!(!r.host.is_empty());
        if r.profile.as_deref() != Some("lossy-10ms-1pct") {
            assert_eq!(r.failed, 0, "{} {} {:?}", r.flavour, r.mode, r.profile);
        }
    }
    let stalls: u64 = rows
        .iter()
        .filter(|r| r.profile.as_deref() == Some("lossy-10ms-1pct"))
        .map(|r| r.stalls_up.unwrap_or(0) + r.stalls_down.unwrap_or(0))
        .sum();
    assert!(stalls > 0, "{stdout}");
    // Torn down: none of the script's namespaces is left.
    let left = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(
        !left
            .lines()
            .any(|l| l.starts_with("fr") && l.contains("-client")),
        "{left}"
    );
}
