//! `faultrig serve`: an RPC server of one flavour.

use std::net::SocketAddr;

use clap::Args;

use super::{
    announce_address, listen, parse_flavour, parse_max_connections, runtime, shutdown_signal,
    CliError,
};
use crate::api::registry::DEFAULT_LISTEN;
use crate::flavour::{self, Flavour};
use crate::service::{Backend, RigService};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// RPC flavour: grpc, http1-json, http2-json, tcp-binary, thrift.
    #[arg(long, value_parser = parse_flavour)]
    pub flavour: &'static dyn Flavour,
    /// Address to serve on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Serve the listening TCP socket given as standard input instead of binding --listen
    /// (inetd-style; `faultrig run --engine link` hands each server a socket made in the link's
    /// namespace this way).
    #[arg(long, conflicts_with = "listen")]
    pub listen_stdin: bool,
    /// TCP_NODELAY on accepted connections; false leaves Nagle's algorithm on.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub nodelay: bool,
    /// Stock each SKU starts with, for Deduct.
    #[arg(long, default_value_t = crate::service::DEFAULT_STOCK)]
    pub stock: i64,
    /// What Deduct does after the stock update: none, sleep:DUR, or redis://HOST:PORT (a Redis
    /// DECRBY per call).
    #[arg(long, alias = "downstream", value_parser = Backend::parse, default_value = "none")]
    pub backend: Backend,
    /// Most connections at once; more are accepted and reset. Default 65536, lowered to what
    /// the file-descriptor limit leaves room for; a value given here is used as is.
    #[arg(long, value_parser = parse_max_connections)]
    pub max_connections: Option<usize>,
    /// Exit when this process (the runner that started the server) dies.
    #[arg(long, hide = true)]
    pub parent: Option<u32>,
}

/// Where the server gets its listening socket.
enum Listener {
    Bind(SocketAddr),
    Stdin,
}

/// `serve`'s arguments, checked (clap typed every flag as it parsed it).
pub(crate) struct Serve {
    flavour: &'static dyn Flavour,
    listener: Listener,
    nodelay: bool,
    stock: i64,
    backend: Backend,
    max_connections: Option<usize>,
    parent: Option<u32>,
}

impl ServeArgs {
    pub(crate) fn validate(self) -> Result<Serve, CliError> {
        Ok(Serve {
            flavour: self.flavour,
            listener: match self.listen_stdin {
                true => Listener::Stdin,
                false => Listener::Bind(self.listen),
            },
            nodelay: self.nodelay,
            stock: self.stock,
            backend: self.backend,
            max_connections: self.max_connections,
            parent: self.parent,
        })
    }
}

pub fn run(s: Serve) -> Result<(), CliError> {
    if let Some(parent) = s.parent {
        crate::child::die_with_parent(parent).map_err(|e| CliError::Failed(e.into()))?;
    }
    let rt = runtime()?;
    rt.block_on(async move {
        // Before listening: a runner waiting for the address must never see a server that
        // cannot reach its backend.
        let backend = s
            .backend
            .connect()
            .await
            .map_err(|e| CliError::Usage(format!("--backend: {e}")))?;
        let announce = |local| format!("faultrig serve {} listening on {local}", s.flavour.name());
        let listener = match s.listener {
            Listener::Stdin => listener_from_stdin(announce)?,
            Listener::Bind(addr) => listen(addr, announce)?,
        };
        let service = std::sync::Arc::new(RigService::new(s.stock, backend));
        flavour::serve_with(
            s.flavour,
            listener,
            service,
            shutdown_signal(),
            s.nodelay,
            s.max_connections,
        )
        .await
        .map_err(|e| CliError::Failed(e.into()))
    })
}

/// The listening socket on standard input (`serve --listen-stdin`), announced as [`listen`]
/// announces a bound one.
fn listener_from_stdin(
    announce: impl FnOnce(SocketAddr) -> String,
) -> Result<tokio::net::TcpListener, CliError> {
    let bad = |e: &dyn std::fmt::Display| {
        CliError::Usage(format!(
            "--listen-stdin: standard input is not a listening TCP socket: {e}"
        ))
    };
    // dup: the socket gets a descriptor of its own, and stdin stays what it was.
    use std::os::fd::AsFd;
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| bad(&e))?;
    let socket = socket2::Socket::from(fd);
    if !socket.is_listener().map_err(|e| bad(&e))? {
        return Err(bad(&"not listening"));
    }
    socket.set_nonblocking(true).map_err(|e| bad(&e))?;
    let listener = tokio::net::TcpListener::from_std(socket.into()).map_err(|e| bad(&e))?;
    let local = listener.local_addr().map_err(|e| bad(&e))?;
    announce_address(&announce(local));
    Ok(listener)
}
