//! Every family magpie exports, each declared once: its name, type, labels
//! and help, and how its series are read at scrape time.
//!
//! [`FAMILIES`] is the table the exporter walks; the README's metrics
//! reference lists the same families, and tests check that each one is
//! rendered and documented. A backend family is read once per backend (its
//! `backend` and `addr` labels are filled in for it); a global family once
//! per scrape.

use prometheus::proto::MetricType;

use super::peak_ratio;
use super::series::{Family, Read};
use super::tls;
use crate::backend::groups::Rank;
use crate::backend::{CodeClass, Side, Spill, TimeoutKind};
use crate::discovery::Lookup;
use crate::health::{CheckOutcome, ConnectFailure, ScrapeResult};
use crate::key::FallbackReason;
use crate::key::group::GroupMiss;
use crate::recent::{How, MissCause};
use crate::sessions::store::{OpResult, Store};
use crate::stats::{ClientFailure, Exhausted, FAST_BUCKETS, Histogram};
use crate::supervise;

use MetricType::{COUNTER, GAUGE, HISTOGRAM};

/// Every exported family. README lists the same.
pub const FAMILIES: &[Family] = &[
    Family {
        name: "magpie_backend_active_connections",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "Open connections (and connects in progress) to the backend; in mode http, its pooled and busy upstream connections.",
        read: Read::Backend(|b, s| {
            let load = &b.live().load;
            let open = if b.requests {
                load.upstream_connections()
            } else {
                load.active()
            };
            s.value(&[], open as f64);
        }),
    },
    Family {
        name: "magpie_backend_connections_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Connections established to the backend.",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.connections() as f64)),
    },
    Family {
        name: "magpie_backend_connect_failures_total",
        kind: COUNTER,
        labels: &["backend", "addr", "reason"],
        help: "Failed connects to the backend on the data path, by reason (refused, timeout, error).",
        read: Read::Backend(|b, s| {
            s.by(|why: ConnectFailure| b.live().health.connect_failures(why))
        }),
    },
    Family {
        name: "magpie_backend_resets_total",
        kind: COUNTER,
        labels: &["backend", "addr", "by"],
        help: "Connections through the backend aborted (reset) by one side, by which (client, backend); magpie passes the reset on to the other side.",
        read: Read::Backend(|b, s| s.by(|by: Side| b.live().traffic.resets(by))),
    },
    Family {
        name: "magpie_backend_prompt_tokens_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Prompt tokens of the backend's answers, as its engine reported them in usage (mode http).",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.prompt_tokens() as f64)),
    },
    Family {
        name: "magpie_backend_cached_prompt_tokens_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Prompt tokens the backend's engine served from its prefix cache (usage cached_tokens, or cache_read_input_tokens).",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.cached_prompt_tokens() as f64)),
    },
    Family {
        name: "magpie_backend_completion_tokens_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Completion (output) tokens of the backend's answers, as its engine reported them in usage.",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.completion_tokens() as f64)),
    },
    Family {
        name: "magpie_backend_received_bytes_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Bytes received from the backend (and sent on to clients).",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.bytes_received() as f64)),
    },
    Family {
        name: "magpie_backend_sent_bytes_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Bytes sent to the backend (received from clients).",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.bytes_sent() as f64)),
    },
    Family {
        name: "magpie_backend_spills_total",
        kind: COUNTER,
        labels: &["backend", "addr", "reason"],
        help: "Connections (mode http: requests) whose key this backend was a candidate for but which went elsewhere, by reason: down (health), at_cap (bounded load) or engine_full (health.load).",
        read: Read::Backend(|b, s| s.by(|why: Spill| b.live().traffic.spills(why))),
    },
    Family {
        name: "magpie_group_placements_total",
        kind: COUNTER,
        labels: &["backend", "addr", "rank"],
        help: "key.group: conversations first placed on the backend by their group, by the backend's rank among the group's candidates (1, 2, 3, 4+); a hot group's new conversations reach rank 2, then 3.",
        read: Read::Backend(|b, s| s.by(|rank: Rank| b.live().groups.placements(rank))),
    },
    Family {
        name: "magpie_backend_groups_seen",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "key.group: distinct groups whose requests the backend served in the last 2.5 to 5 minutes (two rotating sets of at most 10000 group hashes): how many heads its cache must hold.",
        read: Read::Backend(|b, s| s.value(&[], b.live().groups.seen() as f64)),
    },
    Family {
        name: "magpie_backend_idle_closes_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Connections (mode tcp) closed because neither side sent anything for idle_timeout.",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.idle_closes() as f64)),
    },
    Family {
        name: "magpie_backend_connect_seconds",
        kind: HISTOGRAM,
        labels: &["backend", "addr"],
        help: "Time to open a data-path connection to the backend (mode http: fresh connections only).",
        read: Read::Backend(|b, s| s.histogram(&[], &b.live().traffic.connect_time)),
    },
    Family {
        name: "magpie_backend_connection_duration_seconds",
        kind: HISTOGRAM,
        labels: &["backend", "addr"],
        help: "Lifetime of proxied connections (mode tcp), from connected to closed.",
        read: Read::Backend(|b, s| s.histogram(&[], &b.live().traffic.connection_duration)),
    },
    Family {
        name: "magpie_backend_requests_total",
        kind: COUNTER,
        labels: &["backend", "addr", "code_class"],
        help: "mode http: requests the backend answered, by status class (1xx to 5xx), or `error` when it failed after the request was sent.",
        read: Read::Backend(|b, s| s.by(|class: CodeClass| b.live().traffic.requests(class))),
    },
    Family {
        name: "magpie_backend_requests_in_flight",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "mode http: requests sent to the backend whose response has not ended (what bounded load counts in mode http).",
        read: Read::Backend(|b, s| {
            let in_flight = if b.requests {
                b.live().load.active()
            } else {
                0
            };
            s.value(&[], in_flight as f64);
        }),
    },
    Family {
        name: "magpie_backend_requests_awaiting_first_byte",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "mode http: requests sent to the backend whose response has brought no byte of body yet (an engine's queued and prefilling requests); key.group_choices places a new group by it.",
        read: Read::Backend(|b, s| s.value(&[], b.live().load.awaiting() as f64)),
    },
    Family {
        name: "magpie_backend_client_aborts_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "mode http: responses the client went away from before their end.",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.client_aborts() as f64)),
    },
    Family {
        name: "magpie_backend_timeouts_total",
        kind: COUNTER,
        labels: &["backend", "addr", "kind"],
        help: "mode http: requests whose backend missed a deadline, by kind: response (no response head within http.response_timeout of the request's last byte; the client got 504) or stream_idle (no body byte for http.stream_idle_timeout; the client's stream was cut with a reset).",
        read: Read::Backend(|b, s| s.by(|kind: TimeoutKind| b.live().traffic.timeouts(kind))),
    },
    Family {
        name: "magpie_backend_time_to_first_byte_seconds",
        kind: HISTOGRAM,
        labels: &["backend", "addr"],
        help: "mode http: from sending a request to the backend to its response head.",
        read: Read::Backend(|b, s| s.histogram(&[], &b.live().traffic.time_to_first_byte)),
    },
    Family {
        name: "magpie_backend_request_duration_seconds",
        kind: HISTOGRAM,
        labels: &["backend", "addr"],
        help: "mode http: from sending a request to the last byte of its response (or the client leaving).",
        read: Read::Backend(|b, s| s.histogram(&[], &b.live().traffic.request_duration)),
    },
    Family {
        name: "magpie_backend_health_checks_total",
        kind: COUNTER,
        labels: &["backend", "addr", "result"],
        help: "Active health checks, by result (ok, failed, timeout, bad_status).",
        read: Read::Backend(|b, s| s.by(|outcome: CheckOutcome| b.live().health.checks(outcome))),
    },
    Family {
        name: "magpie_backend_transitions_total",
        kind: COUNTER,
        labels: &["backend", "addr", "to"],
        help: "Times the backend was marked up or down (by checks or passive health).",
        read: Read::Backend(|b, s| {
            let (up, down) = b.live().health.transitions();
            s.value(&["up"], up as f64);
            s.value(&["down"], down as f64);
        }),
    },
    Family {
        name: "magpie_backend_up",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "1 if the backend is up (health), 0 if down.",
        read: Read::Backend(|b, s| {
            if b.share.is_some() {
                s.value(&[], f64::from(u8::from(b.live().health.is_up())));
            }
        }),
    },
    Family {
        name: "magpie_backend_engine_waiting",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "Requests waiting in the backend's inference engine, as last scraped (health.load); absent without a value at most max_age old.",
        read: Read::Backend(|b, s| {
            if let Some(waiting) = b.engine().and_then(|e| e.waiting) {
                s.value(&[], waiting);
            }
        }),
    },
    Family {
        name: "magpie_backend_engine_running",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "Requests running in the backend's inference engine, as last scraped (health.load); absent without a value at most max_age old.",
        read: Read::Backend(|b, s| {
            if let Some(running) = b.engine().and_then(|e| e.running) {
                s.value(&[], running);
            }
        }),
    },
    Family {
        name: "magpie_backend_engine_kv_usage",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "The used fraction (0 to 1) of the backend's KV cache, as last scraped (health.load); absent without a value at most max_age old.",
        read: Read::Backend(|b, s| {
            if let Some(kv_usage) = b.engine().and_then(|e| e.kv_usage) {
                s.value(&[], kv_usage);
            }
        }),
    },
    Family {
        name: "magpie_engine_load_scrapes_total",
        kind: COUNTER,
        labels: &["backend", "addr", "result"],
        help: "Scrapes of the backend's engine metrics (health.load), by result (ok, timeout, connect, status, parse, too_large); a failed one keeps the last value until max_age.",
        read: Read::Backend(|b, s| s.by(|result: ScrapeResult| b.live().engine.scrapes(result))),
    },
    Family {
        name: "magpie_backend_weight",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "The backend's configured weight.",
        read: Read::Backend(|b, s| {
            if b.share.is_some() {
                s.value(&[], f64::from(b.backend.weight));
            }
        }),
    },
    Family {
        name: "magpie_backend_table_share_ratio",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "The backend's share of table slots (Maglev) or hash space (ring), 0 to 1.",
        read: Read::Backend(|b, s| {
            if let Some(share) = b.share {
                s.value(&[], share);
            }
        }),
    },
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
        help: "key.group: requests without a group, so the table was looked up by their session key, by reason (missing_header, no_head, not_json, too_large, timeout, buffer_budget).",
        read: Read::Global(|g, s| s.by(|why: GroupMiss| g.stats.group_misses(why))),
    },
    Family {
        name: "magpie_requests_routed_total",
        kind: COUNTER,
        labels: &["how"],
        help: "Requests (mode tcp: connections) that reached a backend, by why it was that backend: primary, pinned, spilled_at_cap, spilled_down, spilled_engine_full, fallback_key.",
        read: Read::Global(|g, s| s.by(|how: How| g.recent.routed_total(how))),
    },
    Family {
        name: "magpie_cache_misses_total",
        kind: COUNTER,
        labels: &["cause"],
        help: "Requests whose engine reported fewer cached prompt tokens than the key's previous request had prompt tokens, by cause: spill, backend_down, table_changed, pin_expired, evicted.",
        read: Read::Global(|g, s| s.by(|cause: MissCause| g.recent.misses_total(cause))),
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
        name: "magpie_session_bindings_replaced_total",
        kind: COUNTER,
        labels: &[],
        help: "Shared bindings to a backend that was down or gone, replaced by this instance.",
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
