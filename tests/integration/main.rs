//! magpie's integration tests: real sockets on loopback, magpie started
//! in-process (or as the built binary where a signal or the CLI is the point).

mod bad_input;
mod bounded_load;
mod config_files;
mod failover;
mod proxy_protocol;
mod shutdown;
mod stickiness;
mod support;
mod transfer;
