//! `faultrig shell`: a command in a fresh network namespace behind the link engine.

use std::ffi::OsString;

use clap::Args;

use super::{load_profile, namespace_error, runtime, CliError};
use crate::profile::Profile;

#[derive(Debug, Args)]
pub struct ShellArgs {
    /// Built-in profile name or path to a profile file (.toml).
    #[arg(long, default_value = "lossy-10ms-1pct")]
    pub profile: String,
    /// Seed of the link's random streams: the same seed drops the same packet ordinals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The command and its arguments (after `--`).
    #[arg(required = true, last = true)]
    pub command: Vec<OsString>,
}

/// `shell`'s arguments, checked: the profile loaded.
pub(crate) struct Shell {
    profile: Profile,
    seed: u64,
    command: Vec<OsString>,
}

impl ShellArgs {
    pub(crate) fn validate(self) -> Result<Shell, CliError> {
        Ok(Shell {
            profile: load_profile(&self.profile, "--profile")?,
            seed: self.seed,
            command: self.command,
        })
    }
}

pub fn run(s: Shell) -> Result<(), CliError> {
    use crate::link::shell::{self, ShellError};
    let rt = runtime()?;
    let code = rt.block_on(shell::run(&s.profile, s.seed, &s.command));
    match code {
        Ok(0) => Ok(()),
        Ok(code) => {
            // The command's own exit code is faultrig's; it has said what went wrong.
            drop(rt);
            std::process::exit(code)
        }
        Err(ShellError::Namespace(e)) => Err(namespace_error(e)),
        Err(e @ ShellError::Spawn { .. }) => Err(CliError::Usage(format!("faultrig shell: {e}"))),
        Err(e) => Err(CliError::Failed(anyhow::anyhow!("faultrig shell: {e}"))),
    }
}
