//! What the data paths report, and what keeps them observable: counters and
//! latency histograms, access log lines, rate-limited log lines, supervised
//! tasks, and the memory budget of bodies read for keys. It sits below
//! routing and the data paths, which all write here; the Prometheus export
//! and the admin endpoint ([`crate::ops`]) read it.
//!
//! | module | owns |
//! |---|---|
//! | [`stats`] | the global counters the data paths bump, latency histograms, TLS handshake labels |
//! | [`datagrams`] | mode udp's counters: flows open, created and ended, datagrams dropped by why |
//! | [`access_log`] | one line per request (mode http), connection (mode tcp) or flow (mode udp): sampling, a bounded queue that drops rather than waits, JSON or text lines, the writer task (batches, reopens on SIGUSR1) |
//! | [`key_budget`] | the bytes all requests together hold while reading bodies for keys (`limits.key_buffer_bytes`) |
//! | [`throttle`] | rate-limited log lines for conditions that can repeat thousands of times a second |
//! | [`supervise`] | long-lived tasks restarted (and counted) if they panic; the panic hook |

pub(crate) mod access_log;
pub(crate) mod datagrams;
pub(crate) mod key_budget;
pub(crate) mod stats;
pub(crate) mod supervise;
pub(crate) mod throttle;
