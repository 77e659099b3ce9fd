//! External flavours: an RPC framework in any language, measured by `faultrig run` behind the
//! fault proxy like the built-in flavours. An experiment's `[external.NAME]` table gives two
//! command lines: `serve` (optional; or `target = "HOST:PORT"` of a server already running)
//! and `client`, run once per cell with the cell's values filled into placeholders. The client
//! reports each call as one line on its standard output (docs/runner.md, "External flavours").
//!
//! This module is the pure part: the table checked, command lines split and filled, the output
//! format parsed and tallied. Starting and stopping the processes is the runner's
//! (`src/runner/external.rs`).

use std::collections::VecDeque;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Deserialize;

use crate::flavour::{Failure, FailureCounts};
use crate::results::new_histogram;

/// An `[external.NAME]` table as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalFile {
    /// The server's command line; started once per server the run needs.
    pub serve: Option<String>,
    /// `HOST:PORT` of a server already running, instead of `serve`.
    pub target: Option<String>,
    /// The client's command line, run once per cell.
    pub client: Option<String>,
}

/// A value the runner fills into a command line, written `{name}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placeholder {
    /// `serve`: the loopback address the server must listen on (`127.0.0.1`); `client`: the
    /// proxy's host.
    Host,
    /// `serve`: the free loopback port the server must listen on; `client`: the proxy's port.
    Port,
    /// `client`: `HOST:PORT` of the cell's fault proxy, in front of the server.
    Target,
    /// The cell's connection mode as written in the experiment (`single`, `per-call`, ...).
    Mode,
    /// Calls to make in the measured phase; 0 when the experiment gives a duration.
    Calls,
    /// Milliseconds the measured phase lasts; 0 when the experiment gives a call count.
    DurationMs,
    /// Concurrent workers.
    Concurrency,
    /// The workload as written (`order`, `blob:1KiB`, ...).
    Workload,
    Seed,
    /// The limit for one call, ms.
    TimeoutMs,
    /// Unrecorded warm-up before the measured calls, ms.
    WarmupMs,
    /// `true` or `false`: TCP_NODELAY on the sockets.
    Nodelay,
    /// `one` or `split`: how requests are written.
    WritePattern,
    /// The cell's profile name.
    Profile,
}

impl Placeholder {
    pub const ALL: [Placeholder; 14] = [
        Placeholder::Host,
        Placeholder::Port,
        Placeholder::Target,
        Placeholder::Mode,
        Placeholder::Calls,
        Placeholder::DurationMs,
        Placeholder::Concurrency,
        Placeholder::Workload,
        Placeholder::Seed,
        Placeholder::TimeoutMs,
        Placeholder::WarmupMs,
        Placeholder::Nodelay,
        Placeholder::WritePattern,
        Placeholder::Profile,
    ];

    /// What `serve` may name: where to listen, and the one server-side axis.
    pub(crate) const SERVE: [Placeholder; 3] =
        [Placeholder::Host, Placeholder::Port, Placeholder::Nodelay];

    pub fn name(self) -> &'static str {
        match self {
            Placeholder::Host => "host",
            Placeholder::Port => "port",
            Placeholder::Target => "target",
            Placeholder::Mode => "mode",
            Placeholder::Calls => "calls",
            Placeholder::DurationMs => "duration_ms",
            Placeholder::Concurrency => "concurrency",
            Placeholder::Workload => "workload",
            Placeholder::Seed => "seed",
            Placeholder::TimeoutMs => "timeout_ms",
            Placeholder::WarmupMs => "warmup_ms",
            Placeholder::Nodelay => "nodelay",
            Placeholder::WritePattern => "write_pattern",
            Placeholder::Profile => "profile",
        }
    }

    fn by_name(name: &str) -> Option<Placeholder> {
        Placeholder::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// Why a command line was refused.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum CommandLineError {
    #[error("cannot split {0:?} into words (an unclosed quote?)")]
    Split(String),
    #[error("is empty")]
    Empty,
    #[error("unknown placeholder {{{name}}} (use {allowed}; {{{{ and }}}} for braces)")]
    Unknown { name: String, allowed: String },
    #[error("a {{ without its }} in {0:?} (write {{{{ for a brace)")]
    Unclosed(String),
    #[error("a }} without its {{ in {0:?} (write }}}} for a brace)")]
    Stray(String),
}

/// A command line split into words as a POSIX shell would (quotes, backslashes), but never
/// run by a shell: each word may hold placeholders, filled per use.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandLine {
    words: Vec<String>,
}

impl CommandLine {
    /// Splits `text` and checks every placeholder is in `allowed`.
    pub fn parse(text: &str, allowed: &[Placeholder]) -> Result<CommandLine, CommandLineError> {
        let words = shlex::split(text).ok_or_else(|| CommandLineError::Split(text.to_string()))?;
        if words.is_empty() {
            return Err(CommandLineError::Empty);
        }
        for w in &words {
            expand(w, |name| match Placeholder::by_name(name) {
                Some(p) if allowed.contains(&p) => Ok(String::new()),
                _ => Err(CommandLineError::Unknown {
                    name: name.to_string(),
                    allowed: allowed
                        .iter()
                        .map(|p| format!("{{{}}}", p.name()))
                        .collect::<Vec<_>>()
                        .join(", "),
                }),
            })?;
        }
        Ok(CommandLine { words })
    }

    /// The argv with every placeholder replaced by `value`'s answer.
    pub(crate) fn fill(&self, value: impl Fn(Placeholder) -> String) -> Vec<String> {
        self.words
            .iter()
            .map(|w| {
                expand(w, |name| {
                    Ok::<_, CommandLineError>(value(
                        Placeholder::by_name(name).expect("checked when parsed"),
                    ))
                })
                .expect("checked when parsed")
            })
            .collect()
    }
}

/// `word` with each `{name}` replaced by `slot(name)`, `{{` and `}}` by single braces: one
/// scanner for checking (at parse) and filling (per use), so they cannot disagree.
fn expand<E: From<CommandLineError>>(
    word: &str,
    mut slot: impl FnMut(&str) -> Result<String, E>,
) -> Result<String, E> {
    let mut out = String::new();
    let mut rest = word;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let brace = rest.as_bytes()[i];
        let after = &rest[i + 1..];
        if after.as_bytes().first() == Some(&brace) {
            out.push(brace as char);
            rest = &after[1..];
        } else if brace == b'}' {
            return Err(CommandLineError::Stray(word.to_string()).into());
        } else {
            let end = after
                .find('}')
                .ok_or_else(|| CommandLineError::Unclosed(word.to_string()))?;
            out.push_str(&slot(&after[..end])?);
            rest = &after[end + 1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Where an external flavour's server comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ExternalServer {
    /// Started by the runner on a free loopback port ([`Placeholder::SERVE`]).
    Serve(CommandLine),
    /// Already running at `HOST:PORT`.
    Target(String),
}

/// A checked `[external.NAME]` table.
#[derive(Clone, Debug, PartialEq)]
pub struct ExternalFlavour {
    pub name: String,
    pub server: ExternalServer,
    pub client: CommandLine,
}

/// Checks the name of a flavour an experiment file defines (an `[external.NAME]` table or a
/// `[[targets]]` entry): it goes into CSV rows and file names, and must not pass for a
/// built-in flavour.
pub(crate) fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(NameError::Characters(name.to_string()));
    }
    if crate::flavour::by_name(name).is_some() {
        return Err(NameError::Builtin(name.to_string()));
    }
    Ok(())
}

/// Why a name cannot be a flavour an experiment file defines ([`check_name`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NameError {
    #[error("the name \"{0}\" must be letters, digits, '-', '_' or '.'")]
    Characters(String),
    #[error("\"{0}\" is a built-in flavour; give yours another name")]
    Builtin(String),
}

impl ExternalFlavour {
    /// Checks the table `[external.NAME]`; an error names the key at fault (`serve`,
    /// `client`, `target`, or empty for the table itself) and why.
    pub fn check(
        name: &str,
        file: ExternalFile,
    ) -> Result<ExternalFlavour, (&'static str, String)> {
        check_name(name).map_err(|e| ("", e.to_string()))?;
        let client = file.client.ok_or((
            "client",
            "missing: the command line run per cell (see docs/runner.md)".to_string(),
        ))?;
        let client = CommandLine::parse(&client, &Placeholder::ALL)
            .map_err(|e| ("client", e.to_string()))?;
        let server = match (file.serve, file.target) {
            (Some(_), Some(_)) => return Err((
                "target",
                "give serve (the runner starts the server) or target (it runs already), not both"
                    .into(),
            )),
            (Some(serve), None) => ExternalServer::Serve(
                CommandLine::parse(&serve, &Placeholder::SERVE)
                    .map_err(|e| ("serve", e.to_string()))?,
            ),
            (None, Some(target)) => {
                crate::net::split_host_port(&target).map_err(|e| ("target", e))?;
                ExternalServer::Target(target)
            }
            (None, None) => {
                return Err((
                    "serve",
                    "missing: give serve (a command line with {port}) or target = \"HOST:PORT\""
                        .into(),
                ))
            }
        };
        Ok(ExternalFlavour {
            name: name.to_string(),
            server,
            client,
        })
    }
}

/// The longest line a client may print; a longer one is garbage (and no client can make the
/// runner hold an unbounded line).
pub(crate) const MAX_LINE: usize = 4096;

/// One line of a client's standard output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Line {
    /// `LATENCY_US OUTCOME`: one call; `failure` is `None` for `ok`.
    Call {
        latency_us: u64,
        failure: Option<Failure>,
    },
    /// `conns N`: connections the client opened in the measured phase.
    Conns(u64),
    /// `begin`: the measured phase starts here; calls before it were warm-up.
    Begin,
    /// Blank, or a `#` comment.
    Ignored,
}

/// Why a client's output line is not one of ours.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LineError {
    #[error("conns {0:?} is not a count")]
    Conns(String),
    #[error("{0:?} is not a latency in whole µs")]
    Latency(String),
    #[error("{word:?} is not an outcome ({known})", known = outcomes())]
    Outcome { word: String },
    #[error(
        "expected `LATENCY_US OUTCOME` ({}), `conns N`, `begin` or `# comment`",
        outcomes()
    )]
    Shape,
}

impl Line {
    /// Parses one line; `Err` says why it is not one of ours.
    pub fn parse(line: &str) -> Result<Line, LineError> {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return Ok(Line::Ignored);
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["begin"] => Ok(Line::Begin),
            ["conns", n] => n
                .parse()
                .map(Line::Conns)
                .map_err(|_| LineError::Conns(n.to_string())),
            [latency, outcome] => {
                let latency_us = latency
                    .parse()
                    .map_err(|_| LineError::Latency(latency.to_string()))?;
                let failure = match outcome {
                    "ok" => None,
                    word => Some(
                        Failure::ALL
                            .into_iter()
                            .find(|f| f.label() == word)
                            .ok_or_else(|| LineError::Outcome {
                                word: word.to_string(),
                            })?,
                    ),
                };
                Ok(Line::Call {
                    latency_us,
                    failure,
                })
            }
            _ => Err(LineError::Shape),
        }
    }
}

/// The outcome words: `ok` and the CSV's failure kinds.
fn outcomes() -> String {
    let mut words = vec!["ok"];
    words.extend(Failure::ALL.iter().map(|f| f.label()));
    words.join(", ")
}

/// What a client's lines add up to, for the measured phase.
#[derive(Debug)]
pub(crate) struct Tally {
    pub ok: u64,
    pub errors: FailureCounts,
    /// Latencies of the successful calls, µs (as faultrig's own clients record them).
    pub latency: Histogram<u64>,
    /// What the client said with `conns N`, if it did.
    pub conns: Option<u64>,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            ok: 0,
            errors: FailureCounts::default(),
            latency: new_histogram(),
            conns: None,
        }
    }
}

impl Tally {
    /// Counts one call or `conns` line; `begin` starts again (what came before was warm-up).
    pub fn add(&mut self, line: Line) {
        match line {
            Line::Call {
                latency_us,
                failure: None,
            } => {
                self.latency.saturating_record(latency_us.max(1));
                self.ok += 1;
            }
            Line::Call {
                failure: Some(f), ..
            } => self.errors[f] += 1,
            Line::Conns(n) => self.conns = Some(n),
            Line::Begin => *self = Tally::default(),
            Line::Ignored => {}
        }
    }

    pub fn calls(&self) -> u64 {
        self.ok + self.errors.total()
    }
}

/// The last lines a process wrote to its standard error, for a failure's message.
#[derive(Debug, Default)]
pub struct Tail {
    lines: VecDeque<String>,
}

impl Tail {
    const LINES: usize = 8;
    /// Per line: a process that writes one endless line still leaves a short message.
    const WIDTH: usize = 300;

    pub fn push(&mut self, line: &str) {
        let mut line = line.trim_end().to_string();
        if line.len() > Tail::WIDTH {
            let mut cut = Tail::WIDTH;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        if self.lines.len() == Tail::LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    /// `; its stderr ends: A | B`, or nothing when it wrote nothing.
    pub(crate) fn describe(&self) -> String {
        if self.lines.is_empty() {
            return String::new();
        }
        let lines: Vec<&str> = self.lines.iter().map(String::as_str).collect();
        format!("; its stderr ends: {}", lines.join(" | "))
    }
}

/// How long a cell's client may run: its warm-up, then its calls at worst one timeout each per
/// worker (or its duration plus one timeout), plus `grace` to start and stop.
pub(crate) fn client_limit(
    stop: crate::bench::Stop,
    warmup: Duration,
    timeout: Duration,
    concurrency: usize,
    grace: Duration,
) -> Duration {
    let measured = match stop {
        crate::bench::Stop::Calls(n) => {
            let rounds = n.div_ceil(concurrency.max(1) as u64);
            timeout.saturating_mul(u32::try_from(rounds).unwrap_or(u32::MAX))
        }
        crate::bench::Stop::Duration(d) => d.saturating_add(timeout),
    };
    warmup.saturating_add(measured).saturating_add(grace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_split_like_a_shell_and_fill_their_placeholders() {
        let t = CommandLine::parse(
            "java -jar 'my rig.jar' --target={target} --calls {calls} --json '{{\"a\": 1}}'",
            &Placeholder::ALL,
        )
        .unwrap();
        let argv = t.fill(|p| match p {
            Placeholder::Target => "127.0.0.1:9".into(),
            Placeholder::Calls => "100".into(),
            _ => unreachable!("not in the line"),
        });
        assert_eq!(
            argv,
            [
                "java",
                "-jar",
                "my rig.jar",
                "--target=127.0.0.1:9",
                "--calls",
                "100",
                "--json",
                "{\"a\": 1}"
            ]
        );
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        let serve = |s: &str| CommandLine::parse(s, &Placeholder::SERVE).unwrap_err();
        match serve("srv --port {prot}") {
            CommandLineError::Unknown { name, allowed } => {
                assert_eq!(name, "prot");
                assert_eq!(allowed, "{host}, {port}, {nodelay}");
            }
            e => panic!("{e}"),
        }
        // {target} is the client's, not the server's.
        assert!(matches!(
            serve("srv {target}"),
            CommandLineError::Unknown { .. }
        ));
        assert!(matches!(serve("srv {port"), CommandLineError::Unclosed(_)));
        assert!(matches!(serve("srv port}"), CommandLineError::Stray(_)));
        assert!(matches!(serve("srv 'unclosed"), CommandLineError::Split(_)));
        assert_eq!(serve("   "), CommandLineError::Empty);
        let e = serve("srv {prot}").to_string();
        assert!(e.contains("unknown placeholder {prot} (use {host}"), "{e}");
    }

    #[test]
    fn a_table_needs_a_client_and_one_server_source() {
        let file = |serve: Option<&str>, target: Option<&str>, client: Option<&str>| ExternalFile {
            serve: serve.map(Into::into),
            target: target.map(Into::into),
            client: client.map(Into::into),
        };
        let ok = ExternalFlavour::check(
            "echo-py",
            file(Some("srv {port}"), None, Some("c {target}")),
        );
        assert!(matches!(ok.unwrap().server, ExternalServer::Serve(_)));
        let given = ExternalFlavour::check("x", file(None, Some("10.0.0.1:80"), Some("c")));
        assert_eq!(
            given.unwrap().server,
            ExternalServer::Target("10.0.0.1:80".into())
        );
        for (f, key) in [
            (file(Some("s"), None, None), "client"),
            (file(None, None, Some("c")), "serve"),
            (file(Some("s"), Some("h:1"), Some("c")), "target"),
            (file(None, Some("nohost"), Some("c")), "target"),
            (file(Some("s {target}"), None, Some("c")), "serve"),
            (file(Some("s"), None, Some("c {bogus}")), "client"),
        ] {
            let e = ExternalFlavour::check("x", f.clone()).unwrap_err();
            assert_eq!(e.0, key, "{f:?}: {}", e.1);
        }
        let shadow = ExternalFlavour::check("grpc", file(Some("s"), None, Some("c")));
        assert!(shadow.unwrap_err().1.contains("built-in"));
        assert!(ExternalFlavour::check("a b", file(Some("s"), None, Some("c"))).is_err());
    }

    #[test]
    fn client_lines_are_calls_counts_or_garbage() {
        assert_eq!(
            Line::parse("1234 ok"),
            Ok(Line::Call {
                latency_us: 1234,
                failure: None
            })
        );
        assert_eq!(
            Line::parse("  99\ttimeout "),
            Ok(Line::Call {
                latency_us: 99,
                failure: Some(Failure::Timeout)
            })
        );
        assert_eq!(Line::parse("conns 7"), Ok(Line::Conns(7)));
        assert_eq!(Line::parse("begin"), Ok(Line::Begin));
        assert_eq!(Line::parse("# warming up"), Ok(Line::Ignored));
        assert_eq!(Line::parse(""), Ok(Line::Ignored));
        for garbage in [
            "hello world",
            "12.5 ok",
            "-3 ok",
            "12 fine",
            "conns many",
            "1 2 3",
            "Traceback (most recent call last):",
        ] {
            assert!(Line::parse(garbage).is_err(), "{garbage}");
        }
        let e = Line::parse("12 fine").unwrap_err().to_string();
        assert!(
            e.contains("ok, connect, timeout, reset, protocol, other"),
            "{e}"
        );
    }

    #[test]
    fn a_tally_counts_the_measured_calls_only() {
        let mut t = Tally::default();
        for l in [
            "5 ok", "conns 3", "begin", "10 ok", "30 ok", "7 reset", "9 reset", "conns 2",
        ] {
            t.add(Line::parse(l).unwrap());
        }
        assert_eq!(
            (t.ok, t.errors.reset, t.calls(), t.conns),
            (2, 2, 4, Some(2))
        );
        assert_eq!((t.latency.min(), t.latency.max()), (10, 30));
    }

    #[test]
    fn a_tail_keeps_the_last_short_lines() {
        let mut t = Tail::default();
        assert_eq!(t.describe(), "");
        for i in 0..20 {
            t.push(&format!("line {i}\n"));
        }
        t.push(&"é".repeat(400));
        let d = t.describe();
        assert!(d.starts_with("; its stderr ends: line 13 | "), "{d}");
        assert!(d.ends_with('…') && !d.contains("line 12"), "{d}");
    }

    #[test]
    fn a_client_may_run_for_its_calls_at_one_timeout_each() {
        let s = Duration::from_secs;
        let limit = |stop, conc| client_limit(stop, s(1), s(10), conc, s(30));
        assert_eq!(limit(crate::bench::Stop::Calls(100), 10), s(1 + 100 + 30));
        assert_eq!(limit(crate::bench::Stop::Duration(s(5)), 4), s(1 + 15 + 30));
        // Never an overflow, whatever the experiment asks.
        let huge = limit(crate::bench::Stop::Calls(crate::bench::MAX_CALLS), 1);
        assert!(huge > s(1_000_000));
    }
}
