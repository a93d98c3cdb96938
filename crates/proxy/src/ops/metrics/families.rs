//! Every family magpie exports, each declared once: its name, type, labels
//! and help, and how its series are read at scrape time.
//!
//! [`families`] is what the exporter walks: the families read once per
//! backend ([`super::backend_families`], whose `backend` and `addr` labels
//! are filled in for each) and those read once per scrape, declared here.
//! docs/metrics.md lists the same families, and tests check
//! that each one is rendered and documented.

use prometheus::proto::MetricType;

use super::peak_ratio;
use super::series::{Family, Read};
use super::tls;
use crate::routing::discovery::Lookup;
use crate::routing::key_memory::MissCause;
use crate::routing::llm::disaggregation::Decision;
use crate::routing::route::How;
use crate::routing::sessions::store::{OpResult, Store};
use crate::telemetry::stats::{ClientFailure, Exhausted, FAST_BUCKETS, Histogram, QuietClose};
use crate::telemetry::supervise;
use magpie_core::key::FallbackReason;
use magpie_core::key::group::GroupMiss;

use MetricType::{COUNTER, GAUGE, HISTOGRAM};

/// Every exported family, backends' first. docs/metrics.md lists the same.
pub(crate) fn families() -> impl Iterator<Item = &'static Family> {
    (super::backend_families::BACKEND.iter())
        .chain(super::datagram_families::BACKEND)
        .chain(GLOBAL)
        .chain(super::queue_families::QUEUE)
        .chain(super::datagram_families::GLOBAL)
}

/// The families read once per scrape.
pub(crate) const GLOBAL: &[Family] = &[
    Family {
        name: "magpie_table_version",
        kind: GAUGE,
        labels: &[],
        help: "Version of the published table; 1 at start, plus one per applied reload.",
        read: Read::Global(|g, s| s.value(&[], g.snapshot.version as f64)),
    },
    Family {
        name: "magpie_table_backends",
        kind: GAUGE,
        labels: &[],
        help: "Backends in the published table (draining ones not counted); with pool totals (metrics.per_backend), this minus magpie_backend_up is how many are down.",
        read: Read::Global(|g, s| s.value(&[], g.snapshot.backends.len() as f64)),
    },
    Family {
        name: "magpie_table_info",
        kind: GAUGE,
        labels: &["algorithm", "fingerprint"],
        help: "Always 1; labels carry the algorithm and the table fingerprint.",
        read: Read::Global(|g, s| {
            let algorithm = g.snapshot.table.algorithm().as_str();
            s.value(&[algorithm, &g.snapshot.fingerprint], 1.0);
        }),
    },
    Family {
        name: "magpie_table_build_seconds",
        kind: GAUGE,
        labels: &[],
        help: "Seconds taken to build the published table.",
        read: Read::Global(|g, s| s.value(&[], g.snapshot.build_time.as_secs_f64())),
    },
    Family {
        name: "magpie_load_peak_ratio",
        kind: GAUGE,
        labels: &[],
        help: "The busiest backend's active connections over its weighted fair share of all active connections (1 = even; 0 when idle).",
        read: Read::Global(|g, s| {
            let snapshot = g.snapshot;
            s.value(&[], peak_ratio(&snapshot.backends, snapshot.total_weight));
        }),
    },
    Family {
        name: "magpie_disaggregation_requests_total",
        kind: COUNTER,
        labels: &["decision"],
        help: "With disaggregation: requests by how they were served (split: prefill half on the prefill pool; decode_holds: its decode backend lacked fewer than skip_below_tokens of the prompt; unsplittable: its body was not one JSON object read whole; prefill_failed: no prefill backend answered, the decode backend prefilled it).",
        read: Read::Global(|g, s| {
            for d in Decision::ALL {
                s.value(&[d.as_str()], g.stats.splits(d.index()) as f64);
            }
        }),
    },
    Family {
        name: "magpie_reloads_total",
        kind: COUNTER,
        labels: &["result"],
        help: "Config reloads, by result (ok, error).",
        read: Read::Global(|g, s| {
            s.value(&["ok"], g.stats.reloads(true) as f64);
            s.value(&["error"], g.stats.reloads(false) as f64);
        }),
    },
    Family {
        name: "magpie_tls_handshakes_total",
        kind: COUNTER,
        labels: &["result", "version"],
        help: "TLS handshakes on listeners that terminate TLS, by result (ok, timeout, no_shared_cipher, bad_certificate, protocol, closed, other) and, when ok, version (1.2, 1.3).",
        read: Read::Global(tls::handshakes),
    },
    Family {
        name: "magpie_tls_certificate_expiry_timestamp_seconds",
        kind: GAUGE,
        labels: &["listener", "cert", "name"],
        help: "When each certificate a listener presents expires (its notAfter, Unix seconds), by listen address, certificate file and first subject name.",
        read: Read::Global(tls::expiry),
    },
    Family {
        name: "magpie_key_fallbacks_total",
        kind: COUNTER,
        labels: &["reason"],
        help: "Connections (mode http: requests) keyed by the fallback because no header or body key was read, by reason.",
        read: Read::Global(|g, s| s.by(|why: FallbackReason| g.stats.fallbacks(why))),
    },
    Family {
        name: "magpie_http2_client_resets_total",
        kind: COUNTER,
        labels: &[],
        help: "HTTP/2 streams the client reset after magpie had dispatched them (before their response was ready).",
        read: Read::Global(|g, s| s.value(&[], g.stats.h2_resets() as f64)),
    },
    Family {
        name: "magpie_http2_reset_goaways_total",
        kind: COUNTER,
        labels: &[],
        help: "HTTP/2 connections sent GOAWAY for resetting more than limits.h2_resets_per_second streams after dispatch within a second.",
        read: Read::Global(|g, s| s.value(&[], g.stats.h2_reset_goaways() as f64)),
    },
    Family {
        name: "magpie_key_buffer_bytes",
        kind: GAUGE,
        labels: &[],
        help: "Request body bytes held now, across all requests, while their keys are read (at most limits.key_buffer_bytes).",
        read: Read::Global(|g, s| s.value(&[], g.stats.key_budget.held() as f64)),
    },
    Family {
        name: "magpie_group_fallbacks_total",
        kind: COUNTER,
        labels: &["reason"],
        help: "key.group: requests without a group, so the table was looked up by their session key, by reason (missing_header, no_head, no_user_message, not_json, too_large, timeout, buffer_budget).",
        read: Read::Global(|g, s| s.by(|why: GroupMiss| g.stats.group_misses(why))),
    },
    Family {
        name: "magpie_requests_routed_total",
        kind: COUNTER,
        labels: &["how"],
        help: "Requests (mode tcp: connections) that reached a backend, by why it was that backend: primary, pinned, group_home, opening, evicted, spilled_at_cap, spilled_down, spilled_engine_full, slow_start, fallback_key.",
        read: Read::Global(|g, s| s.by(|how: How| g.key_memory.routed_total(how))),
    },
    Family {
        name: "magpie_cache_misses_total",
        kind: COUNTER,
        labels: &["cause"],
        help: "Requests whose engine reported fewer cached prompt tokens than the key's previous request had prompt tokens, by cause: spill, backend_down, table_changed, pin_expired, evicted.",
        read: Read::Global(|g, s| s.by(|cause: MissCause| g.key_memory.misses_total(cause))),
    },
    Family {
        name: "magpie_connections_accepted_total",
        kind: COUNTER,
        labels: &[],
        help: "Client connections accepted.",
        read: Read::Global(|g, s| s.value(&[], g.stats.accepted() as f64)),
    },
    Family {
        name: "magpie_connections_rejected_total",
        kind: COUNTER,
        labels: &[],
        help: "Client connections closed at once because max_connections was reached.",
        read: Read::Global(|g, s| s.value(&[], g.stats.rejected() as f64)),
    },
    Family {
        name: "magpie_accept_errors_total",
        kind: COUNTER,
        labels: &[],
        help: "Failed accept calls (e.g. out of file descriptors).",
        read: Read::Global(|g, s| s.value(&[], g.stats.accept_errors() as f64)),
    },
    Family {
        name: "magpie_client_failures_total",
        kind: COUNTER,
        labels: &["reason"],
        help: "Client connections (mode http: requests) that reached no backend, by reason (no_backend, proxy_protocol, head_timeout, bad_request, local_resources).",
        read: Read::Global(|g, s| s.by(|why: ClientFailure| g.stats.client_failures(why))),
    },
    Family {
        name: "magpie_client_quiet_closes_total",
        kind: COUNTER,
        labels: &["reason"],
        help: "Client connections (mode http) magpie closed because they were quiet: nothing within http.first_byte_timeout of the accept (first_byte_timeout), or no next request within http.keepalive_timeout (keepalive_timeout).",
        read: Read::Global(|g, s| s.by(|why: QuietClose| g.stats.quiet_closes(why))),
    },
    Family {
        name: "magpie_session_store_operations_total",
        kind: COUNTER,
        labels: &["result"],
        help: "Round trips to the shared session store (sessions.store: redis), by result (ok, error, timeout, skipped while backing off).",
        read: Read::Global(|g, s| {
            s.by(|result: OpResult| g.store().map_or(0, |st| st.stats.ops(result)))
        }),
    },
    Family {
        name: "magpie_session_store_seconds",
        kind: HISTOGRAM,
        labels: &[],
        help: "Time of session store round trips that answered.",
        read: Read::Global(|g, s| match g.store() {
            Some(store) => s.histogram(&[], &store.stats.latency),
            None => s.histogram(&[], &Histogram::with_bounds(&FAST_BUCKETS)),
        }),
    },
    Family {
        name: "magpie_session_store_fallbacks_total",
        kind: COUNTER,
        labels: &[],
        help: "Requests routed by the table because the session store did not answer within its timeout (or was backing off).",
        read: Read::Global(|g, s| {
            s.value(&[], g.store().map_or(0, |st| st.stats.fallbacks()) as f64)
        }),
    },
    Family {
        name: "magpie_session_store_bad_values_total",
        kind: COUNTER,
        labels: &[],
        help: "Values under a session key in the store that were not a binding (not a string, or over 256 bytes), treated as absent and bound over.",
        read: Read::Global(|g, s| {
            s.value(&[], g.store().map_or(0, |st| st.stats.bad_values()) as f64)
        }),
    },
    Family {
        name: "magpie_fleet_moved_placements_total",
        kind: COUNTER,
        labels: &[],
        help: "Conversations' first requests placed again at another backend because, once placed, another magpie sharing the store had placed work at theirs since their lookup.",
        read: Read::Global(|g, s| {
            s.value(
                &[],
                g.store().map_or(0, |st| st.stats.moved_placements()) as f64,
            )
        }),
    },
    Family {
        name: "magpie_session_bindings_replaced_total",
        kind: COUNTER,
        labels: &[],
        help: "Instance bindings to a backend that was down or gone, replaced by this instance.",
        read: Read::Global(|g, s| {
            s.value(&[], g.store().map_or(0, |st| st.stats.replaced()) as f64)
        }),
    },
    Family {
        name: "magpie_session_store_refreshes_total",
        kind: COUNTER,
        labels: &[],
        help: "Background TTL refreshes of shared bindings sent (at most one per key per ttl/4).",
        read: Read::Global(|g, s| {
            s.value(&[], g.store().map_or(0, |st| st.stats.refreshes()) as f64)
        }),
    },
    Family {
        name: "magpie_session_store_up",
        kind: GAUGE,
        labels: &[],
        help: "1 while a connection to the session store is up, else 0 (also 0 without a store).",
        read: Read::Global(|g, s| {
            let up = g.store().is_some_and(Store::is_connected);
            s.value(&[], f64::from(u8::from(up)));
        }),
    },
    Family {
        name: "magpie_discovery_lookups_total",
        kind: COUNTER,
        labels: &["result"],
        help: "DNS lookups of dns/srv backend entries, by result (ok, empty, error); a failed or empty one keeps the last good answer.",
        read: Read::Global(|g, s| s.by(|result: Lookup| g.discovery.lookups(result))),
    },
    Family {
        name: "magpie_build_info",
        kind: GAUGE,
        labels: &["version"],
        help: "Always 1; the version label is magpie's.",
        read: Read::Global(|_, s| s.value(&[env!("CARGO_PKG_VERSION")], 1.0)),
    },
    Family {
        name: "magpie_admin_metrics_renders_total",
        kind: COUNTER,
        labels: &[],
        help: "Renderings of this exposition, this one included; scrapes that arrive while one runs wait for it and share it, so this grows slower than the scrapes under load.",
        read: Read::Global(|g, s| s.value(&[], g.renders.count() as f64)),
    },
    Family {
        name: "magpie_admin_metrics_render_seconds",
        kind: GAUGE,
        labels: &[],
        help: "Time the previous rendering of this exposition took (gathering and encoding the text, without gzip); 0 before the first.",
        read: Read::Global(|g, s| s.value(&[], g.renders.last().as_secs_f64())),
    },
    Family {
        name: "magpie_task_restarts_total",
        kind: COUNTER,
        labels: &["task"],
        help: "Long-lived tasks (accept, admin, health, engine_load, reload, access_log) that panicked and were started again; any non-zero value is a bug to report.",
        read: Read::Global(|_, s| s.by(supervise::restarts)),
    },
    Family {
        name: "magpie_panics_total",
        kind: COUNTER,
        labels: &[],
        help: "Panics in any task, connections included; any non-zero value is a bug to report.",
        read: Read::Global(|_, s| s.value(&[], supervise::panics() as f64)),
    },
    Family {
        name: "magpie_resource_exhaustion_total",
        kind: COUNTER,
        labels: &["during"],
        help: "Times magpie itself ran out of file descriptors, socket buffers or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), by what it was doing (accept, admin_accept, connect, health_check); never counted against a backend.",
        read: Read::Global(|g, s| s.by(|during: Exhausted| g.stats.exhausted(during))),
    },
    Family {
        name: "magpie_session_pins",
        kind: GAUGE,
        labels: &[],
        help: "Session pins held (sessions on).",
        read: Read::Global(|g, s| s.value(&[], g.sessions.map_or(0, |x| x.pins.len()) as f64)),
    },
    Family {
        name: "magpie_session_pin_lookups_total",
        kind: COUNTER,
        labels: &["result"],
        help: "Session pin lookups, by result (hit, miss).",
        read: Read::Global(|g, s| {
            let pins = g.sessions.map(|x| &x.pins);
            s.value(&["hit"], pins.map_or(0, |p| p.hits()) as f64);
            s.value(&["miss"], pins.map_or(0, |p| p.misses()) as f64);
        }),
    },
    Family {
        name: "magpie_session_pin_evictions_total",
        kind: COUNTER,
        labels: &[],
        help: "Session pins evicted because sessions.max was reached.",
        read: Read::Global(|g, s| {
            s.value(&[], g.sessions.map_or(0, |x| x.pins.evictions()) as f64)
        }),
    },
    Family {
        name: "magpie_access_log_lines_total",
        kind: COUNTER,
        labels: &[],
        help: "Access log lines written (access_log on).",
        read: Read::Global(|g, s| s.value(&[], g.access_log.lines() as f64)),
    },
    Family {
        name: "magpie_access_log_dropped_total",
        kind: COUNTER,
        labels: &[],
        help: "Access log lines dropped because access_log.queue lines were already waiting for the writer (the disk or pipe is slower than traffic).",
        read: Read::Global(|g, s| s.value(&[], g.access_log.dropped() as f64)),
    },
    Family {
        name: "magpie_access_log_write_errors_total",
        kind: COUNTER,
        labels: &[],
        help: "Failed writes (or opens) of the access log; each loses its batch of lines, and the file is opened again for the next.",
        read: Read::Global(|g, s| s.value(&[], g.access_log.write_errors() as f64)),
    },
];
