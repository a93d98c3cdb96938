//! magpie's proxy: a consistent-hash load balancer, per TCP connection
//! (`mode: tcp`), per HTTP request (`mode: http`) or per flow of datagrams
//! (`mode: udp`). The pure parts (hash, placement, keys, usage) are in
//! `magpie-core`; the `magpie` command and the lab build on this crate.
//!
//! ```text
//! YAML file / DNS ──parse──▶ RawConfig ──validate──▶ Config ──build──▶ Snapshot ──publish──▶ ArcSwap<Snapshot>
//!                                                                                           │ load() once per connection / request / flow
//! tcp:  accept ─▶ intake (PROXY header, ReadAhead) ─▶ key from address, first bytes or TLS SNI ─┐
//! http: accept ─▶ intake ─▶ (TLS) ─▶ each request: key from header / JSON body / conversation ──┼─▶ routing::decision::plan
//! udp:  datagram ─▶ flow table ─▶ a new flow: key from address or QUIC connection ID ───────────┘      │ (targets, why, what to wait for)
//!          ┌──────────────────────────────────────────────────────────────────────────────────────────┘
//!          └─▶ take a slot (cap, or queue) ─▶ connect / send ─▶ commit (key memory, pins, openings) ─▶ copy / stream / relay
//!                                                                                           │
//!                                     per-backend live state (load, traffic, health, drain) ─▶ stats ─▶ metrics / admin
//! ```
//!
//! Each arrow is one module's job, and nothing flows backwards: the data
//! paths never write config, placement never does I/O, admin never imports a
//! data path, keys know nothing of the config, health knows a backend only as
//! a [`routing::health::Target`], and every data path asks
//! [`routing::decision`] where a key goes and tells it where it went. No two
//! files, and no two top-level modules, import each other.
//!
//! The crate is built in floors; each imports only the floors below it, so
//! the list reads bottom-up:
//!
//! | floor | owns |
//! |---|---|
//! | [`net`] | binding, socket options, connecting with a deadline, address types; TLS towards backends |
//! | [`config`] | YAML → `RawConfig` → validated `Config`, errors with file:line:column; defaults and bounds; listeners' TLS certificates, loaded with the config |
//! | [`telemetry`] | what the data paths report: counters, access log lines, rate-limited logs, supervised tasks, the key-body memory budget |
//! | [`routing`] | the snapshot and the running instance's state; the one routing decision (plan, take, commit) and what it reads: `route`, backends' live state and health, session pins, the key memory, the queue, the LLM policy; discovery |
//! | [`intake`] | the accept loop, PROXY protocol, bytes read ahead: where the stream data paths begin |
//! | [`tcp`] | data path `mode: tcp`: one connection in phases, its header or TLS server-name key from the first bytes, copying both ways |
//! | [`http`] | data path `mode: http`: TLS termination, each request's keys, one request journey over two wire formats (its own HTTP/1.1 pass-through, hyper for HTTP/2), pooled upstreams, deadlines |
//! | [`udp`] | data path `mode: udp`: flows of datagrams keyed by address or QUIC connection ID, each with its own socket to its backend; the flow table |
//! | [`ops`] | admin endpoint, Prometheus export, reload, `check`, `probe` |
//! | [`app`] | start and run a whole magpie: listeners, admin, health, reload, drain |
//! | [`parsers`] | what magpie reads from peers, public for the fuzz targets: PROXY headers, engines' expositions, a connection's first bytes |
//! | [`testing`] | the `testing` feature: the end-to-end tests' handle on a running magpie (what no metric or admin route shows) |
//!
//! The public surface is small: [`app`] (start a magpie), [`config`] (its
//! validated model), [`check`], [`probe`], [`Snapshot`] (what `lookup` and
//! `plan` compute), [`parsers`]. Everything else is `pub(crate)`
//! (`unreachable_pub` is warned).
//!
//! `unsafe` is denied everywhere but [`net::sys`]: the system calls with no
//! safe wrapper (splice(2) for mode tcp, a socket's drop count for mode
//! udp), one libc call each.

#![deny(unsafe_code)]
#![warn(unreachable_pub)]

pub mod app;
pub mod config;
pub(crate) mod http;
pub(crate) mod intake;
pub(crate) mod net;
pub(crate) mod ops;
pub(crate) mod routing;
pub(crate) mod tcp;
pub(crate) mod telemetry;
pub(crate) mod udp;

#[cfg(feature = "testing")]
pub mod testing;

// The public surface: what the `magpie` command and the lab use. Everything
// else is the crate's own; the end-to-end tests read the rest through
// `/metrics`, the admin API, or `testing` (the `testing` feature).
pub use net::activation::Inherited;
pub use ops::{check, probe};
pub use routing::backend::Backend;
pub use routing::discovery::Discovery;
pub use routing::snapshot::{Snapshot, SnapshotError, Table};
pub use telemetry::supervise::install_panic_hook;

/// What magpie reads from peers, as pure functions over bytes: public so
/// that the fuzz targets (`crates/proxy/fuzz`) and their corpus replay drive
/// them as the data paths do.
pub mod parsers {
    /// PROXY protocol headers (v1 and v2): parse, tell a signature, build v2.
    pub use crate::intake::proxy_protocol::header::{
        MAX_HEADER_BYTES, Origin, Parsed, ProxyProtocolError, Signature, parse, signature,
        v2_header,
    };
    /// An engine's Prometheus exposition, read for its load (`health.load`).
    pub use crate::routing::health::exposition::{Sample, read as engine_load};
    /// A connection's first bytes scanned for a header key (mode tcp).
    pub use crate::tcp::header_key::{HeadScan, scan_head};
}
