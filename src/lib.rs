//! magpie: a Layer-4 consistent-hash TCP load balancer.
//!
//! ```text
//! YAML file ──parse──▶ RawConfig ──validate──▶ Config ──build──▶ Snapshot ──publish──▶ ArcSwap<Snapshot>
//!                                                                                     │ load() once per connection
//! accept ─▶ (PROXY header) ─▶ key ─▶ snapshot.candidates(key) ─▶ connect first that takes it ─▶ copy both ways
//!                                                                                     │
//!                                                      per-backend live state (atomics) ─▶ metrics / admin
//! ```
//!
//! Each arrow is one module's job, and nothing flows backwards: the data path
//! never writes config, and placement never does I/O.
//!
//! | module | owns |
//! |---|---|
//! | [`hash`] | `h64`, the one hash everything uses |
//! | [`placement`] | pure placement schemes: Maglev, ring, rendezvous, jump, mod N, bounded loads |
//! | [`simulate`] | the placement lab behind `magpie simulate` |
//! | [`config`] | YAML → `RawConfig` → validated `Config`, errors with file:line:column |
//! | [`snapshot`] | `Snapshot` (version, fingerprint, backends, table, settings), built from a `Config` |
//! | [`backend`] | a backend's identity and live state (active, counters, health flag) |
//! | [`key`] | the connection key: source IP, source address, or an HTTP header from the first bytes |
//! | [`proxy_protocol`] | PROXY v1/v2 in from trusted peers, v2 out |
//! | [`proxy`] | one connection: key → candidates → connect with fallback → copy → count |
//! | [`server`] | listeners, the accept loop, limits, graceful drain |
//! | [`reload`] | SIGHUP and file watching → parse → build → publish, or keep the old snapshot |
//! | [`health`] | active checks with rise/fall; marks backends up or down (no table rebuild) |
//! | [`metrics`] | global counters and their Prometheus export |
//! | [`admin`] | the read-only admin HTTP endpoint: metrics, health, table, route |
//! | [`plan`] | what a config change would move, before it is made (`magpie plan`) |
//! | [`demo`] | `magpie demo`: three HTTP backends and magpie in front of them |

pub mod admin;
pub mod app;
pub mod backend;
pub mod config;
pub mod demo;
pub mod hash;
pub mod health;
pub mod http;
pub mod key;
pub mod listener;
pub mod metrics;
pub mod net;
pub mod placement;
pub mod plan;
pub mod proxy_protocol;
pub mod reload;
pub mod route;
pub mod sessions;
pub mod simulate;
pub mod snapshot;
pub mod stats;
pub mod tcp;
