//! magpie's integration tests: real sockets on loopback, magpie started
//! in-process (or as the built binary where a signal or the CLI is the point).

mod admin;
mod bad_input;
mod bounded_load;
mod cache_hits;
mod config_files;
mod conversation;
mod demo;
mod deploy;
mod discovery;
mod engine_load;
mod failover;
mod faults;
mod fuzz_corpus;
mod group;
mod health;
mod http2_resets;
mod http_framing;
mod http_mode;
mod http_timeouts;
mod key_buffers;
mod probe;
mod proxy_protocol;
mod reload;
mod scrapes;
mod shared_pins;
mod shared_store;
mod shutdown;
mod simulate;
mod sni;
mod spill;
mod stickiness;
mod support;
mod transfer;
mod upstream_tls;
