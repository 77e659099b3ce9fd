//! Experiment files: the axes of a matrix of cells (profiles × flavours × modes × workloads ×
//! concurrency), how long each cell runs and how often. Parsed and validated completely before
//! any traffic, so a typo costs a message, not a half-finished run.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::bench::{Mode, Stop};
use crate::flavour::{self, Flavour};
use crate::profile::Profile;
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
    pub workloads: Vec<Workload>,
    pub concurrency: Vec<usize>,
    pub stop: Stop,
    pub warmup: Duration,
    pub rounds: u32,
    pub seed: u64,
    pub timeout: Duration,
}

/// One combination of the axes.
#[derive(Clone, Debug)]
pub struct Cell {
    pub profile: usize,
    pub flavour: &'static dyn Flavour,
    pub mode: Mode,
    pub workload: Workload,
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
        .map(|w| Workload::parse(w).map_err(|e| bad("workloads", e)))
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
                    for &workload in &self.workloads {
                        for &concurrency in &self.concurrency {
                            cells.push(Cell {
                                profile,
                                flavour,
                                mode,
                                workload,
                                concurrency,
                            });
                        }
                    }
                }
            }
        }
        cells
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
