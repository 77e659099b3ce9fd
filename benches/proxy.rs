//! Proxy benchmark: every figure is measured side by side with its baseline in the same run,
//! because the machines are shared and noisy. Run it with `scripts/bench-proxy.sh`, which
//! lets cargo build the `faultrig` binary alongside.
//!
//! 1. 64-byte ping-pong RTT, direct vs through `faultrig proxy` (profile `local`).
//! 2. Bulk throughput, direct vs through the proxy (`local`, and a 10 ms delay profile), every
//!    byte checked, with the machine's CPU per GB; HAProxy (splice) beside it when installed.
//! 3. Delay precision: RTT minus the configured 2×delay, for 250 µs, 1 ms and 10 ms.
//! 4. RSS per idle connection of the proxy process holding 10,000 of them, per path (copy,
//!    scheduled model, control-API proxy), beside a plain tokio copy proxy as the floor.
//!
//! Traffic stays on 127.0.0.1; every child process is killed when the bench ends.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use faultrig::child::Announced;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.iter().any(|a| a == "--hold-server") {
        return hold_server_main();
    }
    if let Some(i) = args.iter().position(|a| a == "--floor-proxy") {
        return floor_proxy_main(args[i + 1].parse().expect("--floor-proxy UPSTREAM"));
    }
    let quick = args.iter().any(|a| a == "--quick");
    // Cargo builds the binary with the bench (same profile and features as the tests, so CI
    // does not build the library twice).
    // `--faultrig PATH` measures another build instead (a before/after comparison with the same
    // bench).
    let bin = args.iter().position(|a| a == "--faultrig").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_faultrig")),
        |i| PathBuf::from(&args[i + 1]),
    );
    raise_fd_limit();
    let dir = tempfile::tempdir().expect("temp dir");
    let scale = if quick { 4 } else { 1 };

    println!(
        "faultrig proxy benchmark ({})",
        if quick { "quick" } else { "full" }
    );
    println!();
    // `--only rtt,precision` runs a subset (for tuning); the default is everything.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1));
    let wanted = |part: &str| only.is_none_or(|o| o.split(',').any(|p| p == part));
    if wanted("rtt") {
        rtt(&bin, scale);
    }
    if wanted("throughput") {
        throughput(&bin, dir.path(), scale);
    }
    if wanted("precision") {
        precision(&bin, dir.path(), scale);
    }
    if wanted("memory") {
        memory(&bin, if quick { 2_000 } else { 10_000 });
    }
}

// ---------------------------------------------------------------------------------------------
// Servers (plain threads with blocking sockets: the least overhead for the baseline).

/// Echoes every connection; one thread per connection.
fn echo_server() -> SocketAddr {
    serve(|mut s| {
        let mut r = s.try_clone().unwrap();
        let _ = std::io::copy(&mut r, &mut s);
    })
}

fn serve(handler: fn(TcpStream)) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming().flatten() {
            s.set_nodelay(true).unwrap();
            thread::spawn(move || handler(s));
        }
    });
    addr
}

/// A `faultrig proxy` child process, stopped on drop.
struct ProxyProcess {
    process: Announced,
    addr: SocketAddr,
}

impl ProxyProcess {
    fn start(bin: &Path, upstream: SocketAddr, profile: &str, extra: &[&str]) -> ProxyProcess {
        let upstream = upstream.to_string();
        let mut args = vec!["proxy", "--listen", "127.0.0.1:0", "--upstream", &upstream];
        args.extend(["--profile", profile]);
        args.extend(extra);
        ProxyProcess::spawn(bin, &args)
    }

    /// Runs `program args…`, a proxy that prints "… listening on ADDR …" as its first line.
    fn spawn(program: &Path, args: &[&str]) -> ProxyProcess {
        let mut command = Command::new(program);
        command.args(args).env("RUST_LOG", "warn");
        let process = Announced::spawn(command, Duration::from_secs(30)).expect("start the proxy");
        let addr = process.addr.parse().expect("an address");
        ProxyProcess { process, addr }
    }

    /// Resident and peak resident set size, KiB.
    fn rss_kib(&self) -> (u64, u64) {
        let field = |name| self.process.status_kib(name).unwrap_or(0);
        (field("VmRSS"), field("VmHWM"))
    }
}

// ---------------------------------------------------------------------------------------------
// 1. RTT

fn ping_pong(addr: SocketAddr, n: usize, out: &mut Vec<Duration>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let msg = [42u8; 64];
    let mut buf = [0u8; 64];
    for _ in 0..20 {
        s.write_all(&msg).unwrap();
        s.read_exact(&mut buf).unwrap();
    }
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&msg).unwrap();
        s.read_exact(&mut buf).unwrap();
        out.push(t.elapsed());
    }
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The simplest possible userspace proxy: two blocking threads per connection copying bytes.
/// It does nothing but copy, so what it adds is this machine's floor for any proxy that does
/// not busy-poll: two more loopback hops and two more thread wake-ups per round trip.
fn naive_thread_proxy(upstream: SocketAddr) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for client in l.incoming().flatten() {
            let server = TcpStream::connect(upstream).unwrap();
            for (from, to) in [(&client, &server), (&server, &client)] {
                let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                from.set_nodelay(true).unwrap();
                thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(Shutdown::Write);
                });
            }
        }
    });
    addr
}

fn rtt(bin: &Path, scale: usize) {
    let echo = echo_server();
    let proxy = ProxyProcess::start(bin, echo, "local", &[]);
    let naive = naive_thread_proxy(echo);
    let (mut direct, mut proxied, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    // Alternate blocks so all three see the same background noise.
    for _ in 0..10 {
        ping_pong(echo, 2000 / scale, &mut direct);
        ping_pong(proxy.addr, 2000 / scale, &mut proxied);
        ping_pong(naive, 2000 / scale, &mut floor);
    }
    direct.sort();
    proxied.sort();
    floor.sort();
    let (f50, f99) = (percentile(&floor, 0.5), percentile(&floor, 0.99));
    let (d50, d99) = (percentile(&direct, 0.5), percentile(&direct, 0.99));
    let (p50, p99) = (percentile(&proxied, 0.5), percentile(&proxied, 0.99));
    println!(
        "1. RTT, 64-byte ping-pong ({} round trips each, interleaved)",
        direct.len()
    );
    println!("   {:<28} {:>10} {:>10}", "", "median µs", "p99 µs");
    println!("   {:<28} {:>10.1} {:>10.1}", "direct", us(d50), us(d99));
    println!(
        "   {:<28} {:>10.1} {:>10.1}",
        "through faultrig (local)",
        us(p50),
        us(p99)
    );
    println!(
        "   {:<28} {:>10.1} {:>10.1}",
        "through naive thread proxy",
        us(f50),
        us(f99)
    );
    println!(
        "   added by faultrig: {:.1} µs at the median, {:.1} µs at p99   (target ≤ 15 µs median)",
        us(p50) - us(d50),
        us(p99) - us(d99)
    );
    println!(
        "   added by the naive thread proxy (this machine's floor): {:.1} µs median, {:.1} µs p99",
        us(f50) - us(d50),
        us(f99) - us(d99)
    );
    println!();
}

// ---------------------------------------------------------------------------------------------
// 2. Throughput

/// The bulk stream: byte `i` is `i % 251`, repeated every [`BULK_CHUNK`] bytes, so a byte lost,
/// repeated or moved anywhere in the stream changes what the sink sees at its offset.
const BULK_CHUNK: usize = 1 << 20;

/// Made once and shared: the sender and the sink of every run use the same bytes.
fn bulk_pattern() -> &'static [u8] {
    static PATTERN: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    PATTERN.get_or_init(|| (0..BULK_CHUNK).map(|i| (i % 251) as u8).collect())
}

/// Reads to end of stream, checking every byte against [`bulk_pattern`] at its offset, then
/// answers with the count it received and whether every byte matched (8 bytes LE, then 1 or
/// 0), so the sender knows everything arrived, whole and in order.
fn sink_server() -> SocketAddr {
    serve(|mut s| {
        let pattern = bulk_pattern();
        let mut buf = vec![0u8; BULK_CHUNK];
        let (mut received, mut exact) = (0usize, true);
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mut got = &buf[..n];
            while !got.is_empty() {
                let at = received % BULK_CHUNK;
                let len = got.len().min(BULK_CHUNK - at);
                exact &= got[..len] == pattern[at..at + len];
                received += len;
                got = &got[len..];
            }
        }
        let mut verdict = (received as u64).to_le_bytes().to_vec();
        verdict.push(exact as u8);
        let _ = s.write_all(&verdict);
    })
}

/// One bulk transfer: its rate, and how busy the whole machine was meanwhile.
struct Bulk {
    bytes_per_s: f64,
    /// Busy share of all CPUs over the transfer (user, system and interrupts), 0 to 1.
    busy: f64,
    /// The sink received exactly the stream sent.
    exact: bool,
}

impl Bulk {
    /// CPU time the machine spent per GB moved (everyone's: client, proxy, sink, the kernel's
    /// softirqs), in core-milliseconds.
    fn core_ms_per_gb(&self, cores: f64) -> f64 {
        self.busy * cores * 1e3 / (self.bytes_per_s / 1e9)
    }
}

/// Total and idle jiffies of all CPUs so far (`/proc/stat`'s first line; idle counts iowait).
fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let total = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total, idle)
}

/// Sends `total` bytes of the pattern and waits for the sink's verdict.
fn bulk(addr: SocketAddr, total: usize) -> Bulk {
    let chunk = bulk_pattern();
    let (total_before, idle_before) = cpu_jiffies();
    let start = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    let mut left = total;
    while left > 0 {
        let n = left.min(chunk.len());
        s.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    s.shutdown(Shutdown::Write).unwrap();
    let mut verdict = [0u8; 9];
    let answered = s.read_exact(&mut verdict).is_ok();
    let elapsed = start.elapsed().as_secs_f64();
    let (total_after, idle_after) = cpu_jiffies();
    let jiffies = (total_after - total_before).max(1);
    let idle = idle_after - idle_before;
    let received = u64::from_le_bytes(verdict[..8].try_into().unwrap());
    Bulk {
        bytes_per_s: total as f64 / elapsed,
        busy: (jiffies - idle) as f64 / jiffies as f64,
        exact: answered && received == total as u64 && verdict[8] == 1,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// HAProxy in TCP mode with `option splice-auto` (the kernel moves the bytes through a pipe,
/// as our copy path does for bulk) and one thread per core: a mature proxy's figure on this
/// machine, beside ours. Only when `haproxy` is installed (Debian's package); stopped on drop.
struct HaProxy {
    child: Child,
    addr: SocketAddr,
}

impl HaProxy {
    fn start(upstream: SocketAddr, dir: &Path) -> Option<HaProxy> {
        let found = Command::new("haproxy")
            .arg("-v")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return None;
        }
        // A free port, released just before HAProxy binds it (it cannot announce one).
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .ok()?;
        let cores = thread::available_parallelism().map_or(1, |n| n.get());
        let config = dir.join("haproxy.cfg");
        std::fs::write(
            &config,
            format!(
                "global\n  nbthread {cores}\ndefaults\n  mode tcp\n  option splice-auto\n  \
                 timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n\
                 listen bulk\n  bind {addr}\n  server sink {upstream}\n"
            ),
        )
        .ok()?;
        // -db: stay in the foreground, so the child is HAProxy itself and dies on kill.
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let proxy = HaProxy { child, addr };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            if Instant::now() > deadline {
                eprintln!("haproxy did not start listening on {addr}; left out");
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
        Some(proxy)
    }
}

impl Drop for HaProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn throughput(bin: &Path, dir: &Path, scale: usize) {
    let sink = sink_server();
    let delay10 = write_profile(dir, "delay-10ms", "10ms");
    let local = ProxyProcess::start(bin, sink, "local", &[]);
    let delayed = ProxyProcess::start(bin, sink, &delay10, &[]);
    let delayed_big = ProxyProcess::start(bin, sink, &delay10, &["--window", "32MiB"]);
    let haproxy = HaProxy::start(sink, dir);
    let total = (2 << 30) / scale;
    let mut targets = vec![
        ("direct".to_string(), sink, total),
        ("proxy, local".to_string(), local.addr, total),
    ];
    match &haproxy {
        Some(h) => targets.push(("haproxy (splice-auto), peer".to_string(), h.addr, total)),
        None => println!("   (haproxy is not installed: its peer row is left out)"),
    }
    targets.extend([
        (
            "proxy, 10 ms delay, 4 MiB window".to_string(),
            delayed.addr,
            total / 2,
        ),
        (
            "proxy, 10 ms delay, 32 MiB window".to_string(),
            delayed_big.addr,
            total / 2,
        ),
    ]);
    let mut runs: Vec<Vec<Bulk>> = targets.iter().map(|_| Vec::new()).collect();
    for _ in 0..3 {
        for (i, (_, addr, bytes)) in targets.iter().enumerate() {
            runs[i].push(bulk(*addr, *bytes));
        }
    }
    let cores = thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
    let rate = |i: usize| median(runs[i].iter().map(|b| b.bytes_per_s).collect());
    let busy = |i: usize| median(runs[i].iter().map(|b| b.busy).collect());
    let per_gb = |i: usize| median(runs[i].iter().map(|b| b.core_ms_per_gb(cores)).collect());
    println!(
        "2. Bulk throughput, one connection (median of 3 interleaved runs; every byte checked)"
    );
    println!(
        "   {:<36} {:>9} {:>10} {:>10} {:>12} {:>8}",
        "", "MB/s", "of direct", "CPU busy", "core-ms/GB", "exact"
    );
    for (i, (name, _, _)) in targets.iter().enumerate() {
        println!(
            "   {:<36} {:>9.0} {:>9.0} % {:>8.0} % {:>12.0} {:>8}",
            name,
            rate(i) / 1e6,
            100.0 * rate(i) / rate(0),
            100.0 * busy(i),
            per_gb(i),
            if runs[i].iter().all(|b| b.exact) {
                "yes"
            } else {
                "NO"
            }
        );
    }
    // A proxy terminates the stream twice, so the kernel's TCP work per byte (most of direct's
    // CPU) is done twice; with every core busy, that alone caps any proxy at this rate.
    let ceiling = cores * 1e3 / (2.0 * per_gb(0)) * 1e9;
    println!(
        "   any proxy's ceiling here: twice direct's CPU per GB with all {cores} cores busy = {:.0} MB/s ({:.0} % of direct)",
        ceiling / 1e6,
        100.0 * ceiling / rate(0)
    );
    println!("   targets: local ≥ 90 % of direct, byte-exact; 10 ms delay ≥ 500 MB/s");
    println!(
        "   (the proxy buffers at most its window per direction: 4 MiB per 10 ms is 419 MB/s, plus"
    );
    println!(
        "   what the kernel socket buffers hold; real TCP is bound by its window the same way)"
    );
    println!();
}

fn write_profile(dir: &Path, name: &str, delay: &str) -> String {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!("name = \"{name}\"\n[link]\ndelay = \"{delay}\"\n"),
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

// ---------------------------------------------------------------------------------------------
// 3. Delay precision

/// A proxy in this process (its own runtime and threads), so its release-lateness histogram can
/// be read directly.
struct InProcessProxy {
    addr: SocketAddr,
    stats: Arc<faultrig::proxy::ProxyStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl InProcessProxy {
    fn start(upstream: SocketAddr, profile_path: &str) -> InProcessProxy {
        let profile = faultrig::profile::Profile::load(profile_path).unwrap();
        let proxy = faultrig::proxy::Proxy::new(upstream.to_string(), profile, Default::default());
        let stats = proxy.stats();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(l.local_addr().unwrap()).unwrap();
                proxy.run(l, stopped).await.unwrap();
            });
        });
        let addr = rx.recv().unwrap();
        InProcessProxy {
            addr,
            stats,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for InProcessProxy {
    fn drop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = self.thread.take().unwrap().join();
    }
}

/// Direct ping-pong after `idle` of silence each time: what the endpoints' own wake-ups cost
/// after the same idle time the delayed exchange has, with no proxy at all.
fn ping_pong_after_idle(addr: SocketAddr, idle: Duration, n: usize) -> Vec<Duration> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let (msg, mut buf) = ([42u8; 64], [0u8; 64]);
    (0..n)
        .map(|_| {
            thread::sleep(idle);
            let t = Instant::now();
            s.write_all(&msg).unwrap();
            s.read_exact(&mut buf).unwrap();
            t.elapsed()
        })
        .collect()
}

fn precision(_bin: &Path, dir: &Path, scale: usize) {
    let echo = echo_server();
    println!("3. Delay precision, 64-byte ping-pong through a delay-only profile");
    println!("   e2e error      = measured RTT − 2×delay (includes both endpoints' wake-ups)");
    println!(
        "   direct idle    = direct RTT after the same idle time, no proxy (the endpoints' share)"
    );
    println!("   release late   = proxy's write time − scheduled release time (the scheduler's own error)");
    println!(
        "   {:<7} {:>7} {:>20} {:>20} {:>20}",
        "delay", "samples", "e2e err med/p99 µs", "direct idle med/p99", "release late med/p99"
    );
    for (delay, micros, n) in [
        ("250us", 250u64, 3000),
        ("1ms", 1000, 1500),
        ("10ms", 10_000, 200),
    ] {
        let profile = write_profile(dir, &format!("delay-{delay}"), delay);
        let proxy = InProcessProxy::start(echo, &profile);
        let mut rtts = Vec::new();
        ping_pong(proxy.addr, n / scale, &mut rtts);
        let mut errors: Vec<f64> = rtts.iter().map(|r| us(*r) - 2.0 * micros as f64).collect();
        errors.sort_by(|a, b| a.total_cmp(b));
        let q = |v: &[f64], p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        let mut idle = ping_pong_after_idle(echo, Duration::from_micros(2 * micros), n / scale);
        idle.sort();
        let late = proxy.stats.downstream.lateness();
        let late_up = proxy.stats.upstream.lateness();
        let mut all = late.clone();
        all.add(&late_up).unwrap();
        println!(
            "   {:<7} {:>7} {:>9.1} / {:>8.1} {:>9.1} / {:>8.1} {:>9.1} / {:>8.1}",
            delay,
            errors.len(),
            q(&errors, 0.5),
            q(&errors, 0.99),
            us(percentile(&idle, 0.5)),
            us(percentile(&idle, 0.99)),
            all.value_at_quantile(0.5) as f64 / 1e3,
            all.value_at_quantile(0.99) as f64 / 1e3,
        );
    }
    println!("   targets: median error ≤ 20 µs, p99 ≤ 100 µs");
    println!();
}

// ---------------------------------------------------------------------------------------------
// 4. Memory

/// Accepts and holds connections, printing the running count. Runs as a child process (this
/// bench binary with `--hold-server`) so that its descriptors do not count against ours.
fn hold_server_main() {
    raise_fd_limit();
    // A deep accept queue: the proxy opens its upstream connections in a burst.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    socket.listen(4096).unwrap();
    let l: TcpListener = socket.into();
    println!("{}", l.local_addr().unwrap());
    let mut held = Vec::new();
    let mut out = std::io::stdout().lock();
    for s in l.incoming() {
        match s {
            Ok(s) => held.push(s),
            Err(e) => eprintln!("hold server: {e}"),
        }
        let _ = writeln!(out, "{}", held.len());
        let _ = out.flush();
    }
}

/// The hold server as a child process, with the count it last reported.
struct HoldServer {
    child: Child,
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

impl HoldServer {
    fn start() -> HoldServer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .arg("--hold-server")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = lines.next().unwrap().unwrap().parse().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                count.store(line.trim().parse().unwrap_or(0), Ordering::SeqCst);
            }
        });
        HoldServer {
            child,
            addr,
            accepted,
        }
    }
}

impl Drop for HoldServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fd_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .unwrap()
        .1
}

/// The floor for any tokio proxy: one task per connection, each direction waiting for its
/// socket to be readable and allocating its buffer only then. Runs as a child process (this
/// bench binary with `--floor-proxy UPSTREAM`) and prints its address as `faultrig proxy`
/// does, so both are measured the same way (it has the system allocator, faultrig mimalloc).
fn floor_proxy_main(upstream: SocketAddr) {
    raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("floor proxy listening on {}", l.local_addr().unwrap());
        loop {
            let Ok((client, _)) = l.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                tokio::join!(floor_copy(&client, &server), floor_copy(&server, &client));
            });
        }
    });
}

async fn floor_copy(from: &tokio::net::TcpStream, to: &tokio::net::TcpStream) {
    loop {
        if from.readable().await.is_err() {
            return;
        }
        let mut buf = vec![0u8; 64 << 10];
        let n = match from.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        };
        let mut data = &buf[..n];
        while !data.is_empty() {
            if to.writable().await.is_err() {
                return;
            }
            match to.try_write(data) {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    }
}

fn memory(bin: &Path, wanted: usize) {
    // Each proxy needs two descriptors per connection; where the hard limit cannot be raised
    // (no CAP_SYS_RESOURCE), hold as many as it allows and say so.
    let limit = fd_limit() as usize;
    let conns = wanted.min(limit.saturating_sub(64) / 2);
    println!("4. Proxy RSS with {conns} idle connections (client → proxy → server, all held open)");
    if conns < wanted {
        println!("   (the hard descriptor limit here is {limit}: a proxy process can hold at most {conns})");
    }
    println!(
        "   {:<34} {:>9} {:>11} {:>9} {:>14} {:>14}",
        "path", "idle KiB", "loaded KiB", "peak KiB", "KiB per conn", "at 10,000 MiB"
    );
    let faultrig = |profile: &'static str, extra: &'static [&'static str]| {
        move |upstream: SocketAddr| ProxyProcess::start(bin, upstream, profile, extra)
    };
    let floor = |upstream: SocketAddr| {
        let exe = std::env::current_exe().unwrap();
        ProxyProcess::spawn(&exe, &["--floor-proxy", &upstream.to_string()])
    };
    type Start<'a> = Box<dyn Fn(SocketAddr) -> ProxyProcess + 'a>;
    // (name, start, descriptors per connection in the proxy)
    let mut paths: Vec<(&str, Start, usize)> = vec![
        ("floor: plain tokio copy proxy", Box::new(floor), 2),
        (
            "copy (--profile local)",
            Box::new(faultrig("local", &[])),
            2,
        ),
        (
            "model (--profile lossy-10ms-1pct)",
            Box::new(faultrig("lossy-10ms-1pct", &[])),
            2,
        ),
        // A control-API proxy with no toxics: what noxious and Toxiproxy are compared on.
        (
            "API proxy, no toxics",
            Box::new(faultrig("local", &["--api", "127.0.0.1:0"])),
            2,
        ),
    ];
    // The kernel engine needs CAP_NET_ADMIN; its sockets in the namespaces are the kernel's
    // memory, not the process's, so this row is the proxy's own share.
    if nix::unistd::geteuid().is_root() {
        paths.push((
            "kernel engine (--engine kernel)",
            Box::new(faultrig("lossy-10ms-1pct", &["--engine", "kernel"])),
            4,
        ));
    }
    let all = conns;
    for (name, start, fds) in paths {
        let conns = conns.min(limit.saturating_sub(64) / fds);
        let server = HoldServer::start();
        let proxy = start(server.addr);
        thread::sleep(Duration::from_millis(200));
        let (idle, _) = proxy.rss_kib();
        let mut clients = Vec::with_capacity(conns);
        for _ in 0..conns {
            clients.push(TcpStream::connect(proxy.addr).unwrap());
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.accepted.load(Ordering::SeqCst) < conns && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        thread::sleep(Duration::from_millis(300));
        let (rss, hwm) = proxy.rss_kib();
        let reached = server.accepted.load(Ordering::SeqCst);
        let per_conn = rss.saturating_sub(idle) as f64 / conns as f64;
        println!(
            "   {:<34} {:>9} {:>11} {:>9} {:>14.1} {:>14.1}{}",
            name,
            idle,
            rss,
            hwm,
            per_conn,
            (idle as f64 + per_conn * 10_000.0) / 1024.0,
            if reached < conns {
                format!("  (only {reached} reached the server)")
            } else if conns < all {
                format!("  ({conns} connections: {fds} descriptors each)")
            } else {
                String::new()
            }
        );
        drop(clients);
    }
    println!("   target ≤ 10 KiB per connection on every path (≤ 100 MiB for 10,000)");
}

/// 10,000 connections need ~20,000 descriptors here and as many in the proxy; raise the hard
/// limit where allowed (root), else use what the hard limit permits.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let want = 1u64 << 18;
    if setrlimit(Resource::RLIMIT_NOFILE, want.max(soft), want.max(hard)).is_err() {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}
