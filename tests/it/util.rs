//! Helpers shared by the integration tests: an in-process proxy on port 0, seeded byte streams
//! with their hashes, and a runner for the real `faultrig` binary.

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use faultrig::child::Announced;
use faultrig::link::Engine;
pub use faultrig::net::Served;
use faultrig::profile::Profile;
use faultrig::proxy::{Proxy, ProxyOptions, ProxyStats};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A proxy running in this process; stopped on drop of its handle.
pub struct TestProxy {
    pub addr: SocketAddr,
    pub stats: Arc<ProxyStats>,
    served: Served,
}

impl TestProxy {
    pub async fn start(upstream: SocketAddr, profile: &str) -> TestProxy {
        Self::start_with(upstream, profile, ProxyOptions::default()).await
    }

    pub async fn start_with(
        upstream: SocketAddr,
        profile: &str,
        options: ProxyOptions,
    ) -> TestProxy {
        Self::start_full(upstream, profile, options, Engine::Model).await
    }

    /// A proxy on `engine` (the kernel engine needs root).
    pub async fn start_engine(upstream: SocketAddr, profile: &str, engine: Engine) -> TestProxy {
        Self::start_full(upstream, profile, ProxyOptions::default(), engine).await
    }

    async fn start_full(
        upstream: SocketAddr,
        profile: &str,
        options: ProxyOptions,
        engine: Engine,
    ) -> TestProxy {
        let profile = Profile::load(profile).expect("profile");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy::new(upstream.to_string(), profile, options);
        let proxy = match engine {
            Engine::Kernel => proxy.with_kernel_engine().await.expect("kernel engine"),
            _ => proxy,
        };
        let stats = proxy.stats();
        let served = Served::spawn(listener, |l, stop| proxy.run(l, stop)).unwrap();
        TestProxy {
            addr: served.addr(),
            stats,
            served,
        }
    }

    /// Stops accepting, closes every connection and waits for the proxy to return.
    pub async fn stop(self) {
        self.served.stop().await.unwrap();
    }
}

/// Writes `len` seeded random bytes in random-sized writes and returns their SHA-256.
pub async fn send_random(mut w: impl AsyncWrite + Unpin, seed: u64, len: usize) -> [u8; 32] {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut left = len;
    while left > 0 {
        let n = rng.random_range(1..=buf.len()).min(left);
        rng.fill_bytes(&mut buf[..n]);
        hash.update(&buf[..n]);
        w.write_all(&buf[..n]).await.expect("write");
        left -= n;
    }
    w.shutdown().await.expect("shutdown");
    hash.finalize().into()
}

/// Reads to end of stream; returns the byte count and SHA-256.
pub async fn hash_to_eof(mut r: impl AsyncRead + Unpin) -> (usize, [u8; 32]) {
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        let n = r.read(&mut buf).await.expect("read");
        if n == 0 {
            return (total, hash.finalize().into());
        }
        hash.update(&buf[..n]);
        total += n;
    }
}

/// A loopback listener on a free port.
pub async fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

/// An address nothing listens on: a loopback port bound without listening and held until
/// dropped, so no test running meanwhile can be given it. Connections to it are refused.
pub struct DeadAddr {
    _held: socket2::Socket,
    pub addr: SocketAddr,
}

pub fn dead_addr() -> DeadAddr {
    use socket2::{Domain, Socket, Type};
    let held = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    held.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let addr = held.local_addr().unwrap().as_socket().unwrap();
    DeadAddr { _held: held, addr }
}

/// Echoes every connection until the listener is dropped with the task.
pub fn spawn_echo(l: TcpListener) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    })
}

/// Generous bound for anything that should be prompt.
pub const PROMPT: Duration = Duration::from_secs(10);

/// Longest a `faultrig` command run by a test may take (the longest, a small experiment, takes
/// well under a minute): a hang fails its test with the output so far, not the whole suite.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(300);

/// Longest a child may take to announce its address.
pub const STARTUP_DEADLINE: Duration = Duration::from_secs(60);

/// Runs the real `faultrig` binary to completion, within [`COMMAND_DEADLINE`].
pub fn faultrig(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_faultrig"));
    command.args(args);
    output_within(command, COMMAND_DEADLINE)
}

/// `command.output()`, but a command still running after `deadline` is killed and the test
/// panics with what it wrote.
pub fn output_within(mut command: Command, deadline: Duration) -> Output {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
    // Drained while the child runs, so a chatty child never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    match status {
        Some(status) => Output {
            status,
            stdout,
            stderr,
        },
        None => panic!(
            "{command:?} still running after {deadline:?}; killed. stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}

/// A scratch directory removed on drop.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// A child process that announced `listening on ADDR`; stopped on drop.
pub struct Listening(Announced);

impl std::ops::Deref for Listening {
    type Target = Announced;

    fn deref(&self) -> &Announced {
        &self.0
    }
}

impl std::ops::DerefMut for Listening {
    fn deref_mut(&mut self) -> &mut Announced {
        &mut self.0
    }
}

impl Listening {
    /// Starts `faultrig ARGS` and waits for its address line.
    pub fn start(args: &[&str]) -> Listening {
        let mut command = Command::new(env!("CARGO_BIN_EXE_faultrig"));
        command.args(args);
        Listening::spawn(command)
    }

    /// Starts `command` and waits for its address line.
    pub fn spawn(command: Command) -> Listening {
        Listening::spawn_logging(command, std::process::Stdio::null())
    }

    /// [`Listening::spawn`], its standard error going to `stderr`. A child that says nothing
    /// within [`STARTUP_DEADLINE`] is stopped, and the test panics.
    pub fn spawn_logging(mut command: Command, stderr: std::process::Stdio) -> Listening {
        command.stderr(stderr);
        let what = format!("{command:?}");
        Listening(
            Announced::spawn(command, STARTUP_DEADLINE).unwrap_or_else(|e| panic!("{what}: {e}")),
        )
    }
}

/// The Python of the virtualenv scripts/test.sh fills with the PyPI packages the tests use.
pub fn venv_python() -> &'static str {
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/target/py-venv/bin/python");
    assert!(
        std::path::Path::new(python).exists(),
        "{python} is missing: run scripts/test.sh, which installs the PyPI packages into it"
    );
    python
}

/// A finished `faultrig run` of an experiment file written into a scratch directory.
pub struct FinishedRun {
    pub stdout: String,
    /// OUT/RUN_ID: the CSV and report.html.
    pub dir: std::path::PathBuf,
    pub rows: Vec<faultrig::results::Row>,
    _scratch: tempfile::TempDir,
}

/// Asserts a process succeeded, showing its output if not; returns its stdout.
pub fn succeeded(o: &Output) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

/// The one run directory under `out`, and the rows of its CSV.
pub fn only_run(out: &std::path::Path) -> (std::path::PathBuf, Vec<faultrig::results::Row>) {
    let dir = std::fs::read_dir(out)
        .unwrap()
        .next()
        .expect("a run directory")
        .unwrap()
        .path();
    let rows = faultrig::results::read(&dir.join("results.csv")).unwrap();
    (dir, rows)
}

/// A `faultrig run` of an experiment file written into a scratch directory, however it ended.
pub struct Ran {
    pub output: Output,
    /// Its `--out` directory, inside `scratch`.
    pub out: std::path::PathBuf,
    pub scratch: tempfile::TempDir,
}

/// Writes `experiment` to a file in a scratch directory and runs it with `extra` flags, its
/// output going into that directory too; asserts nothing.
pub fn run_experiment_file(experiment: &str, extra: &[&str]) -> Ran {
    let scratch = tempdir();
    let file = scratch.path().join("experiment.toml");
    std::fs::write(&file, experiment).unwrap();
    let out = scratch.path().join("out");
    let mut args = vec![
        "run",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    let output = faultrig(&args);
    Ran {
        output,
        out,
        scratch,
    }
}

/// Writes `experiment` to a file, runs it with `extra` flags, asserts success, reads its CSV.
pub fn run_experiment(experiment: &str, extra: &[&str]) -> FinishedRun {
    let Ran {
        output,
        out,
        scratch,
    } = run_experiment_file(experiment, extra);
    let stdout = succeeded(&output);
    let (dir, rows) = only_run(&out);
    FinishedRun {
        stdout,
        dir,
        rows,
        _scratch: scratch,
    }
}

/// A process as /proc shows it: pid and start time (so a reused pid is not mistaken for it).
pub type Proc = (u32, u64);

/// Field `n` (1-based, after the command name) of /proc/PID/stat.
fn stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(n - 3).map(str::to_string)
}

/// Every descendant of `pid`, alive now.
pub fn descendants(pid: u32) -> Vec<Proc> {
    let all: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| {
            let ppid = stat_field(p, 4)?.parse().ok()?;
            let start = stat_field(p, 22)?.parse().ok()?;
            Some((p, ppid, start))
        })
        .collect();
    let mut found: Vec<Proc> = Vec::new();
    let mut parents = vec![pid];
    while let Some(parent) = parents.pop() {
        for &(p, ppid, start) in &all {
            if ppid == parent && !found.iter().any(|&(f, _)| f == p) {
                found.push((p, start));
                parents.push(p);
            }
        }
    }
    found
}

/// Still running: same pid, same start, and not a zombie.
pub fn running(&(pid, start): &Proc) -> bool {
    stat_field(pid, 22).and_then(|s| s.parse::<u64>().ok()) == Some(start)
        && stat_field(pid, 3).as_deref() != Some("Z")
}

/// Starts `faultrig run` on `experiment` (written into a scratch directory, which also holds its
/// output), quietly, in the background.
pub fn start_run(experiment: &str) -> (tempfile::TempDir, std::process::Child) {
    let scratch = tempdir();
    let file = scratch.path().join("e.toml");
    std::fs::write(&file, experiment).unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_faultrig"))
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(scratch.path().join("out"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    (scratch, run)
}

/// Marks a test that cannot run here as skipped: libtest has no skipped status, so the test
/// passes, prints `SKIPPED: TEST: REASON` (shown with `--nocapture`), and appends the same line
/// to the file `FAULTRIG_SKIPS` names, from which scripts/test.sh prints a summary after the run.
pub fn skip(test: &str, reason: &str) {
    use std::io::Write;
    let line = format!("SKIPPED: {test}: {reason}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("FAULTRIG_SKIPS") {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path);
        if let Ok(mut file) = file {
            let _ = writeln!(file, "{line}");
        }
    }
}

/// True when the test can create network namespaces (it runs as root, as CI runs the tests);
/// otherwise reports `test` skipped ([`skip`]).
pub fn privileged(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    skip(
        test,
        "the link engine needs root (CAP_NET_ADMIN); CI runs as root",
    );
    false
}

/// Runs `faultrig ARGS` without CAP_NET_ADMIN and asserts it refuses in one message naming the
/// privilege, with exit code 2. As root it drops to nobody; elsewhere it runs without it already.
pub fn refused_without_the_privilege(args: &[&str]) {
    let binary = env!("CARGO_BIN_EXE_faultrig");
    let mut command = if nix::unistd::geteuid().is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", binary]);
        c
    } else {
        Command::new(binary)
    };
    command.args(args);
    let out = output_within(command, COMMAND_DEADLINE);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("CAP_NET_ADMIN"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one message: {stderr}");
}

/// POSTs `raw` to the HTTP server at `addr` as it is (bytes a client library could not send)
/// and returns the whole answer, status line and headers included.
pub async fn raw_post(addr: &str, path: &str, raw: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{raw}",
        raw.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    answer
}

/// One 64-byte exchange with an echo behind `conn`: how long it took (within [`PROMPT`]).
pub async fn exchange(conn: &mut tokio::net::TcpStream) -> Duration {
    let start = std::time::Instant::now();
    conn.write_all(&[4u8; 64]).await.unwrap();
    let mut buf = [0u8; 64];
    tokio::time::timeout(PROMPT, conn.read_exact(&mut buf))
        .await
        .expect("echoed in time")
        .unwrap();
    assert_eq!(buf, [4u8; 64]);
    start.elapsed()
}

/// Starts `experiment` with `faultrig run`, waits until it has `at_least` processes under it
/// and is past its set-up, sends it `signal`, and checks every one of those processes is gone
/// soon after: the run cleans up on SIGTERM, and its children follow it on SIGKILL.
pub fn stopping_a_run_leaves_nothing_behind(
    experiment: &str,
    signal: nix::sys::signal::Signal,
    at_least: usize,
) {
    let (_scratch, mut run) = start_run(experiment);
    let runner = run.id();
    let deadline = std::time::Instant::now() + 3 * PROMPT;
    let children = loop {
        let found = descendants(runner);
        if found.len() >= at_least {
            break found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{signal}: the run started only {found:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // Past the set-up: the first cell is running.
    std::thread::sleep(Duration::from_millis(500));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(runner as i32), signal).unwrap();
    run.wait().unwrap();
    let deadline = std::time::Instant::now() + PROMPT;
    loop {
        let left: Vec<&Proc> = children.iter().filter(|p| running(p)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{signal}: left behind {left:?} of {children:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
