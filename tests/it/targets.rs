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
        for (mode, conns) in MODES {
            let mut args = vec!["--flavour", "grpc", "--call", RESERVE, "--data", data];
            args.extend_from_slice(schema);
            args.extend_from_slice(&["--target", &server.addr, "--mode", mode]);
            args.extend_from_slice(&["--concurrency", "3", "--calls", "12", "--seed", "7"]);
            let (stdout, row) = bench(&args);
            assert_eq!((row.calls, row.ok), (12, 12), "{schema:?} {mode}: {stdout}");
            assert_eq!(row.conns_opened, conns, "{schema:?} {mode}: {stdout}");
            assert_eq!(
                (row.flavour.as_str(), row.workload.as_str()),
                ("grpc", RESERVE)
            );
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
    for (mode, conns) in MODES {
        let args = [
            "--flavour",
            "http",
            "--url",
            &url,
            "--mode",
            mode,
            "--concurrency",
            "3",
            "--calls",
            "12",
        ];
        let (stdout, row) = bench(&args);
        assert_eq!((row.calls, row.ok), (12, 12), "{mode}: {stdout}");
        assert_eq!(row.conns_opened, conns, "{mode}: {stdout}");
        assert_eq!(
            (row.flavour.as_str(), row.workload.as_str()),
            ("http1", "GET /items/{{index}}")
        );
    }
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
    for (mode, conns) in MODES {
        let args = [
            "--flavour",
            "http",
            "--url",
            &url,
            "--http2",
            "--body",
            body,
            "--header",
            "content-type: application/json",
            "--mode",
            mode,
            "--concurrency",
            "3",
            "--calls",
            "12",
        ];
        let (stdout, row) = bench(&args);
        assert_eq!((row.calls, row.ok), (12, 12), "{mode}: {stdout}");
        assert_eq!(row.conns_opened, conns, "{mode}: {stdout}");
        assert_eq!(
            (row.flavour.as_str(), row.workload.as_str()),
            ("http2", "POST /rig/Deduct")
        );
    }
}
