//! `faultrig supervise` (hidden): how `faultrig run` ties a redis-server's life to its own.

use clap::Args;

use super::{runtime, shutdown_signal, CliError};

#[derive(Debug, Args)]
pub struct SuperviseArgs {
    #[arg(long = "parent")]
    pub parent: u32,
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub program: Vec<String>,
}

/// PROGRAM's exit status becomes ours; a SIGTERM (sent by the kernel when the parent dies, or by
/// the parent's drop guard) stops PROGRAM first. Its flags need no checking beyond clap's.
pub fn run(args: SuperviseArgs) -> Result<(), CliError> {
    let program = &args.program;
    crate::child::die_with_parent(args.parent).map_err(|e| CliError::Failed(e.into()))?;
    runtime()?.block_on(async {
        let stop = shutdown_signal();
        let mut child = tokio::process::Command::new(&program[0])
            .args(&program[1..])
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| CliError::Failed(anyhow::anyhow!("start {}: {e}", program[0])))?;
        let status = tokio::select! {
            status = child.wait() => status,
            _ = stop => {
                if let Some(pid) = child.id() {
                    let pid = nix::unistd::Pid::from_raw(pid as i32);
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                }
                child.wait().await
            }
        }
        .map_err(|e| CliError::Failed(e.into()))?;
        match status.code() {
            Some(0) => Ok(()),
            _ => Err(CliError::Failed(anyhow::anyhow!(
                "{} exited ({status})",
                program[0]
            ))),
        }
    })
}
