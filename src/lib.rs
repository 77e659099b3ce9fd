//! faultrig: a network fault-injection test rig.
//!
//! A map of the crate, by layer:
//!
//! - [`units`]: the durations, bit rates and sizes people type, parsed one way everywhere.
//! - [`profile`]: network profiles (TOML) parsed, validated and resolved per direction.
//! - [`fault`]: the pure, seeded impairment model. Time and bytes in, release times out; no
//!   sockets, no clock, so it is tested on a virtual clock against closed forms.
//! - [`timer`]: the precise (microsecond) scheduler: tokio's timer rounds to milliseconds.
//! - [`proxy`]: the TCP proxy that puts the model between real sockets, with live counters.
//! - [`net`]: listener set-up shared by everything that accepts connections.
//! - [`cli`]: the command line (flags defined once, here); `main.rs` only dispatches.

#![forbid(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod fault;
pub mod flavour;
pub mod net;
pub mod profile;
pub mod proxy;
pub mod results;
pub mod rig;
pub mod service;
pub mod timer;
pub mod units;
pub mod workload;
