//! faultrig's integration tests: one binary, one module per area, shared helpers in `util`.

mod api;
mod api_create;
mod api_matrix;
mod backend;
mod calibrate;
mod cli;
mod ctl;
mod e2e;
mod external;
mod flavours;
mod limits;
mod link;
mod memory;
mod node;
mod proxy;
mod remote;
mod report;
mod run;
mod targets;
mod thrift;
mod toxic_bounds;
mod util;
