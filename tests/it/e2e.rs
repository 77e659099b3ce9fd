//! `faultrig run --engine link`: no proxy, every flavour's own client and server sockets across
//! the link engine between two namespaces; the socket-option axes (nodelay, write_pattern) that
//! only an end-to-end path can show; and nothing left behind however a run ends.
//!
//! Root only (CAP_NET_ADMIN), as CI runs; elsewhere each test reports itself skipped.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use faultrig::results::Row;

use crate::util::*;

fn privileged(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    skip(
        &format!("e2e::{test}"),
        "--engine link needs root (CAP_NET_ADMIN); CI runs as root",
    );
    false
}

fn p50_ms(r: &Row) -> f64 {
    r.lat_p50_us.expect("calls succeeded") as f64 / 1000.0
}

fn row<'a>(rows: &'a [Row], flavour: &str, mode: &str) -> &'a Row {
    rows.iter()
        .find(|r| r.flavour == flavour && r.mode == mode)
        .unwrap_or_else(|| panic!("no {flavour} {mode} row"))
}

/// Every flavour through `lossy-10ms-1pct` (10 ms each way): no call fails; a call on a kept
/// connection costs one round trip (20 ms), and a new connection per call one more (the
/// handshake). The row's path columns come from the link and the kernels.
#[test]
fn every_flavour_runs_end_to_end_over_the_link() {
    if !privileged("every_flavour_runs_end_to_end_over_the_link") {
        return;
    }
    let run = run_experiment(
        "profiles = [\"lossy-10ms-1pct\"]\n\
         flavours = [\"grpc\", \"http1-json\", \"http2-json\", \"tcp-binary\", \"thrift\"]\n\
         modes = [\"single\", \"per-call\"]\ncalls = 20\nwarmup = \"300ms\"\nengine = \"link\"\n",
        &[],
    );
    assert_eq!(run.rows.len(), 10, "{}", run.stdout);
    for r in &run.rows {
        let cell = format!("{} {}", r.flavour, r.mode);
        assert_eq!(r.engine.as_deref(), Some("link"), "{cell}");
        assert_eq!((r.calls, r.failed), (20, 0), "{cell}: every call succeeds");
        assert_eq!(r.nodelay, Some(true), "{cell}");
        assert_eq!(r.write_pattern.as_deref(), Some("one"), "{cell}");
        // The link carried the calls: at least the bytes the client wrote (plus IP headers).
        let up = r.bytes_up.expect("link bytes");
        assert!(
            up >= r.calls * r.req_bytes.unwrap(),
            "{cell}: {up} bytes up"
        );
        assert!(
            r.bytes_down.unwrap() >= r.calls * r.resp_bytes.unwrap(),
            "{cell}"
        );
        // Known (0 is a count here, not a placeholder): 1 % loss may or may not have hit.
        assert!(r.stalls_up.is_some() && r.stalls_down.is_some(), "{cell}");
        assert!(
            r.server_cpu_ms.is_some(),
            "{cell}: the server is a process of its own"
        );
    }
    for flavour in ["grpc", "http1-json", "http2-json", "tcp-binary", "thrift"] {
        let single = row(&run.rows, flavour, "single");
        let per_call = row(&run.rows, flavour, "per-call");
        assert_eq!(single.conns_opened, 1, "{flavour} single");
        assert_eq!(per_call.conns_opened, 20, "{flavour} per-call");
        let (one, two) = (p50_ms(single), p50_ms(per_call));
        // One RTT is 20 ms; loss moves a few calls, not the median. Above: room for a busy
        // machine's scheduling, far below a second round trip.
        assert!(
            (19.0..32.0).contains(&one),
            "{flavour} single: p50 {one:.1} ms, one RTT is 20"
        );
        assert!(
            (12.0..35.0).contains(&(two - one)),
            "{flavour} per-call: p50 {two:.1} ms vs {one:.1} single: the handshake is one RTT"
        );
    }
}

/// Header and body as two writes with Nagle on: the body waits for the header's ACK, which the
/// server delays (it cannot answer half a request) by at least 40 ms. With TCP_NODELAY, or on
/// the same socket options through a proxy, that wait is not there.
#[test]
fn nagle_with_split_writes_waits_for_a_delayed_ack() {
    if !privileged("nagle_with_split_writes_waits_for_a_delayed_ack") {
        return;
    }
    let run = run_experiment(
        "profiles = [\"lossy-10ms-1pct\"]\nflavours = [\"tcp-binary\", \"thrift\"]\n\
         modes = [\"single\"]\ncalls = 20\nwarmup = \"300ms\"\nengine = \"link\"\n\
         nodelay = [true, false]\nwrite_pattern = \"split\"\n",
        &[],
    );
    assert_eq!(run.rows.len(), 4, "{}", run.stdout);
    assert!(
        run.stdout.contains("tcp-binary single nagle split"),
        "{}",
        run.stdout
    );
    for flavour in ["tcp-binary", "thrift"] {
        let of = |nodelay: bool| {
            run.rows
                .iter()
                .find(|r| r.flavour == flavour && r.nodelay == Some(nodelay))
                .unwrap_or_else(|| panic!("no {flavour} nodelay={nodelay} row"))
        };
        let (fast, slow) = (of(true), of(false));
        for r in [fast, slow] {
            assert_eq!(r.failed, 0, "{flavour}");
            assert_eq!(r.write_pattern.as_deref(), Some("split"));
        }
        let extra = p50_ms(slow) - p50_ms(fast);
        assert!(
            extra >= 30.0,
            "{flavour}: Nagle + split writes p50 {:.1} ms, TCP_NODELAY {:.1} ms: the delayed ACK \
             (>= 40 ms) is missing",
            p50_ms(slow),
            p50_ms(fast)
        );
    }
}

/// The network namespaces the threads of process `pid` are in, other than this process's.
fn namespaces_of(pid: u32) -> BTreeSet<String> {
    let own = std::fs::read_link("/proc/self/ns/net").unwrap();
    let own = own.to_string_lossy();
    thread_namespaces(&format!("/proc/{pid}"))
        .into_iter()
        .filter(|ns| *ns != own)
        .collect()
}

/// Every network namespace a thread on the machine is in.
fn all_namespaces() -> BTreeSet<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|p| {
            p.file_name()
                .to_str()
                .is_some_and(|s| s.parse::<u32>().is_ok())
        })
        .flat_map(|p| thread_namespaces(&p.path().to_string_lossy()))
        .collect()
}

/// The network namespaces of the threads of the process at `/proc/PID` (none once it is gone).
fn thread_namespaces(proc: &str) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("{proc}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_link(t.path().join("ns/net")).ok())
        .map(|ns| ns.to_string_lossy().into_owned())
        .collect()
}

/// TUN devices of the link engine (`frig*`) in this (the host's) namespace.
fn host_link_devices() -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .filter(|name| name.starts_with("frig"))
        .map(str::to_string)
        .collect()
}

/// However a `--engine link` run ends — SIGTERM or SIGKILL mid-cell — its servers end, and its
/// namespaces (and so their devices) are gone.
#[test]
fn a_stopped_link_run_leaves_nothing_behind() {
    if !privileged("a_stopped_link_run_leaves_nothing_behind") {
        return;
    }
    use nix::sys::signal::{kill, Signal};
    let devices_before = host_link_devices();
    let experiment = "profiles = [\"lan\"]\nflavours = [\"grpc\", \"tcp-binary\"]\n\
                      modes = [\"single\"]\nduration = \"60s\"\nengine = \"link\"\n";
    for signal in [Signal::SIGTERM, Signal::SIGKILL] {
        let (_scratch, mut run) = start_run(experiment);
        let runner = run.id();
        // Two servers, and the two namespaces of the link (held by the runner's threads).
        let deadline = Instant::now() + 3 * PROMPT;
        let (children, namespaces) = loop {
            let (found, namespaces) = (descendants(runner), namespaces_of(runner));
            if found.len() >= 2 && namespaces.len() >= 2 {
                break (found, namespaces);
            }
            assert!(
                Instant::now() < deadline,
                "{signal}: the run started only {found:?} in {namespaces:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        // Past the set-up: the first cell is running.
        std::thread::sleep(Duration::from_millis(500));
        kill(nix::unistd::Pid::from_raw(runner as i32), signal).unwrap();
        run.wait().unwrap();
        let deadline = Instant::now() + PROMPT;
        loop {
            let left: Vec<&Proc> = children.iter().filter(|p| running(p)).collect();
            let still: Vec<String> = all_namespaces()
                .intersection(&namespaces)
                .cloned()
                .collect();
            // The run makes its devices in its namespaces, never here; another test's
            // `faultrig shell` may, briefly, so only a device that stays counts.
            let devices: Vec<String> = host_link_devices()
                .into_iter()
                .filter(|d| !devices_before.contains(d))
                .collect();
            if left.is_empty() && still.is_empty() && devices.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{signal}: left behind servers {left:?} of {children:?}, namespaces {still:?}, \
                 devices {devices:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
