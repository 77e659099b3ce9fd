//! Proxies created with their toxics: in the startup `--config` file (Toxiproxy issue #447),
//! and in one `POST /proxies` or `/populate` request (Toxiproxy issue #510). The toxics are in
//! force before the proxy accepts anything, and a bad toxic refuses the whole proxy.

use std::io::BufRead;
use std::time::{Duration, Instant};

use http::Method;
use serde_json::{json, Value};
use tokio::net::TcpStream;

use crate::api::start_api;
use crate::util::*;

/// The first 64-byte exchange of a new connection to `addr`, connecting included.
async fn first_exchange(addr: &str) -> Duration {
    let start = Instant::now();
    let mut conn = TcpStream::connect(addr).await.unwrap();
    exchange(&mut conn).await;
    start.elapsed()
}

async fn echo() -> String {
    let (l, addr) = listener().await;
    spawn_echo(l);
    addr.to_string()
}

fn latency(ms: u64) -> Value {
    json!({"type": "latency", "attributes": {"latency": ms}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_created_with_its_toxics_never_serves_without_them() {
    let api = start_api().await;
    let echo = echo().await;
    // The very first connection, opened the moment the create returns, meets the toxic.
    let p = api
        .call(
            Method::POST,
            "/proxies",
            Some(json!({"name": "a", "upstream": echo, "toxics": [latency(300)]})),
        )
        .await
        .unwrap();
    assert_eq!(p["toxics"][0]["name"], "latency_downstream", "{p}");
    assert_eq!(p["toxics"][0]["attributes"]["latency"], 300, "{p}");
    let took = first_exchange(p["listen"].as_str().unwrap()).await;
    assert!(took >= Duration::from_millis(300), "{took:?}");
    // Updates and deletes work on them like on any toxic.
    api.call(Method::DELETE, "/proxies/a/toxics/latency_downstream", None)
        .await
        .unwrap();
    let took = first_exchange(p["listen"].as_str().unwrap()).await;
    assert!(took < Duration::from_millis(300), "{took:?}");

    // A bad toxic, a duplicate name, or a toxic list that is not a list: the whole proxy is
    // refused, named with the toxic, and nothing is created.
    for (toxics, status, says) in [
        (
            json!([latency(10), {"type": "bandwidth", "name": "bw", "attributes": {"rate": -1}}]),
            400,
            r#"attribute rate of a bandwidth toxic must be an integer from 0 to 100000000 (KB/s), got -1 (proxy "b", toxic 2 "bw")"#,
        ),
        (
            json!([{"type": "melt"}]),
            400,
            r#"invalid toxic type (proxy "b", toxic 1)"#,
        ),
        (
            json!([latency(10), latency(20)]),
            409,
            r#"toxic already exists (proxy "b", toxic 2 "latency_downstream")"#,
        ),
        (json!({"type": "noop"}), 400, "toxics must be a JSON array"),
    ] {
        let (s, m) = api
            .call(
                Method::POST,
                "/proxies",
                Some(json!({"name": "b", "upstream": echo, "toxics": toxics})),
            )
            .await
            .unwrap_err();
        assert_eq!(s, status, "{toxics}: {m}");
        assert!(m.contains(says), "{toxics}: {m}");
        let (s, _) = api.call(Method::GET, "/proxies/b", None).await.unwrap_err();
        assert_eq!(s, 404, "{toxics}: nothing created");
    }

    // /populate: one bad toxic anywhere refuses every proxy of the request.
    let (s, m) = api
        .call(
            Method::POST,
            "/populate",
            Some(json!([
                {"name": "c", "upstream": echo, "toxics": [latency(10)]},
                {"name": "d", "upstream": echo, "toxics": [{"type": "slicer", "name": "s", "attributes": {"average_size": 0}}]},
            ])),
        )
        .await
        .unwrap_err();
    assert_eq!(s, 400, "{m}");
    assert!(m.contains(r#"(proxy "d", toxic 1 "s")"#), "{m}");
    let list = api.call(Method::GET, "/proxies", None).await.unwrap();
    assert!(list.get("c").is_none() && list.get("d").is_none(), "{list}");

    // Populated with toxics; populated again, kept running, its toxics replaced by the new
    // list (or kept when the entry gives none).
    let first = api
        .call(
            Method::POST,
            "/populate",
            Some(json!([{"name": "c", "upstream": echo, "toxics": [latency(300)]}])),
        )
        .await
        .unwrap();
    let listen = first["proxies"][0]["listen"].as_str().unwrap().to_string();
    assert!(first_exchange(&listen).await >= Duration::from_millis(300));
    let again = api
        .call(
            Method::POST,
            "/populate",
            Some(json!([{"name": "c", "upstream": echo, "listen": listen, "toxics": [json!({"type": "noop"})]}])),
        )
        .await
        .unwrap();
    assert_eq!(
        again["proxies"][0]["listen"],
        listen.as_str(),
        "kept running"
    );
    assert_eq!(again["proxies"][0]["toxics"][0]["type"], "noop", "{again}");
    assert_eq!(again["proxies"][0]["toxics"].as_array().unwrap().len(), 1);
    assert!(first_exchange(&listen).await < Duration::from_millis(300));
    let kept = api
        .call(
            Method::POST,
            "/populate",
            Some(json!([{"name": "c", "upstream": echo, "listen": listen}])),
        )
        .await
        .unwrap();
    assert_eq!(kept["proxies"][0]["toxics"][0]["type"], "noop", "{kept}");
}

/// `faultrig proxy --api --config FILE`: each proxy starts with the toxics its entry lists; a
/// bad one stops the start-up, naming the file, the proxy and the toxic, with exit code 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_config_toxics_are_in_force_from_the_first_connection() {
    let echo = echo().await;
    let dir = tempdir();
    let good = dir.path().join("good.json");
    std::fs::write(
        &good,
        json!([{
            "name": "slow",
            "listen": "127.0.0.1:0",
            "upstream": echo,
            "toxics": [
                {"type": "latency", "stream": "upstream", "attributes": {"latency": 150}},
                {"type": "latency", "attributes": {"latency": 150}},
            ],
        }])
        .to_string(),
    )
    .unwrap();
    // The first line announces the proxy (so `addr` is its address), the next the API.
    let mut api = Listening::start(&[
        "proxy",
        "--api",
        "127.0.0.1:0",
        "--config",
        good.to_str().unwrap(),
    ]);
    let mut line = String::new();
    api.stdout.as_mut().unwrap().read_line(&mut line).unwrap();
    let control = line
        .split("control API listening on ")
        .nth(1)
        .unwrap_or_else(|| panic!("{line}"))
        .trim()
        .to_string();
    let took = first_exchange(&api.addr).await;
    assert!(took >= Duration::from_millis(300), "both toxics: {took:?}");
    let toxics = faultrig::api::client::Client::new(&control)
        .toxics("slow")
        .await
        .unwrap();
    assert_eq!(toxics.len(), 2, "{toxics:?}");

    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        json!([
            {"name": "fine", "upstream": echo},
            {"name": "broken", "upstream": echo, "toxics": [{"type": "latency", "name": "lag", "attributes": {"latency": -3}}]},
        ])
        .to_string(),
    )
    .unwrap();
    let o = faultrig(&[
        "proxy",
        "--api",
        "127.0.0.1:0",
        "--config",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("--config {}", bad.display()))
            && err.contains(r#"attribute latency of a latency toxic"#)
            && err.contains(r#"(proxy "broken", toxic 1 "lag")"#),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "nothing started: {o:?}");
}
