//! magpie's proxy: a consistent-hash load balancer, per TCP connection
//! (`mode: tcp`), per HTTP request (`mode: http`) or per flow of datagrams
//! (`mode: udp`). The pure parts (hash,
//! placement, keys, usage) are in `magpie-core`; the `magpie` command and
//! the lab build on this crate.
//!
//! ```text
//! YAML file / DNS ──parse──▶ RawConfig ──validate──▶ Config ──build──▶ Snapshot ──publish──▶ ArcSwap<Snapshot>
//!                                                                                           │ load() once per connection / request
//! tcp:  accept ─▶ intake (PROXY header, ReadAhead) ─▶ key from address or first bytes ─▶ route ─▶ connect first that takes it ─▶ copy both ways
//! http: accept ─▶ intake ─▶ (TLS) ─▶ each request: key from header / JSON body / conversation / address ─▶ route (pin) ─▶ pooled upstream ─▶ stream the response
//!                                                                                           │
//!                                     per-backend live state (load, traffic, health, drain) ─▶ stats ─▶ metrics / admin
//! ```
//!
//! Each arrow is one module's job, and nothing flows backwards: the data
//! paths never write config, placement never does I/O, admin never imports a
//! data path, keys know nothing of the config, health knows a backend only as
//! a [`routing::health::Target`], and both data paths ask [`routing::route`] which backends take
//! a key. No two files, and no two top-level modules, import each other.
//!
//! The crate is built in floors; each imports only the floors below it, so
//! the list reads bottom-up:
//!
//! | floor | owns |
//! |---|---|
//! | [`net`] | binding, socket options, connecting with a deadline, address types; TLS towards backends |
//! | [`config`] | YAML → `RawConfig` → validated `Config`, errors with file:line:column; defaults and bounds; listeners' TLS certificates, loaded with the config |
//! | [`telemetry`] | what the data paths report: counters, access log lines, rate-limited logs, supervised tasks, the key-body memory budget |
//! | [`routing`] | the snapshot and the running instance's state, `route`, backends' live state and health, session pins, recent decisions, discovery |
//! | [`intake`] | the accept loop, PROXY protocol, bytes read ahead: where both data paths begin |
//! | [`tcp`] | data path `mode: tcp`: one connection in phases, its header or TLS server-name key from the first bytes, copying both ways |
//! | [`http`] | data path `mode: http`: TLS termination, each request's keys and pin, one request journey over two wire formats (its own HTTP/1.1 pass-through, hyper for HTTP/2), pooled upstreams, deadlines |
//! | [`udp`] | data path `mode: udp`: flows of datagrams keyed by address or QUIC connection ID, each with its own socket to its backend; the flow table |
//! | [`ops`] | admin endpoint, Prometheus export, reload, `check`, `probe` |
//! | [`app`] | start and run a whole magpie: listeners, admin, health, reload, drain |
//!
//! `unsafe` is denied everywhere but [`tcp::pipe`], whose splice(2) calls
//! have no safe wrapper.

#![deny(unsafe_code)]

pub mod app;
pub mod config;
pub mod http;
pub mod intake;
pub mod net;
pub mod ops;
pub mod routing;
pub mod tcp;
pub mod telemetry;
pub mod udp;
