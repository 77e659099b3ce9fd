//! `faultrig calibrate`: the fault model against real kernel TCP, side by side.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use super::{check_engine, load_profile, namespace_error, runtime, CliError};
use crate::calibrate::{self as cal, Plan, Workload};
use crate::link::Engine;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Profiles (comma-separated names or files); default: lossy-10ms-1pct, wan, bursty,
    /// clean-10ms, or with --quick lossy-10ms-1pct.
    #[arg(long, value_delimiter = ',')]
    pub profiles: Option<Vec<String>>,
    /// Workloads (comma-separated): order, 3seg, 16k, 64k, 1m, per-call, bulk; default all, or
    /// with --quick order, 3seg, 16k, per-call, bulk.
    #[arg(long, value_delimiter = ',', value_parser = Workload::parse)]
    pub workloads: Option<Vec<Workload>>,
    /// Counted calls per latency workload and engine, over all connections (default 1000, with
    /// --quick 1500).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=crate::bench::MAX_CALLS))]
    pub calls: Option<u64>,
    /// Concurrent connections per latency workload (default 4, with --quick 6).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub connections: Option<u32>,
    /// Seed of the model's and the link's fault draws, and of the bootstrap.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The CI suite: lossy-10ms-1pct only, five workloads, a 4 s bulk flow (about 3 minutes).
    #[arg(long)]
    pub quick: bool,
    /// Directory for calibrate.csv and calibrate.html.
    #[arg(long, default_value = "out/calibrate")]
    pub out: PathBuf,
}

/// `calibrate`'s arguments, checked: the plan, every profile loaded.
pub(crate) struct Calibrate {
    plan: Plan,
    out: PathBuf,
}

impl CalibrateArgs {
    pub(crate) fn validate(self) -> Result<Calibrate, CliError> {
        let (calls, connections, bulk_time) = if self.quick { cal::QUICK } else { cal::FULL };
        let names: Vec<String> = match self.profiles {
            Some(p) => p,
            None if self.quick => vec![cal::QUICK_PROFILE.into()],
            None => cal::PROFILES.iter().map(|p| p.to_string()).collect(),
        };
        let mut profiles = Vec::new();
        for name in &names {
            // Both engines run every profile, so the model's limits apply to each.
            let profile = load_profile(name, "--profiles")?;
            check_engine(Engine::Model, &profile, name)?;
            profiles.push(profile);
        }
        let plan = Plan {
            profiles,
            workloads: self.workloads.unwrap_or_else(|| {
                if self.quick {
                    Workload::QUICK.to_vec()
                } else {
                    Workload::ALL.to_vec()
                }
            }),
            calls: self.calls.unwrap_or(calls),
            connections: self.connections.map_or(connections, |c| c as usize),
            warmup_calls: cal::WARMUP_CALLS,
            bulk_time,
            seed: self.seed,
        };
        Ok(Calibrate {
            plan,
            out: self.out,
        })
    }
}

pub fn run(c: Calibrate) -> Result<(), CliError> {
    let Calibrate { plan, out } = c;
    // Before any traffic: a missing privilege is one message and exit 2.
    crate::link::Namespace::new().map_err(namespace_error)?;
    std::fs::create_dir_all(&out)
        .map_err(|e| CliError::Usage(format!("--out {}: cannot create: {e}", out.display())))?;
    let started = std::time::Instant::now();
    println!(
        "faultrig calibrate: {} profile(s) x {} workload(s), model then kernel; {} counted calls \
         on {} connections after {} uncounted warm-up calls each; bulk {} s; seed {}",
        plan.profiles.len(),
        plan.workloads.len(),
        plan.calls,
        plan.connections,
        plan.warmup_calls,
        plan.bulk_time.as_secs(),
        plan.seed
    );
    let outcome = runtime()?
        .block_on(cal::run(&plan, &out, |line| {
            let _ = writeln!(std::io::stdout(), "{line}");
        }))
        .map_err(|e| CliError::Failed(e.into()))?;
    println!(
        "wrote {} and {} in {:.0} s",
        out.join("calibrate.csv").display(),
        out.join("calibrate.html").display(),
        started.elapsed().as_secs_f64()
    );
    match outcome.out_of_tolerance() {
        0 => Ok(()),
        n => Err(CliError::Failed(anyhow::anyhow!(
            "{n} workload(s) out of tolerance (mean and p50 within 10 %, p90 and p99 within 15 %)"
        ))),
    }
}
