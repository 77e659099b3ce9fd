//! `faultrig profiles`: list, show and check network profiles.

use std::io::Write;
use std::path::PathBuf;

use clap::Subcommand;

use super::{load_profile, CliError};
use crate::profile::Profile;

#[derive(Debug, Subcommand)]
pub enum ProfilesAction {
    /// List the built-in profiles (the default).
    List,
    /// Print a profile's effective values, defaults filled in, as a profile file.
    Show {
        /// Built-in name or path to a .toml file.
        profile: String,
    },
    /// Validate profile files.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

/// Its arguments need no checking beyond clap's: checking profiles is what it does.
pub fn run(action: ProfilesAction) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match action {
        ProfilesAction::List => {
            for name in Profile::builtin_names() {
                let p = Profile::builtin(name).expect("listed");
                let _ = writeln!(out, "{name:<18} {}", p.description);
            }
        }
        ProfilesAction::Show { profile } => {
            let p = load_profile(&profile, "profiles show")?;
            let _ = write!(out, "{p}");
        }
        ProfilesAction::Check { files } => {
            for file in files {
                let p = Profile::load_file(&file).map_err(|e| CliError::Usage(e.to_string()))?;
                let _ = writeln!(out, "{}: ok ({})", file.display(), p.name);
            }
        }
    }
    Ok(())
}
