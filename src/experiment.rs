//! Experiment files: the axes of a matrix of cells (profiles × flavours × modes × workloads ×
//! concurrency), how long each cell runs and how often. Parsed and validated completely before
//! any traffic, so a typo costs a message, not a half-finished run.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use std::sync::Arc;

use crate::bench::{Mode, Stop, DEFAULT_CALL_TIMEOUT, MAX_CALLS, MAX_CONCURRENCY};
use crate::external::{ExternalFile, ExternalFlavour};
use crate::flavour::{self, Flavour, WritePattern};
use crate::link::Engine;
use crate::profile::Profile;
use crate::report::RoundSummary;
use crate::service::Backend;
use crate::toxic::ProfileAttributes;
use crate::units::parse_duration;
use crate::workload::Workload;

/// The default experiment: what `faultrig run` does with no file.
pub(crate) const DEFAULT: &str = include_str!("../scripts/lan-compare.toml");

/// A validated experiment.
#[derive(Clone, Debug)]
pub struct Experiment {
    pub name: String,
    pub profiles: Vec<Profile>,
    pub flavours: Vec<CellFlavour>,
    pub modes: Vec<Mode>,
    pub workloads: Vec<CellWorkload>,
    pub concurrency: Vec<usize>,
    pub stop: Stop,
    pub warmup: Duration,
    pub rounds: u32,
    /// How the report combines a cell's rounds.
    pub round_summary: RoundSummary,
    pub seed: u64,
    pub timeout: Duration,
    /// How the network is emulated: the fault model, the proxy's kernel engine, or the link
    /// engine between the endpoints' own sockets.
    pub engine: Engine,
    /// TCP_NODELAY on the client's and servers' sockets: an axis.
    pub nodelay: Vec<bool>,
    /// How clients write a request: an axis.
    pub write_patterns: Vec<WritePattern>,
    /// Servers and the fault proxy on other hosts; `None` runs everything locally.
    pub remote: Option<Remote>,
}

/// Where a remote run's servers and fault proxy are. The runner starts nothing: it creates one
/// proxy per flavour through the proxy host's control API, switches its profile per cell, and
/// reads its counters there.
#[derive(Clone, Debug, PartialEq)]
pub struct Remote {
    /// The control API of `faultrig proxy --api` on the proxy host, `HOST:PORT`.
    pub api: String,
    /// Host the proxies listen on (the address clients reach the proxy host by).
    pub listen_host: String,
    /// 0: any free port; otherwise the first of consecutive ports, one per flavour in order, for
    /// firewalls that open fixed ports.
    pub listen_port: u16,
    /// Each flavour's server (`faultrig serve` or any peer of that flavour), as the proxy host
    /// reaches it; in the order of `Experiment::flavours`.
    pub servers: Vec<String>,
    /// For each profile, the `profile` toxic's attributes that make it on the proxy host: a
    /// built-in's name, or a profile file's whole text (the proxy host need not have the file).
    pub profile_toxics: Vec<ProfileAttributes>,
}

/// The `[remote]` table of an experiment file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RemoteFile {
    /// `HOST:PORT` of the proxy host's control API.
    pub api: Option<String>,
    /// `HOST:PORT` the proxies listen on; default: the API's host, any free port.
    pub listen: Option<String>,
    /// Flavour name → `HOST:PORT` of its server.
    pub servers: Option<BTreeMap<String, String>>,
}

/// What a cell's server does after each `Deduct`.
#[derive(Clone, Debug, PartialEq)]
pub enum BackendSpec {
    /// Passed to `faultrig serve --backend` as it is.
    Given(Backend),
    /// A private redis-server the runner starts for the run (`deduct@redis`).
    LocalRedis,
}

/// A workload as an experiment names it. `deduct@sleep:2ms`, `deduct@redis` or
/// `deduct@redis://HOST:PORT` add a backend call to every deduct: that changes the server,
/// not the call, so the runner gives each distinct backend its own servers.
#[derive(Clone, Debug, PartialEq)]
pub struct CellWorkload {
    pub workload: Workload,
    pub backend: BackendSpec,
    /// The name in the CSV's `workload` column and the report, e.g. `deduct@sleep:2ms`.
    pub label: String,
}

impl CellWorkload {
    pub fn parse(s: &str) -> Result<CellWorkload, String> {
        let (workload, backend) = match s.split_once('@') {
            None => (Workload::parse(s)?, BackendSpec::Given(Backend::None)),
            Some((w, d)) => {
                let workload = Workload::parse(w)?;
                if workload != Workload::Deduct {
                    return Err(format!(
                        "\"{s}\": only deduct calls a backend (deduct@sleep:DUR, deduct@redis)"
                    ));
                }
                let backend = match d {
                    "redis" => BackendSpec::LocalRedis,
                    d => BackendSpec::Given(Backend::parse(d)?),
                };
                (workload, backend)
            }
        };
        let label = match &backend {
            BackendSpec::Given(Backend::None) => workload.to_string(),
            BackendSpec::Given(d) => format!("{workload}@{d}"),
            BackendSpec::LocalRedis => format!("{workload}@redis"),
        };
        Ok(CellWorkload {
            workload,
            backend,
            label,
        })
    }
}

/// What a cell's calls are made with: one of faultrig's flavours, or a framework in any
/// language run as a server and a client process ([`crate::external`]). The runner asks it
/// how its server starts and how a cell runs against an address, so another kind of target
/// is one more variant.
#[derive(Clone, Debug)]
pub enum CellFlavour {
    Builtin(&'static dyn Flavour),
    External(Arc<ExternalFlavour>),
    /// A gRPC service or HTTP endpoint of the user's, already running, driven by the load
    /// driver like a built-in flavour (a `[[targets]]` entry).
    Target(Arc<TargetFlavour>),
}

impl CellFlavour {
    /// The name in the CSV's `flavour` column.
    pub fn name(&self) -> &str {
        match self {
            CellFlavour::Builtin(f) => f.name(),
            CellFlavour::External(x) => &x.name,
            CellFlavour::Target(t) => &t.name,
        }
    }

    /// The built-in flavour, for what only they can do (remote runs, the link engine).
    pub fn builtin(&self) -> Option<&'static dyn Flavour> {
        match self {
            CellFlavour::Builtin(f) => Some(*f),
            CellFlavour::External(_) | CellFlavour::Target(_) => None,
        }
    }

    /// What kind of flavour this is, in messages.
    pub fn kind(&self) -> &'static str {
        match self {
            CellFlavour::Builtin(_) => "flavour",
            CellFlavour::External(_) => "external flavour",
            CellFlavour::Target(_) => "target",
        }
    }
}

/// A `[[targets]]` entry: any gRPC service or HTTP endpoint ([`crate::target`]), resolved
/// (protos compiled or reflected, data checked) when the experiment is validated.
pub struct TargetFlavour {
    pub name: String,
    /// Where the service listens: the cell's proxy forwards there.
    pub address: String,
    /// How its calls are made and checked.
    pub load: Arc<dyn crate::bench::Target>,
}

impl std::fmt::Debug for TargetFlavour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetFlavour")
            .field("name", &self.name)
            .field("address", &self.address)
            .field("load", &self.load.label())
            .finish()
    }
}

impl TargetFlavour {
    /// Checks one `[[targets]]` entry: `name`, `kind` (`grpc` or `http`), `address`
    /// (required for gRPC; an HTTP target's default is its URL's HOST:PORT), and the keys of
    /// [`crate::target::GrpcTargetSpec`] or [`crate::target::HttpTargetSpec`], named like
    /// `bench`'s flags. A gRPC target's schema is compiled, or fetched from `address` by
    /// reflection within `timeout`, now: before any traffic.
    fn check(
        mut table: toml::Table,
        seed: u64,
        timeout: Duration,
    ) -> Result<TargetFlavour, String> {
        let mut text = |key: &str| match table.remove(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(format!("`{key}` must be a string, not {v}")),
        };
        let name = text("name")?.ok_or("`name` is missing")?;
        crate::external::check_name(&name).map_err(|e| format!("`name`: {e}"))?;
        let kind = text("kind")?;
        let address = text("address")?;
        let within = |e: String| format!("target {name}: {e}");
        if let Some(a) = &address {
            crate::net::split_host_port(a).map_err(|e| within(format!("`address`: {e}")))?;
        }
        let spec = |e: toml::de::Error| within(e.message().to_string());
        let resolved = |e: crate::target::TargetError| within(e.to_string());
        let (load, address): (Arc<dyn crate::bench::Target>, String) = match kind.as_deref() {
            Some("grpc") => {
                let spec: crate::target::GrpcTargetSpec =
                    toml::Value::Table(table).try_into().map_err(spec)?;
                let address = address.ok_or_else(|| {
                    within("`address` is missing: the HOST:PORT the service listens on".into())
                })?;
                let load = block_on_own_runtime(spec.resolve(&address, seed, timeout))
                    .map_err(within)?
                    .map_err(resolved)?;
                (Arc::new(load), address)
            }
            Some("http") => {
                let spec: crate::target::HttpTargetSpec =
                    toml::Value::Table(table).try_into().map_err(spec)?;
                let (load, url_address) = spec.resolve(seed).map_err(resolved)?;
                (Arc::new(load), address.unwrap_or(url_address))
            }
            Some(other) => return Err(within(format!("unknown kind \"{other}\" (grpc or http)"))),
            None => return Err(within("`kind` is missing (grpc or http)".into())),
        };
        Ok(TargetFlavour {
            name,
            address,
            load,
        })
    }
}

/// Runs `f` to completion on a runtime of its own, on a thread of its own: validation is
/// synchronous, and may itself run inside a runtime (tests), where blocking is not allowed.
fn block_on_own_runtime<F: std::future::Future + Send>(f: F) -> Result<F::Output, String>
where
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map(|rt| rt.block_on(f))
                    .map_err(|e| format!("cannot start a runtime: {e}"))
            })
            .join()
            .unwrap_or_else(|_| Err("the look-up panicked".into()))
    })
}

/// One combination of the axes.
#[derive(Clone, Debug)]
pub struct Cell {
    pub profile: usize,
    pub flavour: CellFlavour,
    pub mode: Mode,
    pub workload: CellWorkload,
    pub concurrency: usize,
    pub nodelay: bool,
    pub write_pattern: WritePattern,
}

/// What a file (or the command line) says; every field optional so flags can fill or override.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExperimentFile {
    pub name: Option<String>,
    pub profiles: Option<Vec<String>>,
    pub flavours: Option<Vec<String>>,
    pub modes: Option<Vec<String>>,
    pub workloads: Option<Vec<String>>,
    pub concurrency: Option<Vec<i64>>,
    pub calls: Option<i64>,
    pub duration: Option<String>,
    pub warmup: Option<String>,
    pub rounds: Option<i64>,
    /// `mean` or `median`: how the report combines rounds.
    pub round_summary: Option<String>,
    pub seed: Option<u64>,
    pub timeout: Option<String>,
    /// `model` (the default), `kernel` or `link`.
    pub engine: Option<String>,
    /// `true`, `false` or a list of both: TCP_NODELAY on the flavours' sockets.
    pub nodelay: Option<toml::Value>,
    /// `one`, `split` or a list of both.
    pub write_pattern: Option<toml::Value>,
    /// Servers and proxy on other hosts.
    pub remote: Option<RemoteFile>,
    /// External flavours by name: `[external.NAME]` tables. (Not `[flavours.NAME]`: TOML
    /// allows no table under a key that is already the `flavours` list.)
    pub external: Option<BTreeMap<String, ExternalFile>>,
    /// Your own services: `[[targets]]` tables ([`TargetFlavour::check`]).
    pub targets: Option<Vec<toml::Table>>,
    /// Where each value came from, so a message names the file's line or the flag.
    #[serde(skip)]
    pub sources: Sources,
}

/// Where an experiment's values came from: keys (`calls`, `remote.api`, …) with the file line
/// that set them, and the keys a command-line flag replaced.
#[derive(Clone, Debug, Default)]
pub(crate) struct Sources {
    lines: BTreeMap<String, usize>,
    flags: Vec<String>,
}

impl Sources {
    /// The lines of every key of `src` (already known to be valid TOML), down to the
    /// `[remote.servers]` entries.
    fn of(src: &str) -> Sources {
        fn walk(
            src: &str,
            prefix: &str,
            table: &toml::de::DeTable,
            lines: &mut BTreeMap<String, usize>,
        ) {
            for (key, value) in table {
                let name = format!("{prefix}{}", key.get_ref());
                let line = src[..key.span().start.min(src.len())].matches('\n').count() + 1;
                if let toml::de::DeValue::Table(inner) = value.get_ref() {
                    walk(src, &format!("{name}."), inner, lines);
                }
                lines.insert(name, line);
            }
        }
        let mut lines = BTreeMap::new();
        if let Ok(doc) = toml::de::DeTable::parse(src) {
            walk(src, "", doc.get_ref(), &mut lines);
        }
        Sources {
            lines,
            flags: Vec::new(),
        }
    }

    /// `message` about `key`, naming where its value came from: `--flag: …` when a flag set
    /// it, `FILE:LINE: key `k`: …` when the file did, `FILE: key `k`: …` for a missing key.
    pub(crate) fn blame(&self, origin: &str, key: &str, message: impl std::fmt::Display) -> String {
        let top = key.split('.').next().unwrap_or(key);
        if self.flags.iter().any(|f| f == top) {
            return format!("--{}: {message}", top.replace('_', "-"));
        }
        match self.lines.get(key) {
            Some(line) => format!("{origin}:{line}: key `{key}`: {message}"),
            None => format!("{origin}: key `{key}`: {message}"),
        }
    }
}

/// Why an experiment file (with the flags over it) is not a run. Every message names the file,
/// and the line where one is known, or the flag at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExperimentError {
    /// Said in one line: the file, then why it could not be read.
    #[error("{}: {error}", path.display())]
    Read {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    /// Not TOML, or a key or type the file does not have.
    #[error("{origin}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Syntax {
        origin: String,
        line: Option<usize>,
        message: String,
    },
    /// A value out of bounds or at odds with another; the message says where it came from.
    #[error("{0}")]
    Invalid(String),
}

impl ExperimentFile {
    /// Parses experiment TOML; errors name `origin`, the line and the key.
    pub fn parse(src: &str, origin: &str) -> Result<ExperimentFile, ExperimentError> {
        let file: ExperimentFile = toml::from_str(src).map_err(|e| ExperimentError::Syntax {
            origin: origin.to_string(),
            line: e
                .span()
                .map(|s| src[..s.start.min(src.len())].matches('\n').count() + 1),
            message: e.message().trim().to_string(),
        })?;
        Ok(ExperimentFile {
            sources: Sources::of(src),
            ..file
        })
    }

    pub fn load(path: &Path) -> Result<ExperimentFile, ExperimentError> {
        let src = std::fs::read_to_string(path).map_err(|error| ExperimentError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        ExperimentFile::parse(&src, &path.display().to_string())
    }

    /// Fields set in `over` replace ours (command-line flags over the file); messages about
    /// them then name the flag.
    pub fn merge(mut self, over: ExperimentFile) -> ExperimentFile {
        macro_rules! take {
            ($($f:ident),*) => { $( if over.$f.is_some() {
                self.$f = over.$f;
                self.sources.flags.push(stringify!($f).to_string());
            } )* };
        }
        take!(
            name,
            profiles,
            flavours,
            modes,
            workloads,
            concurrency,
            warmup,
            rounds,
            round_summary,
            seed,
            timeout,
            engine,
            nodelay,
            write_pattern,
            remote
        );
        // A count and a duration exclude each other: whichever the override names wins.
        if over.calls.is_some() {
            self.calls = over.calls;
            self.duration = None;
            self.sources.flags.push("calls".into());
        }
        if over.duration.is_some() {
            self.duration = over.duration;
            self.calls = None;
            self.sources.flags.push("duration".into());
        }
        self
    }

    /// Checks every value, naming the key at fault with its line (`origin:line: key `k`:
    /// message`), or the flag that set it.
    pub(crate) fn validate(self, origin: &str) -> Result<Experiment, ExperimentError> {
        self.check(origin).map_err(ExperimentError::Invalid)
    }

    /// [`ExperimentFile::validate`], its message already naming where the value came from
    /// ([`Sources::blame`]).
    fn check(self, origin: &str) -> Result<Experiment, String> {
        let sources = self.sources.clone();
        let bad = |key: &str, msg: String| sources.blame(origin, key, msg);
        let list = |key: &str, v: Option<Vec<String>>| -> Result<Vec<String>, String> {
            match v {
                Some(v) if v.is_empty() => Err(bad(key, "must list at least one value".into())),
                Some(v) => Ok(v),
                None => Err(bad(key, "missing".into())),
            }
        };
        let profile_names = list("profiles", self.profiles)?;
        let profiles = profile_names
            .iter()
            .map(|p| Profile::load(p).map_err(|e| bad("profiles", e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let modes = list("modes", self.modes)?
            .iter()
            .map(|m| Mode::parse(m).map_err(|e| bad("modes", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let workloads = list(
            "workloads",
            self.workloads.or_else(|| Some(vec!["order".into()])),
        )?
        .iter()
        .map(|w| CellWorkload::parse(w).map_err(|e| bad("workloads", e)))
        .collect::<Result<Vec<_>, _>>()?;
        let concurrency = self.concurrency.unwrap_or_else(|| vec![1]);
        let max = MAX_CONCURRENCY as i64;
        if concurrency.is_empty() || concurrency.iter().any(|&c| !(1..=max).contains(&c)) {
            return Err(bad("concurrency", format!("each value must be 1..={max}")));
        }
        let stop = match (self.calls, &self.duration) {
            (Some(_), Some(_)) => {
                return Err(bad("calls", "give calls or duration, not both".into()))
            }
            (Some(n), None) if !(1..=MAX_CALLS as i64).contains(&n) => {
                return Err(bad("calls", format!("must be 1..={MAX_CALLS}, got {n}")))
            }
            (Some(n), None) => Stop::Calls(n as u64),
            (None, Some(d)) => match parse_duration(d).map_err(|e| bad("duration", e))? {
                d if d.is_zero() => return Err(bad("duration", "must be more than zero".into())),
                d => Stop::Duration(d),
            },
            (None, None) => return Err(bad("calls", "missing (or give duration)".into())),
        };
        let duration = |key: &str, v: &Option<String>, default: Duration| match v {
            Some(s) => parse_duration(s).map_err(|e| bad(key, e)),
            None => Ok(default),
        };
        let warmup = duration("warmup", &self.warmup, Duration::ZERO)?;
        let timeout = duration("timeout", &self.timeout, DEFAULT_CALL_TIMEOUT)?;
        if timeout.is_zero() {
            return Err(bad("timeout", "must be more than zero".into()));
        }
        let rounds = self.rounds.unwrap_or(1);
        if !(1..=1000).contains(&rounds) {
            return Err(bad("rounds", format!("must be 1..=1000, got {rounds}")));
        }
        let round_summary = match &self.round_summary {
            Some(s) => RoundSummary::parse(s).map_err(|e| bad("round_summary", e))?,
            None => RoundSummary::Mean,
        };
        let engine = match &self.engine {
            Some(s) => Engine::parse(s).map_err(|e| bad("engine", e))?,
            None => Engine::Model,
        };
        match engine {
            Engine::Model => {
                for (name, profile) in profile_names.iter().zip(&profiles) {
                    profile
                        .check_model_engine(name)
                        .map_err(|e| bad("profiles", e.to_string()))?;
                }
            }
            Engine::Kernel if self.remote.is_some() => {
                return Err(bad(
                    "engine",
                    "a [remote] run drives the proxy host's model proxies; the kernel engine \
                     runs local proxies only"
                        .into(),
                ));
            }
            Engine::Kernel => {}
            Engine::Link if self.remote.is_some() => {
                return Err(bad(
                    "engine",
                    "a [remote] run drives the proxy host's model proxies; the link engine \
                     joins local servers and clients"
                        .into(),
                ));
            }
            Engine::Link => {}
        }
        let nodelay = axis(self.nodelay, true, |v| {
            v.as_bool()
                .ok_or_else(|| format!("{v} is not true or false"))
        })
        .map_err(|e| bad("nodelay", e))?;
        let write_patterns = axis(self.write_pattern, WritePattern::One, |v| {
            match v.as_str() {
                Some(s) => WritePattern::parse(s),
                None => Err(format!("{v} is not one or split")),
            }
        })
        .map_err(|e| bad("write_pattern", e))?;
        let seed = self.seed.unwrap_or(1);
        let flavours = flavours(
            self.flavours,
            self.external,
            self.targets,
            (seed, timeout),
            &bad,
        )?;
        external_limits(&flavours, engine, &workloads, self.remote.is_some(), &bad)?;
        let remote = match self.remote {
            Some(r) => Some(remote(r, &profile_names, &flavours, &workloads, &bad)?),
            None => None,
        };
        Ok(Experiment {
            name: self.name.unwrap_or_else(|| "experiment".into()),
            profiles,
            flavours,
            modes,
            workloads,
            concurrency: concurrency.into_iter().map(|c| c as usize).collect(),
            stop,
            warmup,
            rounds: rounds as u32,
            round_summary,
            seed,
            timeout,
            engine,
            nodelay,
            write_patterns,
            remote,
        })
    }
}

/// The run's flavours: built-in names, `[external.NAME]` tables and `[[targets]]` (each
/// checked, used or not, so a typo in one is found now). Without a `flavours` list, every
/// external table (in name order) and every target (in file order) runs; with one, only what
/// it names (so `--flavours` can pick).
fn flavours(
    list: Option<Vec<String>>,
    external: Option<BTreeMap<String, ExternalFile>>,
    targets: Option<Vec<toml::Table>>,
    (seed, timeout): (u64, Duration),
    bad: &dyn Fn(&str, String) -> String,
) -> Result<Vec<CellFlavour>, String> {
    let mut defined = Vec::new();
    for (name, table) in external.unwrap_or_default() {
        let x = ExternalFlavour::check(&name, table).map_err(|(key, e)| match key {
            "" => bad(&format!("external.{name}"), e),
            key => bad(&format!("external.{name}.{key}"), e),
        })?;
        defined.push(CellFlavour::External(Arc::new(x)));
    }
    for table in targets.unwrap_or_default() {
        let t = TargetFlavour::check(table, seed, timeout).map_err(|e| bad("targets", e))?;
        if defined.iter().any(|d| d.name() == t.name) {
            return Err(bad("targets", format!("\"{}\" is defined twice", t.name)));
        }
        defined.push(CellFlavour::Target(Arc::new(t)));
    }
    let names = match list {
        Some(v) if v.is_empty() => {
            return Err(bad("flavours", "must list at least one value".into()))
        }
        Some(v) => v,
        None if !defined.is_empty() => defined.iter().map(|x| x.name().to_string()).collect(),
        None => return Err(bad("flavours", "missing".into())),
    };
    names
        .iter()
        .map(|f| match flavour::by_name(f) {
            Some(b) => Ok(CellFlavour::Builtin(b)),
            None => match defined.iter().find(|x| x.name() == f) {
                Some(x) => Ok(x.clone()),
                None => Err(bad(
                    "flavours",
                    format!(
                        "unknown flavour \"{f}\" (use {}, or describe your own in an \
                         [external.{f}] table or a [[targets]] entry)",
                        flavour::names().join(", ")
                    ),
                )),
            },
        })
        .collect()
}

/// What external flavours cannot be combined with, checked before any traffic.
fn external_limits(
    flavours: &[CellFlavour],
    engine: Engine,
    workloads: &[CellWorkload],
    remote: bool,
    bad: &dyn Fn(&str, String) -> String,
) -> Result<(), String> {
    let Some(x) = flavours.iter().find(|f| f.builtin().is_none()) else {
        return Ok(());
    };
    let (kind, name) = (x.kind(), x.name());
    if remote {
        // The runner starts an external flavour's processes and a target's proxies here; a
        // remote run starts nothing.
        return Err(bad(
            "remote",
            format!(
                "{kind} {name}: a [remote] run drives faultrig's own servers only; run it \
                 locally (the service may be on another host)"
            ),
        ));
    }
    if engine == Engine::Link {
        return Err(bad(
            "engine",
            format!(
                "{kind} {name}: the link engine needs servers and clients that make their \
                 sockets in its namespaces; use the model or kernel engine"
            ),
        ));
    }
    if let Some(w) = workloads
        .iter()
        .find(|w| w.backend != BackendSpec::Given(Backend::None))
    {
        return Err(bad(
            "workloads",
            format!(
                "{}: a backend is something faultrig's servers call; {kind} {name}'s server \
                 has its own (use plain deduct)",
                w.label
            ),
        ));
    }
    Ok(())
}

/// An axis given as one value or a list of them, each checked by `parse`; `default` alone when
/// not given.
fn axis<T>(
    value: Option<toml::Value>,
    default: T,
    parse: impl Fn(&toml::Value) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    match value {
        None => Ok(vec![default]),
        Some(toml::Value::Array(list)) if list.is_empty() => {
            Err("must list at least one value".into())
        }
        Some(toml::Value::Array(list)) => list.iter().map(parse).collect(),
        Some(one) => Ok(vec![parse(&one)?]),
    }
}

/// Checks a `[remote]` table against the experiment's axes.
fn remote(
    r: RemoteFile,
    profile_names: &[String],
    flavours: &[CellFlavour],
    workloads: &[CellWorkload],
    blame: &dyn Fn(&str, String) -> String,
) -> Result<Remote, String> {
    let bad = |key: &str, msg: String| blame(&format!("remote.{key}"), msg);
    let api = r.api.ok_or_else(|| {
        bad(
            "api",
            "missing: the HOST:PORT of `faultrig proxy --api` on the proxy host".into(),
        )
    })?;
    let (api_host, _) = crate::net::split_host_port(&api).map_err(|e| bad("api", e))?;
    let (listen_host, listen_port) = match &r.listen {
        Some(l) => {
            let (host, port) = crate::net::split_host_port(l).map_err(|e| bad("listen", e))?;
            (host.to_string(), port)
        }
        None => (api_host.to_string(), 0),
    };
    if listen_port != 0 && usize::from(listen_port) + flavours.len() > 65536 {
        return Err(bad(
            "listen",
            format!(
                "ports {listen_port}.. leave no room for {} flavours",
                flavours.len()
            ),
        ));
    }
    let given = r.servers.unwrap_or_default();
    for (name, addr) in &given {
        if flavour::by_name(name).is_none() {
            return Err(bad(
                "servers",
                format!(
                    "unknown flavour \"{name}\" (use {})",
                    flavour::names().join(", ")
                ),
            ));
        }
        crate::net::split_host_port(addr).map_err(|e| bad(&format!("servers.{name}"), e))?;
    }
    let servers = flavours
        .iter()
        .map(|f| {
            given.get(f.name()).cloned().ok_or_else(|| {
                bad(
                    "servers",
                    format!(
                        "no address for flavour {0}: add {0} = \"HOST:PORT\" of its server",
                        f.name()
                    ),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(w) = workloads
        .iter()
        .find(|w| w.backend != BackendSpec::Given(Backend::None))
    {
        return Err(blame(
            "workloads",
            format!(
                "{} needs a server the runner starts; with [remote], start `faultrig serve \
                 --backend ...` on the server host and use plain deduct",
                w.label
            ),
        ));
    }
    let profile_toxics = profile_names
        .iter()
        .map(|p| match Profile::builtin(p) {
            Some(_) => Ok(ProfileAttributes::named(p)),
            None => std::fs::read_to_string(p)
                .map(|text| ProfileAttributes::toml(&text))
                .map_err(|e| blame("profiles", format!("{p}: {e}"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Remote {
        api,
        listen_host,
        listen_port,
        servers,
        profile_toxics,
    })
}

impl Experiment {
    /// Every cell, in the fixed order runs use: profile, flavour, mode, workload, concurrency,
    /// nodelay, write pattern.
    pub fn cells(&self) -> Vec<Cell> {
        let mut cells = Vec::new();
        for profile in 0..self.profiles.len() {
            for flavour in &self.flavours {
                // A target's calls are its own (its `data`, `url`, `body`): one cell per
                // combination of the other axes, labelled with what it calls.
                let workloads = match flavour {
                    CellFlavour::Target(t) => vec![CellWorkload {
                        label: t.load.label(),
                        ..self.workloads[0].clone()
                    }],
                    _ => self.workloads.clone(),
                };
                for &mode in &self.modes {
                    for workload in &workloads {
                        for &concurrency in &self.concurrency {
                            for &nodelay in &self.nodelay {
                                for &write_pattern in &self.write_patterns {
                                    cells.push(Cell {
                                        profile,
                                        flavour: flavour.clone(),
                                        mode,
                                        workload: workload.clone(),
                                        concurrency,
                                        nodelay,
                                        write_pattern,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        cells
    }

    /// Where `flavour` stands in `flavours`.
    pub(crate) fn flavour_index(&self, flavour: &CellFlavour) -> usize {
        self.flavours
            .iter()
            .position(|f| f.name() == flavour.name())
            .expect("cells only hold listed flavours")
    }

    /// The distinct backends the cells need, in first-seen order; each gets its own servers.
    pub(crate) fn backends(&self) -> Vec<BackendSpec> {
        let mut list: Vec<BackendSpec> = Vec::new();
        for w in &self.workloads {
            if !list.contains(&w.backend) {
                list.push(w.backend.clone());
            }
        }
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(src: &str) -> Result<Experiment, String> {
        ExperimentFile::parse(src, "x.toml")
            .and_then(|file| file.validate("x.toml"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_default_experiment_is_the_classic_comparison() {
        let e = ExperimentFile::parse(DEFAULT, "default")
            .unwrap()
            .validate("default")
            .unwrap();
        let names: Vec<_> = e.profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["local", "lan", "lossy-10ms-1pct"]);
        assert_eq!(e.flavours.len(), flavour::ALL.len());
        assert_eq!(e.modes, [Mode::Single, Mode::PerCall]);
        assert_eq!((e.stop, e.rounds), (Stop::Calls(100), 3));
        assert_eq!(e.cells().len(), 3 * flavour::ALL.len() * 2);
    }

    #[test]
    fn bad_values_name_their_line_and_key() {
        let base = "seed = 3\nprofiles = [\"local\"]\nflavours = [\"grpc\"]\n\
                    modes = [\"single\"]\n";
        for (extra, key) in [
            ("flavours = [\"soap\"]", "flavours"),
            ("profiles = [\"moon\"]", "profiles"),
            ("calls = 0", "calls"),
            ("calls = 1000000000001", "calls"),
            ("modes = [\"pool:0\"]", "modes"),
            ("modes = [\"pool:10000000000000000000\"]", "modes"),
            ("workloads = [\"blob:1B\"]", "workloads"),
            ("concurrency = [0]", "concurrency"),
            ("rounds = 0", "rounds"),
            ("warmup = \"2years\"", "warmup"),
            ("duration = \"0s\"", "duration"),
            ("nodelay = []", "nodelay"),
            ("nodelay = \"yes\"", "nodelay"),
            ("write_pattern = [\"both\"]", "write_pattern"),
        ] {
            // The bad key on line 5, replacing the base's value of it.
            let lines: Vec<&str> = base
                .lines()
                .filter(|l| !l.starts_with(&format!("{key} ")))
                .collect();
            let mut src = lines[..4.min(lines.len())].join("\n");
            while src.lines().count() < 4 {
                src += "\n# padding";
            }
            src += &format!("\n{extra}\n");
            if key != "calls" && key != "duration" {
                src += "calls = 1\n";
            }
            let e = validate(&src).unwrap_err();
            assert!(
                e.starts_with(&format!("x.toml:5: key `{key}`: ")),
                "{extra}: {e}\n{src}"
            );
        }
        let missing = validate(base).unwrap_err();
        assert!(
            missing.starts_with("x.toml: key `calls`: missing"),
            "{missing}"
        );
        // A flag that replaced the file's value is named instead of the file.
        let over = ExperimentFile {
            calls: Some(0),
            ..ExperimentFile::default()
        };
        let e = ExperimentFile::parse(&format!("{base}calls = 5\n"), "x.toml")
            .unwrap()
            .merge(over)
            .validate("x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--calls: must be"), "{e}");
        let e = validate("profiles = [\"local\"]\nflavors = [\"grpc\"]\n").unwrap_err();
        assert!(
            e.starts_with("x.toml:2:") && e.contains("unknown field"),
            "{e}"
        );
    }

    #[test]
    fn socket_options_are_axes_and_link_is_an_engine() {
        let base = "profiles = [\"lan\"]\nflavours = [\"tcp-binary\"]\nmodes = [\"single\"]\n\
                    calls = 1\n";
        let e = validate(base).unwrap();
        assert_eq!(
            (e.nodelay.as_slice(), e.write_patterns.as_slice()),
            (&[true][..], &[WritePattern::One][..])
        );
        let e = validate(&format!(
            "{base}engine = \"link\"\nnodelay = [true, false]\nwrite_pattern = [\"one\", \"split\"]\n"
        ))
        .unwrap();
        assert_eq!(e.engine, Engine::Link);
        let axes: Vec<(bool, WritePattern)> = e
            .cells()
            .iter()
            .map(|c| (c.nodelay, c.write_pattern))
            .collect();
        assert_eq!(
            axes,
            [
                (true, WritePattern::One),
                (true, WritePattern::Split),
                (false, WritePattern::One),
                (false, WritePattern::Split)
            ]
        );
        // One value needs no list.
        let e = validate(&format!(
            "{base}nodelay = false\nwrite_pattern = \"split\"\n"
        ))
        .unwrap();
        assert_eq!(e.cells().len(), 1);
        assert_eq!(
            (e.nodelay[0], e.write_patterns[0]),
            (false, WritePattern::Split)
        );
    }

    #[test]
    fn every_shipped_experiment_is_valid() {
        for (name, src, cells) in [
            ("lan-compare", DEFAULT, 3 * 5 * 2),
            (
                "concurrency-sweep",
                include_str!("../scripts/concurrency-sweep.toml"),
                2 * 5 * 5,
            ),
            (
                "payload-sweep",
                include_str!("../scripts/payload-sweep.toml"),
                5 * 4 * 2,
            ),
            (
                "backend",
                include_str!("../scripts/backend.toml"),
                2 * 5 * 4,
            ),
            (
                "nagle",
                include_str!("../scripts/nagle.toml"),
                2 * 5 * 2 * 2,
            ),
            (
                "external-echo",
                include_str!("../scripts/external-echo.toml"),
                2 * 2 * 2,
            ),
        ] {
            let e = ExperimentFile::parse(src, name)
                .and_then(|f| f.validate(name))
                .unwrap();
            assert_eq!((e.name.as_str(), e.cells().len()), (name, cells));
        }
        let payload = validate(include_str!("../scripts/payload-sweep.toml")).unwrap();
        assert_eq!(payload.round_summary, RoundSummary::Median);
        assert_eq!(payload.rounds, 3);
        assert!(payload.warmup > Duration::ZERO && matches!(payload.stop, Stop::Duration(_)));
    }

    #[test]
    fn a_backend_belongs_to_deduct_and_gets_its_own_servers() {
        let w = |s: &str| CellWorkload::parse(s);
        assert_eq!(w("deduct@redis").unwrap().backend, BackendSpec::LocalRedis);
        assert_eq!(w("deduct@sleep:2ms").unwrap().label, "deduct@sleep:2ms");
        assert_eq!(w("blob:1KiB").unwrap().label, "blob:1KiB");
        assert!(w("wide@redis").unwrap_err().contains("only deduct"));
        assert!(w("deduct@mysql").is_err());
        let e = validate(
            "profiles = [\"local\"]\nflavours = [\"grpc\"]\nmodes = [\"single\"]\ncalls = 1\n\
             workloads = [\"deduct\", \"order\", \"deduct@sleep:1ms\", \"deduct@sleep:1ms\"]\n",
        )
        .unwrap();
        assert_eq!(
            e.backends(),
            [
                BackendSpec::Given(Backend::None),
                BackendSpec::Given(Backend::Sleep(Duration::from_millis(1)))
            ]
        );
    }

    #[test]
    fn overrides_replace_file_values() {
        let file = ExperimentFile::parse(DEFAULT, "d").unwrap();
        let over = ExperimentFile {
            profiles: Some(vec!["local".into()]),
            duration: Some("2s".into()),
            ..Default::default()
        };
        let e = file.merge(over).validate("d").unwrap();
        assert_eq!(e.profiles.len(), 1);
        assert_eq!(e.stop, Stop::Duration(Duration::from_secs(2)));
    }

    #[test]
    fn a_remote_table_names_the_api_and_every_flavours_server() {
        let dir = tempfile::tempdir().unwrap();
        let custom = dir.path().join("mine.toml");
        std::fs::write(&custom, "[link]\ndelay = \"3ms\"\n").unwrap();
        let axes = format!(
            "profiles = [\"lan\", \"{}\"]\nflavours = [\"grpc\", \"thrift\"]\n\
             modes = [\"single\"]\ncalls = 5\n",
            custom.display()
        );
        let e = validate(&format!(
            "{axes}[remote]\napi = \"10.0.0.2:8474\"\n\
             [remote.servers]\ngrpc = \"10.0.1.2:9001\"\nthrift = \"srv:9005\"\n\
             tcp-binary = \"10.0.1.2:9004\"\n"
        ))
        .unwrap();
        let r = e.remote.unwrap();
        assert_eq!(
            (r.api.as_str(), r.listen_host.as_str(), r.listen_port),
            ("10.0.0.2:8474", "10.0.0.2", 0)
        );
        assert_eq!(r.servers, ["10.0.1.2:9001", "srv:9005"]);
        assert_eq!(r.profile_toxics[0], ProfileAttributes::named("lan"));
        assert_eq!(
            r.profile_toxics[1],
            ProfileAttributes::toml("[link]\ndelay = \"3ms\"\n")
        );

        let with = |remote: &str| validate(&format!("{axes}[remote]\n{remote}")).unwrap_err();
        assert!(with("listen = \"x:1\"\n").contains("`remote.api`: missing"));
        assert!(with("api = \"nope\"\n").contains("`remote.api`"));
        let no_thrift = with("api = \"a:1\"\n[remote.servers]\ngrpc = \"b:2\"\n");
        assert!(
            no_thrift.contains("no address for flavour thrift"),
            "{no_thrift}"
        );
        let unknown = with("api = \"a:1\"\n[remote.servers]\nsoap = \"b:2\"\n");
        assert!(unknown.contains("unknown flavour \"soap\""), "{unknown}");
        let port = with("api = \"a:1\"\n[remote.servers]\ngrpc = \"b:http\"\n");
        assert!(port.contains("remote.servers.grpc"), "{port}");
        let e = validate(
            "profiles = [\"lan\"]\nflavours = [\"grpc\"]\nmodes = [\"single\"]\ncalls = 5\n\
             workloads = [\"deduct@sleep:1ms\"]\n[remote]\napi = \"a:1\"\nlisten = \"p:7000\"\n\
             [remote.servers]\ngrpc = \"b:2\"\n",
        )
        .unwrap_err();
        assert!(
            e.contains("deduct@sleep:1ms needs a server the runner starts"),
            "{e}"
        );
    }

    #[test]
    fn external_flavours_are_tables_named_like_the_built_ins() {
        let axes = "profiles = [\"lan\"]\nmodes = [\"single\"]\ncalls = 5\n";
        let table = "[external.echo]\nserve = \"srv --port {port}\"\nclient = \"cli {target}\"\n";
        // Listed with a built-in, in the list's order.
        let e = validate(&format!("{axes}flavours = [\"echo\", \"grpc\"]\n{table}")).unwrap();
        let names: Vec<&str> = e.flavours.iter().map(|f| f.name()).collect();
        assert_eq!(names, ["echo", "grpc"]);
        assert!(e.flavours[0].builtin().is_none() && e.flavours[1].builtin().is_some());
        assert_eq!(e.cells().len(), 2);
        // No list: every table runs; a list that leaves a table out does not run it.
        let e = validate(&format!("{axes}{table}")).unwrap();
        assert_eq!(e.flavours.len(), 1);
        let e = validate(&format!("{axes}flavours = [\"grpc\"]\n{table}")).unwrap();
        assert_eq!(e.flavours.len(), 1);
        assert_eq!(e.flavours[0].name(), "grpc");
        // Each message names the file's line and the key.
        let bad =
            |extra: &str| validate(&format!("{axes}flavours = [\"echo\"]\n{extra}")).unwrap_err();
        let e = bad("[external.echo]\nserve = \"srv --port {prot}\"\nclient = \"c\"\n");
        assert!(
            e.starts_with("x.toml:6: key `external.echo.serve`: unknown placeholder {prot}"),
            "{e}"
        );
        let e = bad("[external.echo]\nserve = \"s {port}\"\nclient = \"c {targte}\"\n");
        assert!(
            e.starts_with("x.toml:7: key `external.echo.client`: unknown placeholder {targte}"),
            "{e}"
        );
        let e = bad("[external.echo]\nclient = \"c\"\n");
        assert!(e.contains("`external.echo.serve`: missing"), "{e}");
        let e = bad("[external.echo]\nserve = \"s\"\nclient = \"c\"\nport = 3\n");
        assert!(
            e.starts_with("x.toml:8:") && e.contains("unknown field `port`"),
            "{e}"
        );
        let e = validate(&format!(
            "{axes}flavours = [\"grpc\"]\n[external.grpc]\nserve = \"s\"\nclient = \"c\"\n"
        ))
        .unwrap_err();
        assert!(
            e.contains("key `external.grpc`") && e.contains("built-in"),
            "{e}"
        );
        let e = validate(&format!("{axes}flavours = [\"echoo\"]\n{table}")).unwrap_err();
        assert!(
            e.contains("unknown flavour \"echoo\"") && e.contains("[external.echoo]"),
            "{e}"
        );
        // What external flavours cannot do, refused before any traffic.
        let with = |extra: &str| {
            validate(&format!("{axes}flavours = [\"echo\"]\n{extra}\n{table}")).unwrap_err()
        };
        assert!(with("engine = \"link\"").contains("key `engine`: external flavour echo"));
        assert!(with("workloads = [\"deduct@sleep:1ms\"]").contains("key `workloads`"));
        let remote = with("[remote]\napi = \"a:1\"\n[remote.servers]\ngrpc = \"b:2\"");
        assert!(
            remote.contains("key `remote`: external flavour echo"),
            "{remote}"
        );
    }
}
