//! What an idle proxied connection costs in heap, per path, against a budget.
//!
//! RSS is too noisy to test (allocator caching, page granularity, other tests in the process);
//! bytes requested from the allocator are exact. This binary's global allocator counts them
//! (`stats_alloc`, so no unsafe code here). The counters are process-wide, so the measurement
//! runs in a child process of this test binary that runs that one test alone.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use faultrig::profile::Profile;
use faultrig::proxy::{Faults, Proxy, ProxyOptions};
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Heap bytes an idle connection may hold, per path. Measured when written: copy 3.5 KiB,
/// model (lossy-10ms-1pct) 7.2 KiB, control-API proxy without toxics 4.0 KiB (it copies until
/// its first toxic arrives; it held the scheduled pipe's 9.9 KiB before). Before either, every
/// path held a task of over 56 KiB (the scheduled pipe's state, twice). The budgets leave room
/// for dependency upgrades, not for another large state in every connection.
const BUDGETS: [(&str, usize); 3] = [("copy", 4096), ("model", 8192), ("api", 4608)];
/// The kernel engine's (measured only as root, as CI runs): 5.8 KiB when written. Two copy
/// pipes (the client's leg and the server's) and two more sockets in the process.
const KERNEL_BUDGET: (&str, usize) = ("kernel", 7168);

/// Idle connections opened per path; fewer where the descriptor limit is low (six descriptors
/// each at most: client, the proxy's two, the server's, and the kernel engine's two link
/// sockets).
const CONNECTIONS: usize = 1000;
/// Opened and closed before counting, so one-off allocations (runtime, timer thread, the
/// accept loop's growth) are not charged to the connections measured.
const WARM_UP: usize = 100;

/// Runs [`measure_idle_connections`] alone in a child process and checks it passed.
#[test]
fn idle_connections_stay_within_their_heap_budget() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "memory::measure_idle_connections",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    print!("{text}");
    eprint!("{err}");
    assert!(out.status.success(), "the measurement failed");
    assert!(text.contains("1 passed"), "the measurement did not run");
}

/// For each path: the heap held by `CONNECTIONS` idle connections, per connection, against its
/// budget. Run by the test above; alone, since the counters are process-wide.
#[test]
#[ignore = "run in its own process by idle_connections_stay_within_their_heap_budget"]
fn measure_idle_connections() {
    let n = CONNECTIONS.min(room_for_connections());
    let mut over = Vec::new();
    let kernel = nix::unistd::geteuid().is_root().then_some(KERNEL_BUDGET);
    for (path, budget) in BUDGETS.into_iter().chain(kernel) {
        let (live, allocations) = measure(path, n);
        println!(
            "{path:>5}: {live:.0} bytes live, {allocations:.1} allocations per idle connection \
             (budget {budget} bytes, {n} connections)"
        );
        if live > budget as f64 {
            over.push(format!(
                "{path}: {live:.0} bytes, over its budget of {budget}"
            ));
        }
    }
    assert!(
        over.is_empty(),
        "idle connections hold too much heap: {over:?}"
    );
}

/// Heap bytes and allocations still held per connection once `n` idle ones are established.
fn measure(path: &str, n: usize) -> (f64, f64) {
    let server = HoldServer::start(WARM_UP + n);
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let upstream = server.addr.to_string();
    let path_name = path.to_string();
    let proxy_thread = thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let local = Profile::builtin("local").unwrap();
            // Kept alive for the proxy's life: the control API's toxic list, empty.
            let (_toxics, toxics) = tokio::sync::watch::channel(Arc::new(Vec::new()));
            let faults = match path_name.as_str() {
                "copy" | "kernel" => Faults::Fixed(local),
                "model" => Faults::Fixed(Profile::builtin("lossy-10ms-1pct").unwrap()),
                _ => Faults::Live {
                    base: local,
                    toxics,
                },
            };
            let options = ProxyOptions {
                name: path_name.clone(),
                ..ProxyOptions::default()
            };
            let mut proxy = Proxy::with_faults(upstream, faults, options, Default::default());
            if path_name == "kernel" {
                proxy = proxy.with_kernel_engine().await.unwrap();
            }
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send((l.local_addr().unwrap(), proxy.stats())).unwrap();
            proxy.run(l, stopped).await.unwrap();
        });
    });
    let (addr, stats) = rx.recv().unwrap();
    let mut clients = Vec::with_capacity(WARM_UP + n);
    // In batches, each established before the next: a burst of a thousand overflows the
    // listen queues, and a SYN retried past the proxy's connect timeout refuses its client.
    let open = |clients: &mut Vec<TcpStream>, count: usize| {
        for batch in (0..count).collect::<Vec<_>>().chunks(100) {
            for _ in batch {
                clients.push(TcpStream::connect(addr).unwrap());
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while server.accepted() < clients.len()
                || stats.active.load(Ordering::SeqCst) as usize != clients.len()
            {
                let failures = stats.connect_failures.load(Ordering::SeqCst);
                assert_eq!(failures, 0, "the proxy could not reach the hold server");
                assert!(Instant::now() < deadline, "connections not established");
                thread::sleep(Duration::from_millis(10));
            }
        }
        // Each connection's task has set its sockets up and is waiting for data by now.
        thread::sleep(Duration::from_millis(300));
    };
    open(&mut clients, WARM_UP);
    let before = ALLOCATOR.stats();
    open(&mut clients, n);
    let after = ALLOCATOR.stats();
    // Reallocations are already in both sums (growth as allocated, shrinking as freed).
    let live = |s: stats_alloc::Stats| s.bytes_allocated as f64 - s.bytes_deallocated as f64;
    let per_connection = (live(after) - live(before)) / n as f64;
    let allocations = (after.allocations as f64
        - after.deallocations as f64
        - (before.allocations as f64 - before.deallocations as f64))
        / n as f64;
    drop(clients);
    let _ = stop.send(());
    proxy_thread.join().unwrap();
    (per_connection, allocations)
}

/// Raises the soft descriptor limit to the hard one; how many connections fit under it.
fn room_for_connections() -> usize {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    (soft.saturating_sub(256) / 6) as usize - WARM_UP
}

/// Accepts and holds up to `most` connections on a plain thread, into storage allocated up
/// front so that it adds nothing to the counts while connections arrive.
struct HoldServer {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

impl HoldServer {
    fn start(most: usize) -> HoldServer {
        // A deep accept queue: the proxy connects its upstreams in bursts.
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
        socket.bind(&any_port.into()).unwrap();
        socket.listen(4096).unwrap();
        let l: TcpListener = socket.into();
        let addr = l.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        thread::spawn(move || {
            let mut held = Vec::with_capacity(most);
            for s in l.incoming().take(most) {
                held.push(s.unwrap());
                count.store(held.len(), Ordering::SeqCst);
            }
            // Hold them until the proxy closes its side (the test is over).
            for mut s in held {
                let _ = s.read(&mut [0u8; 1]);
            }
        });
        HoldServer { addr, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}
