//! magpie's proxy: a consistent-hash load balancer, per TCP connection
//! (`mode: tcp`) or per HTTP request (`mode: http`). The pure parts (hash,
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
//! a [`health::Target`], and both data paths ask [`route`] which backends take
//! a key. No two files, and no two top-level modules, import each other.
//!
//! | module | owns |
//! |---|---|
//! | [`app`] | start and run a whole magpie: listeners, admin, health, reload, drain |
//! | [`check`] | what `magpie check` prints: listeners, routing settings, pool, fingerprint, warnings |
//! | [`config`] | YAML → `RawConfig` → validated `Config`, errors with file:line:column; defaults and bounds; listeners' TLS certificates, loaded with the config |
//! | [`discovery`] | `dns` and `srv` backends: resolved at start, on reload and every interval; last good answer kept |
//! | [`snapshot`] | `Snapshot` (version, fingerprint, backends, table, settings) and the `Shared` state it is published in |
//! | [`backend`] | a backend's identity and live state: load, traffic, health, drain |
//! | [`key_budget`] | the bytes all requests together hold while reading bodies for keys (`limits.key_buffer_bytes`) |
//! | [`route`] | candidates + accept policy (health, bounded-load caps, attempts, fail-open) → the backends to try |
//! | [`health`] | a backend's health: its state, active checks (TCP or HTTP) with rise/fall, passive failures, engine load scraped from its metrics |
//! | [`proxy_protocol`] | the intake both data paths share: PROXY v1/v2 in from trusted peers, v2 out |
//! | [`read_ahead`] | a client stream with the bytes already read from it, replayed unchanged |
//! | [`listener`] | the accept loop both data paths share: limits, back-off, graceful drain |
//! | [`net`] | binding, socket options, connecting with a deadline, address types; TLS towards backends (`tls_client`) |
//! | [`tcp`] | `mode: tcp`: one connection in phases, its header or TLS server-name key from the first bytes, copying both ways |
//! | [`http`] | `mode: http`: TLS termination (the handshake, the certificate by SNI from the snapshot), each request's keys (session and group) and pin, framing checks, forwarding in phases, deadlines towards backends and clients, pooled upstreams, streamed bodies; plain HTTP/1.1 through its own pass-through ([`http::h1`]), the rest through hyper |
//! | [`sessions`] | session pins: a key's backend kept while the key is in use |
//! | [`recent`] | what routing last did with each key: where and why, where it spilled (it stays), cache misses and their causes |
//! | [`reload`] | SIGHUP and file watching → parse → build → publish, or keep the old snapshot |
//! | [`access_log`] | one line per request (mode http) or connection (mode tcp): sampling, a bounded queue that drops rather than waits, JSON or text lines, the writer task (batches, reopens on SIGUSR1) |
//! | [`stats`] | the global counters the data paths bump, and latency histograms |
//! | [`metrics`] | the Prometheus export: every family declared once, with its reader |
//! | [`supervise`] | long-lived tasks restarted (and counted) if they panic; the panic hook |
//! | [`throttle`] | rate-limited log lines for conditions that can repeat thousands of times a second |
//! | [`admin`] | the read-only admin HTTP endpoint on a thread of its own: metrics (gzip, one rendering shared by concurrent scrapes), health, table, route |
//! | [`probe`] | `magpie probe`: one HTTP `GET`, exit 0 on 2xx (container health checks) |
//!
//! `unsafe` is denied everywhere but [`tcp::pipe`], whose splice(2) calls
//! have no safe wrapper.

#![deny(unsafe_code)]

pub mod access_log;
pub mod admin;
pub mod app;
pub mod backend;
pub mod check;
pub mod config;
pub mod discovery;
pub mod health;
pub mod http;
pub mod key_budget;
pub mod listener;
pub mod metrics;
pub mod net;
pub mod probe;
pub mod proxy_protocol;
pub mod read_ahead;
pub mod recent;
pub mod reload;
pub mod route;
pub mod sessions;
pub mod snapshot;
pub mod stats;
pub mod supervise;
pub mod tcp;
pub mod throttle;
