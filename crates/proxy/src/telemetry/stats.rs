//! The global counters the data paths, reload and admin bump; each only grows.
//!
//! Per-backend counters live in each backend's live state; these are the ones
//! that belong to no backend (accepts, rejections, key fallbacks, reloads).
//! Bumping one is a relaxed atomic add: nothing on the hot path takes a lock
//! or looks up a label. The Prometheus export (`metrics`) reads them at scrape time.

use std::sync::atomic::{AtomicU64, Ordering};

use magpie_core::key::FallbackReason;
use magpie_core::key::group::GroupMiss;
use magpie_core::labels;

labels! {
    /// How a TLS handshake on a listener ended (`mode: http`).
    pub(crate) enum Handshake {
        /// Done; the connection is served.
        Ok => "ok",
        /// No ClientHello, or no finished handshake, within
        /// `http.first_byte_timeout` of the connection's start.
        Timeout => "timeout",
        /// The client offered no protocol version, cipher suite, key
        /// exchange group or signature scheme magpie has.
        NoSharedCipher => "no_shared_cipher",
        /// The client refused magpie's certificate (an alert such as
        /// bad_certificate or unknown_ca).
        BadCertificate => "bad_certificate",
        /// What the client sent was not TLS, or broke its rules.
        Protocol => "protocol",
        /// The client closed or reset the connection during the handshake.
        Closed => "closed",
        /// Anything else.
        Other => "other",
    }
}

labels! {
    /// The TLS version of a finished handshake.
    pub(crate) enum TlsVersion {
        Tls12 => "1.2",
        Tls13 => "1.3",
    }
}

labels! {
    /// Why a client connection was closed without reaching a backend.
    pub(crate) enum ClientFailure {
        /// Every connect attempt failed (or every candidate was refused).
        NoBackend => "no_backend",
        /// A trusted peer sent no valid PROXY header, or an untrusted one sent one.
        ProxyProtocol => "proxy_protocol",
        /// `mode: http`: a request head did not arrive within `key.read_timeout`
        /// (the client got `408`).
        HeadTimeout => "head_timeout",
        /// `mode: http`: the client's body failed while it was read for the key.
        BadRequest => "bad_request",
        /// magpie ran out of file descriptors or memory connecting to a backend.
        LocalResources => "local_resources",
        /// `mode: http`: the backend failed the request after it was sent,
        /// or switched protocols unasked (the client got `502`).
        BackendFailed => "backend_failed",
        /// `mode: http`: the backend sent no response head within
        /// `http.response_timeout` (the client got `504`).
        ResponseTimeout => "response_timeout",
        /// `mode: http`: the client's request body sent nothing for
        /// `http.body_timeout` while it was passed on (the client got `408`).
        BodyTimeout => "body_timeout",
        /// `queue`: every target was at its limit and the queue was full
        /// (the client got `429`).
        QueueFull => "queue_full",
        /// `queue`: no target had room within `queue.timeout` (`503`).
        QueueTimeout => "queue_timeout",
    }
}

labels! {
    /// Why magpie closed a quiet client connection (`mode: http`).
    pub(crate) enum QuietClose {
        /// Nothing arrived within `http.first_byte_timeout` of the accept.
        FirstByte => "first_byte_timeout",
        /// No next request within `http.keepalive_timeout` of the last answer.
        Keepalive => "keepalive_timeout",
    }
}

labels! {
    /// Where magpie itself ran out of something (file descriptors, socket
    /// buffers, memory): EMFILE, ENFILE, ENOBUFS, ENOMEM. Never a backend's fault.
    pub(crate) enum Exhausted {
        /// Accepting a client connection.
        Accept => "accept",
        /// Accepting an admin connection.
        AdminAccept => "admin_accept",
        /// Opening a connection to a backend.
        Connect => "connect",
        /// Opening a health check's connection (the check is skipped).
        HealthCheck => "health_check",
    }
}

/// Global counters; each only grows.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    key_fallbacks: [AtomicU64; FallbackReason::COUNT],
    /// Requests without a group (`key.group`), routed by their session key.
    group_misses: [AtomicU64; GroupMiss::COUNT],
    rejected: AtomicU64,
    accept_errors: AtomicU64,
    client_failures: [AtomicU64; ClientFailure::COUNT],
    quiet_closes: [AtomicU64; QuietClose::COUNT],
    accepted: AtomicU64,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    exhausted: [AtomicU64; Exhausted::COUNT],
    /// HTTP/2 streams reset by the client after dispatch, and connections
    /// sent GOAWAY for passing `limits.h2_resets_per_second`.
    h2_resets: AtomicU64,
    h2_reset_goaways: AtomicU64,
    /// TLS handshakes that failed, by how (`Handshake::Ok` unused), and
    /// those that finished, by version.
    tls_failed: [AtomicU64; Handshake::COUNT],
    tls_ok: [AtomicU64; TlsVersion::COUNT],
    /// The bytes requests hold while their bodies are read for keys.
    pub(crate) key_budget: std::sync::Arc<crate::telemetry::key_budget::KeyBudget>,
    /// Mode udp's flows and drops.
    pub(crate) datagrams: crate::telemetry::datagrams::DatagramStats,
    /// Disaggregated requests, by how they were served (the index of the
    /// routing's decision).
    splits: [AtomicU64; SPLIT_DECISIONS],
}

/// How many ways a disaggregated request can be served.
pub(crate) const SPLIT_DECISIONS: usize = 4;

impl Stats {
    /// A disaggregated request was served as decision `index` says.
    pub(crate) fn count_split(&self, index: usize) {
        if let Some(counter) = self.splits.get(index) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Disaggregated requests served as decision `index` says.
    pub(crate) fn splits(&self, index: usize) -> u64 {
        self.splits
            .get(index)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    pub(crate) fn count_tls_handshake(&self, result: Result<TlsVersion, Handshake>) {
        let counter = match result {
            Ok(version) => &self.tls_ok[version.index()],
            Err(how) => &self.tls_failed[how.index()],
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Finished handshakes of `version`.
    pub(crate) fn tls_handshakes_ok(&self, version: TlsVersion) -> u64 {
        self.tls_ok[version.index()].load(Ordering::Relaxed)
    }

    /// Handshakes that ended as `how` (not `Ok`).
    pub(crate) fn tls_handshakes_failed(&self, how: Handshake) -> u64 {
        self.tls_failed[how.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn count_h2_reset(&self) {
        self.h2_resets.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_h2_reset_goaway(&self) {
        self.h2_reset_goaways.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn h2_resets(&self) -> u64 {
        self.h2_resets.load(Ordering::Relaxed)
    }

    pub(crate) fn h2_reset_goaways(&self) -> u64 {
        self.h2_reset_goaways.load(Ordering::Relaxed)
    }

    pub(crate) fn count_fallback(&self, why: FallbackReason) {
        self.key_fallbacks[why.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn fallbacks(&self, why: FallbackReason) -> u64 {
        self.key_fallbacks[why.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn count_group_miss(&self, why: GroupMiss) {
        self.group_misses[why.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn group_misses(&self, why: GroupMiss) -> u64 {
        self.group_misses[why.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn count_rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    pub(crate) fn count_accept_error(&self) {
        self.accept_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn accept_errors(&self) -> u64 {
        self.accept_errors.load(Ordering::Relaxed)
    }

    pub(crate) fn count_client_failure(&self, why: ClientFailure) {
        self.client_failures[why.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn client_failures(&self, why: ClientFailure) -> u64 {
        self.client_failures[why.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn count_quiet_close(&self, why: QuietClose) {
        self.quiet_closes[why.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn quiet_closes(&self, why: QuietClose) -> u64 {
        self.quiet_closes[why.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn count_exhausted(&self, during: Exhausted) {
        self.exhausted[during.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn exhausted(&self, during: Exhausted) -> u64 {
        self.exhausted[during.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn count_accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    pub(crate) fn count_reload(&self, ok: bool) {
        let counter = if ok {
            &self.reloads_ok
        } else {
            &self.reloads_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reloads that published a snapshot (`true`) or kept the old one (`false`).
    pub(crate) fn reloads(&self, ok: bool) -> u64 {
        let counter = if ok {
            &self.reloads_ok
        } else {
            &self.reloads_failed
        };
        counter.load(Ordering::Relaxed)
    }
}

/// Upper bounds (seconds) of the latency buckets: from 5 ms (a cached reply
/// on a LAN) to 10 minutes (a long LLM generation streamed to the end).
pub(crate) const LATENCY_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Upper bounds (seconds) for fast operations on a nearby server (a session
/// store round trip): 100 µs to 1 s.
pub(crate) const FAST_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// A latency histogram with fixed bounds ([`LATENCY_BUCKETS`] unless made
/// [`with_bounds`](Histogram::with_bounds)): one relaxed atomic add per
/// observation, no lock, no allocation.
#[derive(Debug)]
pub(crate) struct Histogram {
    bounds: &'static [f64],
    /// Observations at or below each bound (not cumulative; the export sums).
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    /// Sum of observations in microseconds.
    sum_micros: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::with_bounds(&LATENCY_BUCKETS)
    }
}

impl Histogram {
    pub(crate) fn with_bounds(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe(&self, d: std::time::Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// The upper bounds, in seconds.
    pub(crate) fn bounds(&self) -> &'static [f64] {
        self.bounds
    }

    /// Cumulative counts per bound, in [`Histogram::bounds`] order.
    pub(crate) fn cumulative(&self) -> Vec<u64> {
        let mut running = 0;
        self.buckets
            .iter()
            .map(|b| {
                running += b.load(Ordering::Relaxed);
                running
            })
            .collect()
    }

    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub(crate) fn sum_seconds(&self) -> f64 {
        self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_millis(7));
        h.observe(Duration::from_secs(700));
        let c = h.cumulative();
        assert_eq!(c[0], 1);
        assert_eq!(c[1], 2);
        assert_eq!(c[LATENCY_BUCKETS.len() - 1], 2);
        assert_eq!(h.count(), 3);
        assert!((h.sum_seconds() - 700.01).abs() < 1e-6);
    }
}
