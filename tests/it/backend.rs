//! Deduct's backend: a real Redis `DECRBY` per call (a private redis-server on a free
//! loopback port), a fixed wait, and what happens when the backend is missing or dies.

use faultrig::local_redis::LocalRedis;
use faultrig::results::Row;
use faultrig::service::redis_stock_key;

use crate::util::*;

/// The sum of every SKU's stock counter in Redis (the workload spreads calls over 16 SKUs).
fn redis_total(redis: &LocalRedis) -> i64 {
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    (0..16)
        .map(|i| {
            redis::cmd("GET")
                .arg(redis_stock_key(&format!("sku-{i}")))
                .query::<Option<i64>>(&mut conn)
                .unwrap()
                .unwrap_or(0)
        })
        .sum()
}

fn bench_deduct(flavour: &str, target: &str, calls: u32, csv: &std::path::Path) -> Row {
    let o = faultrig(&[
        "bench",
        "--flavour",
        flavour,
        "--target",
        target,
        "--workload",
        "deduct",
        "--concurrency",
        "4",
        "--calls",
        &calls.to_string(),
        "--timeout",
        "5s",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    faultrig::results::read(csv).unwrap().pop().unwrap()
}

#[test]
fn every_flavour_deducts_in_a_real_redis() {
    let redis =
        LocalRedis::start(None).expect("redis-server (Debian: redis-server) must be installed");
    let dir = tempdir();
    let mut expected = 0;
    for flavour in faultrig::flavour::names() {
        let server = Listening::start(&["serve", "--flavour", flavour, "--backend", &redis.url()]);
        let csv = dir.path().join(format!("{flavour}.csv"));
        let row = bench_deduct(flavour, &server.addr, 40, &csv);
        assert_eq!((row.calls, row.ok), (40, 40), "{flavour}: {row:?}");
        expected -= 40;
        assert_eq!(
            redis_total(&redis),
            expected,
            "{flavour}: one DECRBY per call"
        );
    }
    // Redis goes away under a running server: every deduct fails, counted, and the server
    // keeps answering.
    let server = Listening::start(&[
        "serve",
        "--flavour",
        "tcp-binary",
        "--backend",
        &redis.url(),
    ]);
    drop(redis);
    let csv = dir.path().join("gone.csv");
    let row = bench_deduct("tcp-binary", &server.addr, 8, &csv);
    assert_eq!((row.calls, row.ok, row.failed), (8, 0, 8), "{row:?}");
    let o = faultrig(&[
        "bench",
        "--flavour",
        "tcp-binary",
        "--target",
        &server.addr,
        "--calls",
        "3",
    ]);
    assert!(o.status.success(), "echo still served");
}

#[tokio::test]
async fn an_unreachable_redis_fails_the_server_at_start() {
    let held = dead_addr();
    let dead = held.addr;
    let o = faultrig(&[
        "serve",
        "--flavour",
        "grpc",
        "--backend",
        &format!("redis://{dead}"),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--backend") && err.contains(&dead.to_string()),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "never announced an address");
}

#[test]
fn an_experiment_compares_backends() {
    let run = run_experiment(
        "profiles = [\"local\"]\nflavours = [\"http1-json\", \"tcp-binary\"]\nmodes = [\"single\"]\n\
         workloads = [\"deduct\", \"deduct@sleep:5ms\", \"deduct@redis\", \"wide\"]\ncalls = 10\n",
        &[],
    );
    let (rows, stdout) = (&run.rows, &run.stdout);
    let labels: Vec<&str> = rows.iter().map(|r| r.workload.as_str()).collect();
    assert_eq!(
        labels,
        ["deduct", "deduct@sleep:5ms", "deduct@redis", "wide"].repeat(2)
    );
    for r in rows {
        assert_eq!((r.calls, r.ok), (10, 10), "{r:?}");
        if r.workload == "deduct@sleep:5ms" {
            assert!(r.lat_min_us.unwrap() >= 5_000, "the wait is paid: {r:?}");
        } else {
            assert!(r.lat_p50_us.unwrap() < 5_000, "no wait: {r:?}");
        }
    }
    assert!(
        stdout.contains("tcp-binary single deduct@redis"),
        "{stdout}"
    );
}
