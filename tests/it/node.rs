//! The published `toxiproxy-node-client` (npm), unmodified, against `faultrig proxy --api`:
//! `tests/node/toxiproxy_client.js` asserts what a Toxiproxy user's test would (a 100 ms latency
//! toxic costs the first exchange of a new connection 100 ms, toxicity 0, update and removal on
//! a live connection), then every case of the toxic matrix `tests/toxiproxy/matrix.json`.

use crate::util::*;

/// Where scripts/test.sh installs the npm packages the tests use.
const NODE_MODULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/node/node_modules");

#[test]
fn the_toxiproxy_node_client_drives_faultrig() {
    assert!(
        std::path::Path::new(NODE_MODULES)
            .join("toxiproxy-node-client")
            .exists(),
        "{NODE_MODULES}/toxiproxy-node-client is missing: run scripts/test.sh, which installs it"
    );
    let api = Listening::start(&["proxy", "--api", "127.0.0.1:0"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let echo = rt.block_on(async {
        let (l, addr) = listener().await;
        spawn_echo(l);
        addr
    });
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/node/toxiproxy_client.js"
    );
    let mut client = std::process::Command::new("node");
    client
        .args([script, &api.addr, &echo.to_string()])
        .env("NODE_PATH", NODE_MODULES);
    let o = output_within(client, COMMAND_DEADLINE);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.lines().any(|l| l == "ok"), "{out}");
}
