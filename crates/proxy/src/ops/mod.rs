//! What an operator runs and reads: the admin endpoint, the Prometheus
//! export, reloads, `magpie check` and `magpie probe`. Nothing on the data
//! paths imports this floor.
//!
//! | module | owns |
//! |---|---|
//! | [`admin`] | the read-only admin HTTP endpoint on a thread of its own: metrics (gzip, one rendering shared by concurrent scrapes), health, table, route |
//! | [`metrics`] | the Prometheus export: every family declared once, with its reader |
//! | [`reload`] | SIGHUP and file watching → parse → build → publish, or keep the old snapshot |
//! | [`check`] | what `magpie check` prints: listeners, routing settings, pool, fingerprint, warnings |
//! | [`probe`] | `magpie probe`: one HTTP `GET`, exit 0 on 2xx (container health checks) |
//! | [`upgrade`] | SIGUSR2: the binary at the same path takes over the listening sockets and the session pins; this process drains |

pub(crate) mod admin;
pub mod check;
pub(crate) mod metrics;
pub mod probe;
pub(crate) mod reload;
pub(crate) mod upgrade;
