//! Generic targets (`bench --call`, `bench --url`) against servers that are not faultrig's: a
//! Python grpcio service with its own proto (by `--proto` and by reflection) and a Python
//! stdlib HTTP server; h2c against our own http2-json server. Every mode's connections are
//! counted exactly, failures are counted as outcomes, bad input is refused before any load.

use std::path::Path;
use std::process::Command;

use faultrig::results::Row;

use crate::util::*;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/python/foreign_servers.py"
);
const PROTO_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/grpc");
const PROTO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/grpc/inventory.proto");
const RESERVE: &str = "inventory.Inventory/Reserve";

/// Each mode with 3 workers and 12 calls, and the connections it must open.
const MODES: [(&str, u64); 4] = [
    ("single", 1),
    ("per-call", 12),
    ("per-worker", 3),
    ("pool:2", 2),
];

/// The Python grpcio server of tests/grpc/inventory.proto (its stubs generated into `stubs`).
fn grpc_server(stubs: &Path, reflection: bool) -> Listening {
    let mut command = Command::new(venv_python());
    command.arg(SCRIPT).arg("grpc").arg(PROTO_DIR).arg(stubs);
    if !reflection {
        command.arg("--no-reflection");
    }
    Listening::spawn(command)
}

/// `faultrig bench ARGS --csv FILE`, which must succeed; its summary and its one CSV row.
fn bench(args: &[&str]) -> (String, Row) {
    let dir = tempdir();
    let csv = dir.path().join("bench.csv");
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--csv", csv.to_str().unwrap()]);
    let stdout = succeeded(&faultrig(&all));
    let mut rows = faultrig::results::read(&csv).unwrap();
    assert_eq!(rows.len(), 1, "{stdout}");
    (stdout, rows.remove(0))
}

/// `faultrig bench ARGS` in each of [`MODES`] with 3 workers and 12 calls: every call
/// succeeds, the mode opens its connections, and the row names `flavour` and `workload`.
/// Returns the rows, a mode's after the one before.
fn bench_in_every_mode(args: &[&str], (flavour, workload): (&str, &str)) -> Vec<Row> {
    let mut rows = Vec::new();
    for (mode, conns) in MODES {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--mode", mode, "--concurrency", "3", "--calls", "12"]);
        let (stdout, row) = bench(&all);
        assert_eq!((row.calls, row.ok), (12, 12), "{all:?}: {stdout}");
        assert_eq!(row.conns_opened, conns, "{all:?}: {stdout}");
        assert_eq!(
            (row.flavour.as_str(), row.workload.as_str()),
            (flavour, workload)
        );
        rows.push(row);
    }
    rows
}

/// `faultrig bench ARGS` is refused with exit 2 before any load, saying `says`.
fn refused(args: &[&str], says: &str) {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    let out = faultrig(&all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(
        stderr.contains(says),
        "{args:?}: expected {says:?} in: {stderr}"
    );
    assert!(out.stdout.is_empty(), "{args:?}: no load ran, no summary");
}

#[test]
fn a_foreign_grpc_service_by_proto_and_by_reflection_in_every_mode() {
    let stubs = tempdir();
    let server = grpc_server(stubs.path(), true);
    // Templated data: each call its own SKU, quantity and price (1..9 ≥ 1: all accepted).
    let data = r#"{"sku": "sku-{{index}}-{{rand_string 4}}", "quantity": {{rand_int 1 9}},
                   "unitPrice": {"currency": "EUR", "cents": {{worker}}}}"#;
    for schema in [&["--proto", PROTO][..], &["--reflect"][..]] {
        let mut args = vec!["--flavour", "grpc", "--call", RESERVE, "--data", data];
        args.extend_from_slice(schema);
        args.extend_from_slice(&["--target", &server.addr, "--seed", "7"]);
        for row in bench_in_every_mode(&args, ("grpc", RESERVE)) {
            assert_eq!(row.seed, 7);
        }
    }
}

#[test]
fn a_grpc_server_error_and_a_wrong_reply_are_counted_outcomes() {
    let stubs = tempdir();
    let server = grpc_server(stubs.path(), false);
    // Quantity = call index: call 0 asks for 0 and is refused with INVALID_ARGUMENT.
    let data = r#"{"sku": "a", "quantity": {{index}}}"#;
    let args = [
        "--flavour",
        "grpc",
        "--proto",
        PROTO,
        "--call",
        RESERVE,
        "--data",
        data,
        "--target",
        &server.addr,
        "--concurrency",
        "2",
        "--calls",
        "10",
    ];
    let (stdout, row) = bench(&args);
    assert_eq!((row.ok, row.err_other, row.failed), (9, 1, 1), "{stdout}");
    assert!(
        stdout.contains("InvalidArgument: quantity 0 of a"),
        "{stdout}"
    );

    // --expect: equal replies pass; a reply that differs is a protocol outcome.
    let data = r#"{"sku": "b", "quantity": 2, "unitPrice": {"cents": 5}}"#;
    let good = r#"{"sku": "b", "reserved": 2, "total": {"currency": "EUR", "cents": "10"}}"#;
    let bad = r#"{"sku": "b", "reserved": 3}"#;
    for (expect, ok, protocol) in [(good, 4, 0), (bad, 0, 4)] {
        let args = [
            "--flavour",
            "grpc",
            "--proto",
            PROTO,
            "--call",
            RESERVE,
            "--data",
            data,
            "--expect",
            expect,
            "--target",
            &server.addr,
            "--calls",
            "4",
        ];
        let (stdout, row) = bench(&args);
        assert_eq!(
            (row.ok, row.err_protocol),
            (ok, protocol),
            "{expect}: {stdout}"
        );
    }
}

#[test]
fn bad_grpc_target_input_is_refused_before_any_load() {
    let scratch = tempdir();
    let broken = scratch.path().join("broken.proto");
    std::fs::write(&broken, "syntax = \"proto3\";\nmessage X { int32 a = 1 }\n").unwrap();
    let broken = broken.to_str().unwrap();
    let stubs = tempdir();
    let server = grpc_server(stubs.path(), false);
    let addr = server.addr.as_str();
    let base = ["--flavour", "grpc", "--target", addr, "--calls", "1"];
    let with = |more: &[&'static str]| -> Vec<&str> {
        base.iter().copied().chain(more.iter().copied()).collect()
    };
    refused(
        &with(&["--proto", PROTO, "--call", "inventory.Inventory/Restock"]),
        "--call inventory.Inventory/Restock: service inventory.Inventory has no method Restock (methods: Reserve)",
    );
    refused(
        &with(&["--proto", PROTO, "--call", "inventory.Warehouse/Reserve"]),
        "no service inventory.Warehouse",
    );
    let mut args = with(&["--call", "x.Y/Z", "--proto"]);
    args.push(broken);
    refused(&args, &format!("--proto {broken}: does not compile"));
    refused(
        &with(&[
            "--proto",
            PROTO,
            "--call",
            RESERVE,
            "--data",
            r#"{"sku": 5}"#,
        ]),
        "--data: invalid type: integer `5`, expected a string",
    );
    refused(
        &with(&[
            "--proto",
            PROTO,
            "--call",
            RESERVE,
            "--data",
            r#"{"colour": "red"}"#,
        ]),
        "(message inventory.ReserveRequest)",
    );
    refused(
        &with(&["--proto", PROTO, "--call", RESERVE, "--data", "{{id}}"]),
        "--data: unknown placeholder `{{id}}`",
    );
    // This server has no reflection service; nothing at all listens at a dead address.
    refused(
        &with(&["--reflect", "--call", RESERVE]),
        &format!("--reflect (reflection service at {addr}): inventory.Inventory: the server has no reflection service"),
    );
    let held = dead_addr();
    let dead = held.addr.to_string();
    refused(
        &[
            "--flavour",
            "grpc",
            "--reflect",
            "--call",
            RESERVE,
            "--target",
            &dead,
            "--calls",
            "1",
        ],
        &format!("--reflect (reflection service at {dead}): inventory.Inventory: cannot connect"),
    );
    // Flags of the two kinds of target, or of a target and a flavour, do not mix.
    refused(
        &with(&["--url", "http://x/", "--call", RESERVE]),
        "cannot be used with",
    );
    refused(&with(&["--proto", PROTO]), "--call");
    refused(
        &[
            "--flavour",
            "thrift",
            "--target",
            addr,
            "--calls",
            "1",
            "--reflect",
            "--call",
            RESERVE,
        ],
        "with --flavour grpc, not thrift",
    );
}

#[test]
fn a_foreign_http_endpoint_in_every_mode() {
    let server = Listening::spawn({
        let mut c = Command::new(venv_python());
        c.arg(SCRIPT).arg("http");
        c
    });
    let url = format!("http://{}/items/{{{{index}}}}", server.addr);
    bench_in_every_mode(
        &["--flavour", "http", "--url", &url],
        ("http1", "GET /items/{{index}}"),
    );
    // A status other than the expected one is a protocol outcome; the expected one passes.
    let missing = format!("http://{}/missing", server.addr);
    let (stdout, row) = bench(&["--flavour", "http", "--url", &missing, "--calls", "3"]);
    assert_eq!((row.ok, row.err_protocol), (0, 3), "{stdout}");
    assert!(
        stdout.contains("status 404 Not Found (expected 200 OK)"),
        "{stdout}"
    );
    let args = [
        "--flavour",
        "http",
        "--url",
        &missing,
        "--expect-status",
        "404",
        "--calls",
        "3",
    ];
    let (stdout, row) = bench(&args);
    assert_eq!(row.ok, 3, "{stdout}");

    refused(
        &[
            "--flavour",
            "http",
            "--url",
            "https://example.com/",
            "--calls",
            "1",
        ],
        "https:// is not supported",
    );
    refused(&["--flavour", "http", "--calls", "1"], "give it --url URL");
    refused(
        &["--flavour", "http2-json", "--url", &url, "--calls", "1"],
        "use it with --flavour http",
    );
    refused(
        &[
            "--flavour",
            "http",
            "--url",
            &url,
            "--header",
            "no colon",
            "--calls",
            "1",
        ],
        "--header no colon: use NAME:VALUE",
    );
}

#[test]
fn h2c_through_url_against_our_http2_server() {
    let server = Listening::start(&[
        "serve",
        "--flavour",
        "http2-json",
        "--listen",
        "127.0.0.1:0",
    ]);
    let url = format!("http://{}/rig/Deduct", server.addr);
    let body = r#"{"sku": "w{{worker}}", "quantity": {{rand_int 1 3}}}"#;
    bench_in_every_mode(
        &[
            "--flavour",
            "http",
            "--url",
            &url,
            "--http2",
            "--body",
            body,
            "--header",
            "content-type: application/json",
        ],
        ("http2", "POST /rig/Deduct"),
    );
}

/// `[[targets]]` in an experiment file: the foreign gRPC service (by reflection) and HTTP
/// endpoint run by `faultrig run` behind `lossy-10ms-1pct`, single vs per-call, beside a
/// built-in flavour, with no Rust written: every row has the proxy's bytes and stalls, exact
/// connection counts, and what it called as its workload.
#[test]
fn experiment_targets_run_behind_the_lossy_proxy() {
    let stubs = tempdir();
    let grpc = grpc_server(stubs.path(), true);
    let http = Listening::spawn({
        let mut c = Command::new(venv_python());
        c.arg(SCRIPT).arg("http");
        c
    });
    let experiment = format!(
        r#"
profiles = ["lossy-10ms-1pct"]
modes = ["single", "per-call"]
concurrency = [2]
calls = 40
seed = 5

[[targets]]
name = "inventory-grpc"
kind = "grpc"
address = "{grpc}"
call = "{RESERVE}"
reflect = true
data = '{{"sku": "sku-{{{{index}}}}", "quantity": 1}}'

[[targets]]
name = "items-rest"
kind = "http"
url = "http://{http}/items/{{{{index}}}}"
"#,
        grpc = grpc.addr,
        http = http.addr,
    );
    let run = run_experiment(&experiment, &[]);
    assert_eq!(run.rows.len(), 4, "{}", run.stdout);
    let mut stalls = 0;
    for r in &run.rows {
        let what = format!("{} {}", r.flavour, r.mode);
        assert_eq!((r.calls, r.ok), (40, 40), "{what}: {}", run.stdout);
        assert_eq!(r.profile.as_deref(), Some("lossy-10ms-1pct"), "{what}");
        let expected_workload = match r.flavour.as_str() {
            "inventory-grpc" => RESERVE.to_string(),
            "items-rest" => "GET /items/{{index}}".to_string(),
            other => panic!("unexpected flavour {other}"),
        };
        assert_eq!(r.workload, expected_workload, "{what}");
        let conns = if r.mode == "single" { 1 } else { 40 };
        assert_eq!(r.conns_opened, conns, "{what}");
        assert!(
            r.bytes_up.unwrap() > 0 && r.bytes_down.unwrap() > 0,
            "{what}"
        );
        stalls += r.stalls_up.unwrap() + r.stalls_down.unwrap();
        // 10 ms each way: no call is faster than a round trip through the proxy.
        assert!(r.lat_min_us.unwrap() >= 20_000, "{what}: {r:?}");
    }
    assert!(stalls > 0, "1 % loss over some 160 calls: {:?}", run.rows);
    // A new connection per call pays the handshake's round trip (gRPC: calls share a
    // connection without waiting for each other, so single's p50 is one round trip).
    let p50 = |flavour: &str, mode: &str| {
        run.rows
            .iter()
            .find(|r| r.flavour == flavour && r.mode == mode)
            .and_then(|r| r.lat_p50_us)
            .unwrap()
    };
    let (single, per_call) = (
        p50("inventory-grpc", "single"),
        p50("inventory-grpc", "per-call"),
    );
    assert!(per_call >= single + 15_000, "{single} µs vs {per_call} µs");

    // A bad entry is refused before any traffic, naming the file's key and the target.
    let dir = tempdir();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        format!(
            "profiles = [\"local\"]\nmodes = [\"single\"]\ncalls = 1\n[[targets]]\n\
             name = \"x\"\nkind = \"grpc\"\naddress = \"{}\"\ncall = \"inventory.Inventory/Nope\"\n\
             reflect = true\n",
            grpc.addr
        ),
    )
    .unwrap();
    let out = faultrig(&[
        "run",
        file.to_str().unwrap(),
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("targets") && stderr.contains("target x") && stderr.contains("Nope"),
        "{stderr}"
    );
}
