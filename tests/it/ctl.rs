//! `faultrig ctl` against a real control API process, as toxiproxy-cli would be used: its verbs
//! and short flags, `TOXIPROXY_URL`, `--json`, `populate`, and one-line errors.

use std::process::{Command, Output};

use crate::util::*;

/// `faultrig ctl ARGS`, with `TOXIPROXY_URL` set to `url` or unset (whatever the test runner's
/// environment holds).
fn ctl(url: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_faultrig"));
    command.arg("ctl").args(args);
    match url {
        Some(url) => command.env("TOXIPROXY_URL", url),
        None => command.env_remove("TOXIPROXY_URL"),
    };
    output_within(command, COMMAND_DEADLINE)
}

/// `faultrig ctl --api API ARGS`, `TOXIPROXY_URL` unset.
fn ctl_at(api: &str, args: &[&str]) -> Output {
    let mut all = vec!["--api", api];
    all.extend(args);
    ctl(None, &all)
}

/// A control API process with no proxies.
fn api() -> Listening {
    Listening::start(&["proxy", "--api", "127.0.0.1:0"])
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The whitespace-separated cells of the table row starting with `first`.
fn row(table: &str, first: &str) -> Vec<String> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .find(|cells| cells.first().map(String::as_str) == Some(first))
        .unwrap_or_else(|| panic!("no row {first} in\n{table}"))
}

/// Asserts `o` failed with `code` and one line on standard error containing `says`.
fn failed_with(o: &Output, code: i32, says: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(says), "should say {says:?}: {err}");
}

/// Every toxiproxy-cli verb in its short form, the address from `TOXIPROXY_URL` (http://, with
/// a trailing slash): create, inspect, toxic add / update / remove, toggle twice, delete.
#[test]
fn every_verb_round_trips_with_toxiproxy_url() {
    let api = api();
    let url = format!("http://{}/", api.addr);
    let run = |args: &[&str]| succeeded(&ctl(Some(&url), args));

    let out = run(&["create", "db", "-l", "127.0.0.1:0", "-u", "127.0.0.1:9"]);
    assert!(
        out.starts_with("Created new proxy db listening on 127.0.0.1:"),
        "{out}"
    );
    let shown = run(&["inspect", "db"]);
    let cells = row(&shown, "db");
    assert_eq!(cells[2..], ["127.0.0.1:9", "enabled", "0"], "{shown}");
    assert!(shown.contains("no toxics"), "{shown}");

    let out = run(&[
        "toxic",
        "add",
        "db",
        "-t",
        "latency",
        "-n",
        "lag",
        "-a",
        "latency=100",
        "-a",
        "jitter=10",
        "--tox",
        "0.5",
    ]);
    assert_eq!(out, "Added downstream latency toxic 'lag' on proxy 'db'\n");
    let shown = run(&["inspect", "db"]);
    assert_eq!(row(&shown, "db")[4], "1", "{shown}");
    assert_eq!(
        row(&shown, "lag")[1..],
        ["latency", "downstream", "0.5", "jitter=10", "latency=100"],
        "{shown}"
    );

    let out = run(&["toxic", "update", "db", "-n", "lag", "-a", "latency=200"]);
    assert_eq!(out, "Updated toxic 'lag' on proxy 'db'\n");
    assert!(row(&run(&["inspect", "db"]), "lag").contains(&"latency=200".to_string()));

    let out = run(&["toxic", "remove", "db", "-n", "lag"]);
    assert_eq!(out, "Removed toxic 'lag' on proxy 'db'\n");
    assert!(run(&["inspect", "db"]).contains("no toxics"));

    assert_eq!(run(&["toggle", "db"]), "Proxy db is now disabled\n");
    assert_eq!(row(&run(&["list"]), "db")[3], "disabled");
    assert_eq!(run(&["toggle", "db"]), "Proxy db is now enabled\n");
    assert_eq!(row(&run(&["list"]), "db")[3], "enabled");

    assert_eq!(run(&["delete", "db"]), "Deleted proxy db\n");
    let listed = run(&["list"]);
    assert_eq!(
        listed.lines().collect::<Vec<_>>(),
        ["NAME  LISTEN  UPSTREAM  ENABLED  TOXICS"],
        "only the header: {listed}"
    );
}

/// faultrig's own long forms and toxiproxy-cli's aliases keep working, with `--api`.
#[test]
fn long_forms_and_aliases_still_work() {
    let api = api();
    let run = |args: &[&str]| succeeded(&ctl_at(&api.addr, args));
    run(&[
        "create",
        "cache",
        "--upstream",
        "127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
    ]);
    run(&[
        "toxic",
        "add",
        "cache",
        "--type",
        "latency",
        "--stream",
        "upstream",
        "--attr",
        "latency=5",
    ]);
    run(&[
        "t",
        "a",
        "cache",
        "-t",
        "bandwidth",
        "--upstream",
        "--attribute",
        "rate=100",
    ]);
    run(&[
        "toxic",
        "update",
        "cache",
        "latency_upstream",
        "--attr",
        "latency=6",
    ]);
    let toxics = run(&["toxic", "list", "cache"]);
    assert_eq!(
        row(&toxics, "latency_upstream")[1..],
        ["latency", "upstream", "1.0", "jitter=0", "latency=6"],
        "{toxics}"
    );
    assert_eq!(row(&toxics, "bandwidth_upstream")[2], "upstream");
    run(&["disable", "cache"]);
    assert_eq!(row(&run(&["ls"]), "cache")[3], "disabled");
    run(&["enable", "cache"]);
    run(&["toxic", "remove", "cache", "latency_upstream"]);
    run(&["t", "d", "cache", "-n", "bandwidth_upstream"]);
    assert!(run(&["i", "cache"]).contains("no toxics"));
    run(&["tog", "cache"]);
    assert_eq!(
        run(&["reset"]),
        "Enabled every proxy and removed every toxic\n"
    );
    assert_eq!(row(&run(&["l"]), "cache")[3], "enabled");
    assert!(run(&["metrics"]).contains("# HELP faultrig_proxy_"));
    run(&["d", "cache"]);
}

/// `--json` prints the API's answer byte for byte, and it parses.
#[test]
fn json_prints_the_apis_answer() {
    let api = api();
    let run = |args: &[&str]| succeeded(&ctl_at(&api.addr, args));
    let parse = |s: &str| -> serde_json::Value {
        serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
    };
    let created = parse(&run(&["create", "web", "-u", "127.0.0.1:9", "--json"]));
    assert_eq!(created["name"], "web");
    let toxic = parse(&run(&[
        "--json",
        "toxic",
        "add",
        "web",
        "-t",
        "timeout",
        "-a",
        "timeout=50",
    ]));
    assert_eq!(toxic["attributes"]["timeout"], 50);
    let shown = parse(&run(&["inspect", "web", "--json"]));
    assert_eq!(shown["toxics"][0]["name"], "timeout_downstream");
    let listed = run(&["list", "--json"]);
    assert_eq!(parse(&listed)["web"]["upstream"], "127.0.0.1:9");
    let answer = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(faultrig::api::client::request_raw(
            &api.addr,
            http::Method::GET,
            "/proxies",
            None,
        ))
        .unwrap();
    assert_eq!(listed.as_bytes(), &answer[..], "the answer as it came");
    assert_eq!(run(&["delete", "web", "--json"]), "", "204 has no body");
}

/// `populate FILE` creates every proxy of a Toxiproxy populate file; an unreadable or non-JSON
/// file is bad input (exit 2), and a proxy the API refuses is exit 1.
#[test]
fn populate_creates_the_proxies_of_a_file() {
    let api = api();
    let dir = tempdir();
    let file = dir.path().join("proxies.json");
    std::fs::write(
        &file,
        r#"[{"name": "a", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"},
            {"name": "b", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:10", "enabled": false}]"#,
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let out = succeeded(&ctl_at(&api.addr, &["populate", path]));
    assert_eq!(
        row(&out, "a")[2..],
        ["127.0.0.1:9", "enabled", "0"],
        "{out}"
    );
    assert_eq!(
        row(&out, "b")[2..],
        ["127.0.0.1:10", "disabled", "0"],
        "{out}"
    );
    let listed = succeeded(&ctl_at(&api.addr, &["list"]));
    assert_eq!(listed.lines().count(), 3, "{listed}");

    let missing = dir.path().join("missing.json");
    let o = ctl_at(&api.addr, &["populate", missing.to_str().unwrap()]);
    failed_with(&o, 2, "missing.json");
    std::fs::write(&file, "not json").unwrap();
    failed_with(&ctl_at(&api.addr, &["populate", path]), 2, path);
    std::fs::write(&file, r#"[{"name": "c"}]"#).unwrap();
    failed_with(
        &ctl_at(&api.addr, &["populate", path]),
        1,
        "missing required field: upstream",
    );
}

/// Bad input here (TOXIPROXY_URL, flags) is exit 2; what the API refuses, or an API that is not
/// there, is exit 1; each one line.
#[test]
fn errors_are_one_line_with_the_right_exit_code() {
    let api = api();
    for bad in [
        "https://127.0.0.1:8474",
        "http://127.0.0.1:8474/v2",
        "nowhere",
    ] {
        failed_with(&ctl(Some(bad), &["list"]), 2, "TOXIPROXY_URL");
    }
    // --api wins over the environment, which is then not even read.
    succeeded(&ctl(Some("nowhere"), &["--api", &api.addr, "list"]));
    failed_with(&ctl(None, &["--api", "nowhere", "list"]), 2, "--api");

    let url = format!("http://{}", api.addr);
    failed_with(&ctl(Some(&url), &["inspect", "nope"]), 1, "proxy not found");
    failed_with(&ctl(Some(&url), &["toggle", "nope"]), 1, "proxy not found");
    succeeded(&ctl(Some(&url), &["create", "x", "-u", "127.0.0.1:9"]));
    failed_with(
        &ctl(Some(&url), &["create", "x", "-u", "127.0.0.1:9"]),
        1,
        "proxy already exists",
    );
    let o = ctl(
        Some(&url),
        &["toxic", "add", "x", "-t", "latency", "-a", "latency=soon"],
    );
    failed_with(&o, 1, "400");
    let o = ctl(
        Some(&url),
        &["toxic", "add", "x", "-t", "latency", "-a", "latency"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("KEY=VALUE"), "{}", stderr(&o));
    let o = ctl(Some(&url), &["toxic", "update", "x", "-a", "latency=1"]);
    assert_eq!(o.status.code(), Some(2), "no toxic named: {}", stderr(&o));

    let dead = dead_addr();
    let dead = dead.addr.to_string();
    failed_with(&ctl(None, &["--api", &dead, "list"]), 1, &dead);
}
