//! faultrig: a network fault-injection test rig.
//!
//! A map of the crate, by layer:
//!
//! - [`units`]: the durations, bit rates and sizes people type, parsed one way everywhere.
//! - [`profile`]: network profiles (TOML) parsed, validated and resolved per direction.
//! - [`fault`]: the pure, seeded impairment model. Time and bytes in, release times out; no
//!   sockets, no clock, so it is tested on a virtual clock against closed forms.
//! - [`timer`]: the precise (microsecond) scheduler: tokio's timer rounds to milliseconds.
//! - [`toxic`]: faults switched on while a proxy runs (Toxiproxy's toxics and ours), resolved
//!   per connection into model parameters; pure, like [`fault`].
//! - [`proxy`]: the TCP proxy that puts the model between real sockets, with live counters.
//! - [`link`]: the link engine: real kernel TCP over an impaired packet path (TUN devices in
//!   private network namespaces), for `faultrig shell` and the proxy's kernel engine.
//! - [`api`]: the control API (Toxiproxy's REST API and Prometheus metrics) over named proxies.
//! - [`rig`]: the operations of `proto/rig.proto` as [`rig::Call`] / [`rig::Reply`];
//!   [`service`] answers them, once, for every flavour's server, with an optional backend
//!   (a wait or a real Redis; [`local_redis`] starts a private one for experiments and tests).
//! - [`flavour`]: one file per RPC flavour (server and client behind one trait).
//! - [`workload`]: what each call carries, and how a reply is checked.
//! - [`bench`]: the load driver and its connection modes; [`results`]: the CSV schema.
//! - [`target`]: generic targets (any gRPC service, any HTTP endpoint) for the load driver,
//!   beside the flavours' own ([`bench::RigTarget`]).
//! - [`calibrate`]: `faultrig calibrate`, the model against real kernel TCP, side by side.
//! - [`experiment`], [`runner`], [`report`]: experiment files, `faultrig run` (servers and
//!   proxies started here, or on other hosts driven through their control API), the tables;
//!   [`external`]: flavours in any language, run as a server and a client process.
//! - [`net`]: listener set-up, the one accept loop every server uses, and the per-core
//!   runtimes a proxy's connections run on; [`child`]: child
//!   processes that end with the process that started them.
//! - [`cli`]: the command line (flags defined once, here); `main.rs` only dispatches.

#![forbid(unsafe_code)]

pub mod api;
pub mod bench;
pub mod calibrate;
pub mod child;
pub mod cli;
pub mod experiment;
pub mod external;
pub mod fault;
pub mod flavour;
pub mod link;
pub mod local_redis;
pub mod net;
pub mod profile;
pub mod proxy;
pub mod report;
pub mod results;
pub mod rig;
pub mod runner;
pub mod service;
pub mod target;
pub mod timer;
pub mod toxic;
pub mod units;
pub mod workload;

/// Property tests of every decoder a peer or a file reaches (`scripts/fuzz.sh`).
#[cfg(test)]
mod fuzz;
