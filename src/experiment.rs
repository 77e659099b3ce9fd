//! Experiment files: the axes of a matrix of cells (profiles × flavours × modes × workloads ×
//! concurrency), how long each cell runs and how often. Parsed and validated completely before
//! any traffic, so a typo costs a message, not a half-finished run.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::bench::{Mode, Stop};
use crate::flavour::{self, Flavour};
use crate::profile::Profile;
use crate::report::RoundSummary;
use crate::service::Downstream;
use crate::units::parse_duration;
use crate::workload::Workload;

/// The default experiment: what `faultrig run` does with no file.
pub const DEFAULT: &str = include_str!("../scripts/lan-compare.toml");

/// A validated experiment.
#[derive(Clone, Debug)]
pub struct Experiment {
    pub name: String,
    pub profiles: Vec<Profile>,
    pub flavours: Vec<&'static dyn Flavour>,
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
}

/// What a cell's server does after each `Deduct`.
#[derive(Clone, Debug, PartialEq)]
pub enum DownstreamSpec {
    /// Passed to `faultrig serve --downstream` as it is.
    Given(Downstream),
    /// A private redis-server the runner starts for the run (`deduct@redis`).
    LocalRedis,
}

/// A workload as an experiment names it. `deduct@sleep:2ms`, `deduct@redis` or
/// `deduct@redis://HOST:PORT` add a downstream call to every deduct: that changes the server,
/// not the call, so the runner gives each distinct downstream its own servers.
#[derive(Clone, Debug, PartialEq)]
pub struct CellWorkload {
    pub workload: Workload,
    pub downstream: DownstreamSpec,
    /// The name in the CSV's `workload` column and the report, e.g. `deduct@sleep:2ms`.
    pub label: String,
}

impl CellWorkload {
    pub fn parse(s: &str) -> Result<CellWorkload, String> {
        let (workload, downstream) = match s.split_once('@') {
            None => (Workload::parse(s)?, DownstreamSpec::Given(Downstream::None)),
            Some((w, d)) => {
                let workload = Workload::parse(w)?;
                if workload != Workload::Deduct {
                    return Err(format!(
                        "\"{s}\": only deduct calls a downstream (deduct@sleep:DUR, deduct@redis)"
                    ));
                }
                let downstream = match d {
                    "redis" => DownstreamSpec::LocalRedis,
                    d => DownstreamSpec::Given(Downstream::parse(d)?),
                };
                (workload, downstream)
            }
        };
        let label = match &downstream {
            DownstreamSpec::Given(Downstream::None) => workload.to_string(),
            DownstreamSpec::Given(d) => format!("{workload}@{d}"),
            DownstreamSpec::LocalRedis => format!("{workload}@redis"),
        };
        Ok(CellWorkload {
            workload,
            downstream,
            label,
        })
    }
}

/// One combination of the axes.
#[derive(Clone, Debug)]
pub struct Cell {
    pub profile: usize,
    pub flavour: &'static dyn Flavour,
    pub mode: Mode,
    pub workload: CellWorkload,
    pub concurrency: usize,
}

/// What a file (or the command line) says; every field optional so flags can fill or override.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentFile {
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
}

impl ExperimentFile {
    /// Parses experiment TOML; errors name `origin`, the line and the key.
    pub fn parse(src: &str, origin: &str) -> Result<ExperimentFile, String> {
        toml::from_str(src).map_err(|e| {
            let line = e
                .span()
                .map(|s| {
                    format!(
                        ":{}",
                        src[..s.start.min(src.len())].matches('\n').count() + 1
                    )
                })
                .unwrap_or_default();
            format!("{origin}{line}: {}", e.message().trim())
        })
    }

    pub fn load(path: &Path) -> Result<ExperimentFile, String> {
        let src = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        ExperimentFile::parse(&src, &path.display().to_string())
    }

    /// Fields set in `over` replace ours (command-line flags over the file).
    pub fn merge(mut self, over: ExperimentFile) -> ExperimentFile {
        macro_rules! take {
            ($($f:ident),*) => { $( if over.$f.is_some() { self.$f = over.$f; } )* };
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
            timeout
        );
        // A count and a duration exclude each other: whichever the override names wins.
        if over.calls.is_some() {
            self.calls = over.calls;
            self.duration = None;
        }
        if over.duration.is_some() {
            self.duration = over.duration;
            self.calls = None;
        }
        self
    }

    /// Checks every value, naming the key at fault (`origin: key: message`).
    pub fn validate(self, origin: &str) -> Result<Experiment, String> {
        let bad = |key: &str, msg: String| format!("{origin}: `{key}`: {msg}");
        let list = |key: &str, v: Option<Vec<String>>| -> Result<Vec<String>, String> {
            match v {
                Some(v) if v.is_empty() => Err(bad(key, "must list at least one value".into())),
                Some(v) => Ok(v),
                None => Err(bad(key, "missing".into())),
            }
        };
        let profiles = list("profiles", self.profiles)?
            .iter()
            .map(|p| Profile::load(p).map_err(|e| bad("profiles", e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let flavours = list("flavours", self.flavours)?
            .iter()
            .map(|f| {
                flavour::by_name(f).ok_or_else(|| {
                    bad(
                        "flavours",
                        format!(
                            "unknown flavour \"{f}\" (use {})",
                            flavour::names().join(", ")
                        ),
                    )
                })
            })
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
        if concurrency.is_empty() || concurrency.iter().any(|&c| !(1..=100_000).contains(&c)) {
            return Err(bad("concurrency", "each value must be 1..=100000".into()));
        }
        let stop = match (self.calls, &self.duration) {
            (Some(_), Some(_)) => {
                return Err(bad("calls", "give calls or duration, not both".into()))
            }
            (Some(n), None) if n < 1 => {
                return Err(bad("calls", format!("must be at least 1, got {n}")))
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
        let timeout = duration("timeout", &self.timeout, Duration::from_secs(10))?;
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
            seed: self.seed.unwrap_or(1),
            timeout,
        })
    }
}

impl Experiment {
    /// Every cell, in the fixed order runs use: profile, flavour, mode, workload, concurrency.
    pub fn cells(&self) -> Vec<Cell> {
        let mut cells = Vec::new();
        for profile in 0..self.profiles.len() {
            for &flavour in &self.flavours {
                for &mode in &self.modes {
                    for workload in &self.workloads {
                        for &concurrency in &self.concurrency {
                            cells.push(Cell {
                                profile,
                                flavour,
                                mode,
                                workload: workload.clone(),
                                concurrency,
                            });
                        }
                    }
                }
            }
        }
        cells
    }

    /// The distinct downstreams the cells need, in first-seen order; each gets its own servers.
    pub fn downstreams(&self) -> Vec<DownstreamSpec> {
        let mut list: Vec<DownstreamSpec> = Vec::new();
        for w in &self.workloads {
            if !list.contains(&w.downstream) {
                list.push(w.downstream.clone());
            }
        }
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(src: &str) -> Result<Experiment, String> {
        ExperimentFile::parse(src, "x.toml")?.validate("x.toml")
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
    fn bad_values_name_their_key() {
        let base =
            "profiles = [\"local\"]\nflavours = [\"grpc\"]\nmodes = [\"single\"]\ncalls = 10\n";
        for (extra, key) in [
            ("flavours = [\"soap\"]\n", "`flavours`"),
            ("profiles = [\"moon\"]\n", "`profiles`"),
            ("calls = 0\n", "`calls`"),
            ("modes = [\"pool:0\"]\n", "`modes`"),
            ("workloads = [\"blob:1B\"]\n", "`workloads`"),
            ("concurrency = [0]\n", "`concurrency`"),
            ("rounds = 0\n", "`rounds`"),
        ] {
            let over = ExperimentFile::parse(extra, "x.toml").unwrap();
            let e = ExperimentFile::parse(base, "x.toml")
                .unwrap()
                .merge(over)
                .validate("x.toml");
            assert!(e.as_ref().unwrap_err().contains(key), "{extra}: {e:?}");
        }
        let e = validate("profiles = [\"local\"]\nflavors = [\"grpc\"]\n").unwrap_err();
        assert!(
            e.starts_with("x.toml:2:") && e.contains("unknown field"),
            "{e}"
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
                "downstream",
                include_str!("../scripts/downstream.toml"),
                2 * 5 * 4,
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
    fn a_downstream_belongs_to_deduct_and_gets_its_own_servers() {
        let w = |s: &str| CellWorkload::parse(s);
        assert_eq!(
            w("deduct@redis").unwrap().downstream,
            DownstreamSpec::LocalRedis
        );
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
            e.downstreams(),
            [
                DownstreamSpec::Given(Downstream::None),
                DownstreamSpec::Given(Downstream::Sleep(Duration::from_millis(1)))
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
}
