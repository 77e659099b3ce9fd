//! The `faultrig` binary: parse the command line, set up logging, dispatch to [`faultrig::cli`].

#![forbid(unsafe_code)]

use clap::Parser;

/// The load driver allocates per call (requests, JSON, replies) and glibc's allocator showed up
/// in its profiles at ~13 % of client CPU; mimalloc's thread-local free lists cost far less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = faultrig::cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    raise_fd_limit();
    if let Err(e) = faultrig::cli::run(cli) {
        eprintln!("error: {e}");
        std::process::exit(e.exit_code());
    }
}

/// A proxy holds two sockets per connection; the default soft limit (1024) would cap it near
/// 500 connections. Raise the soft limit to the hard one, but never the hard one: that is the
/// operator's (`ulimit -n`), and the connection caps are sized from it.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}
