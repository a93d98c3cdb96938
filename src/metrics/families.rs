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
use super::series::{BackendView, Scrape, Series};
use crate::backend::{CodeClass, Side, Spill};
use crate::discovery::Lookup;
use crate::health::{CheckOutcome, ConnectFailure};
use crate::key::FallbackReason;
use crate::sessions::store::{OpResult, Store};
use crate::stats::{ClientFailure, Exhausted, FAST_BUCKETS, Histogram};
use crate::supervise;

use MetricType::{COUNTER, GAUGE, HISTOGRAM};

/// How a family's series are read.
#[derive(Clone, Copy)]
pub enum Read {
    /// Once per scrape.
    Global(fn(&Scrape<'_>, &mut Series<'_>)),
    /// Once per backend, in the table or draining; `backend` and `addr`
    /// come first among its labels.
    Backend(fn(&BackendView<'_>, &mut Series<'_>)),
}

/// One exported family.
pub struct Family {
    pub name: &'static str,
    pub kind: MetricType,
    /// Every label name, in order.
    pub labels: &'static [&'static str],
    pub help: &'static str,
    pub read: Read,
}

impl Family {
    const fn global(
        name: &'static str,
        kind: MetricType,
        labels: &'static [&'static str],
        help: &'static str,
        read: fn(&Scrape<'_>, &mut Series<'_>),
    ) -> Family {
        Family {
            name,
            kind,
            labels,
            help,
            read: Read::Global(read),
        }
    }

    const fn backend(
        name: &'static str,
        kind: MetricType,
        labels: &'static [&'static str],
        help: &'static str,
        read: fn(&BackendView<'_>, &mut Series<'_>),
    ) -> Family {
        Family {
            name,
            kind,
            labels,
            help,
            read: Read::Backend(read),
        }
    }
}

/// Every exported family. README lists the same.
pub const FAMILIES: &[Family] = &[
    Family::backend(
        "magpie_backend_active_connections",
        GAUGE,
        &["backend", "addr"],
        "Open connections (and connects in progress) to the backend; in mode http, its pooled and busy upstream connections.",
        |b, s| {
            let load = &b.live().load;
            let open = if b.requests {
                load.upstream_connections()
            } else {
                load.active()
            };
            s.value(&[], open as f64);
        },
    ),
    Family::backend(
        "magpie_backend_connections_total",
        COUNTER,
        &["backend", "addr"],
        "Connections established to the backend.",
        |b, s| s.value(&[], b.live().traffic.connections() as f64),
    ),
    Family::backend(
        "magpie_backend_connect_failures_total",
        COUNTER,
        &["backend", "addr", "reason"],
        "Failed connects to the backend on the data path, by reason (refused, timeout, error).",
        |b, s| s.by(|why: ConnectFailure| b.live().health.connect_failures(why)),
    ),
    Family::backend(
        "magpie_backend_resets_total",
        COUNTER,
        &["backend", "addr", "by"],
        "Connections through the backend aborted (reset) by one side, by which (client, backend); magpie passes the reset on to the other side.",
        |b, s| s.by(|by: Side| b.live().traffic.resets(by)),
    ),
    Family::backend(
        "magpie_backend_received_bytes_total",
        COUNTER,
        &["backend", "addr"],
        "Bytes received from the backend (and sent on to clients).",
        |b, s| s.value(&[], b.live().traffic.bytes_received() as f64),
    ),
    Family::backend(
        "magpie_backend_sent_bytes_total",
        COUNTER,
        &["backend", "addr"],
        "Bytes sent to the backend (received from clients).",
        |b, s| s.value(&[], b.live().traffic.bytes_sent() as f64),
    ),
    Family::backend(
        "magpie_backend_spills_total",
        COUNTER,
        &["backend", "addr", "reason"],
        "Connections (mode http: requests) whose key this backend was a candidate for but which went elsewhere, by reason: down (health) or at_cap (bounded load).",
        |b, s| s.by(|why: Spill| b.live().traffic.spills(why)),
    ),
    Family::backend(
        "magpie_backend_idle_closes_total",
        COUNTER,
        &["backend", "addr"],
        "Connections (mode tcp) closed because neither side sent anything for idle_timeout.",
        |b, s| s.value(&[], b.live().traffic.idle_closes() as f64),
    ),
    Family::backend(
        "magpie_backend_connect_seconds",
        HISTOGRAM,
        &["backend", "addr"],
        "Time to open a data-path connection to the backend (mode http: fresh connections only).",
        |b, s| s.histogram(&[], &b.live().traffic.connect_time),
    ),
    Family::backend(
        "magpie_backend_connection_duration_seconds",
        HISTOGRAM,
        &["backend", "addr"],
        "Lifetime of proxied connections (mode tcp), from connected to closed.",
        |b, s| s.histogram(&[], &b.live().traffic.connection_duration),
    ),
    Family::backend(
        "magpie_backend_requests_total",
        COUNTER,
        &["backend", "addr", "code_class"],
        "mode http: requests the backend answered, by status class (1xx to 5xx), or `error` when it failed after the request was sent.",
        |b, s| s.by(|class: CodeClass| b.live().traffic.requests(class)),
    ),
    Family::backend(
        "magpie_backend_requests_in_flight",
        GAUGE,
        &["backend", "addr"],
        "mode http: requests sent to the backend whose response has not ended (what bounded load counts in mode http).",
        |b, s| {
            let in_flight = if b.requests {
                b.live().load.active()
            } else {
                0
            };
            s.value(&[], in_flight as f64);
        },
    ),
    Family::backend(
        "magpie_backend_client_aborts_total",
        COUNTER,
        &["backend", "addr"],
        "mode http: responses the client went away from before their end.",
        |b, s| s.value(&[], b.live().traffic.client_aborts() as f64),
    ),
    Family::backend(
        "magpie_backend_time_to_first_byte_seconds",
        HISTOGRAM,
        &["backend", "addr"],
        "mode http: from sending a request to the backend to its response head.",
        |b, s| s.histogram(&[], &b.live().traffic.time_to_first_byte),
    ),
    Family::backend(
        "magpie_backend_request_duration_seconds",
        HISTOGRAM,
        &["backend", "addr"],
        "mode http: from sending a request to the last byte of its response (or the client leaving).",
        |b, s| s.histogram(&[], &b.live().traffic.request_duration),
    ),
    Family::backend(
        "magpie_backend_health_checks_total",
        COUNTER,
        &["backend", "addr", "result"],
        "Active health checks, by result (ok, failed, timeout, bad_status).",
        |b, s| s.by(|outcome: CheckOutcome| b.live().health.checks(outcome)),
    ),
    Family::backend(
        "magpie_backend_transitions_total",
        COUNTER,
        &["backend", "addr", "to"],
        "Times the backend was marked up or down (by checks or passive health).",
        |b, s| {
            let (up, down) = b.live().health.transitions();
            s.value(&["up"], up as f64);
            s.value(&["down"], down as f64);
        },
    ),
    Family::backend(
        "magpie_backend_up",
        GAUGE,
        &["backend", "addr"],
        "1 if the backend is up (health), 0 if down.",
        |b, s| {
            if b.share.is_some() {
                s.value(&[], f64::from(u8::from(b.live().health.is_up())));
            }
        },
    ),
    Family::backend(
        "magpie_backend_weight",
        GAUGE,
        &["backend", "addr"],
        "The backend's configured weight.",
        |b, s| {
            if b.share.is_some() {
                s.value(&[], f64::from(b.backend.weight));
            }
        },
    ),
    Family::backend(
        "magpie_backend_table_share_ratio",
        GAUGE,
        &["backend", "addr"],
        "The backend's share of table slots (Maglev) or hash space (ring), 0 to 1.",
        |b, s| {
            if let Some(share) = b.share {
                s.value(&[], share);
            }
        },
    ),
    Family::global(
        "magpie_table_version",
        GAUGE,
        &[],
        "Version of the published table; 1 at start, plus one per applied reload.",
        |g, s| s.value(&[], g.snapshot.version as f64),
    ),
    Family::global(
        "magpie_table_info",
        GAUGE,
        &["algorithm", "fingerprint"],
        "Always 1; labels carry the algorithm and the table fingerprint.",
        |g, s| {
            let algorithm = g.snapshot.table.algorithm().as_str();
            s.value(&[algorithm, &g.snapshot.fingerprint], 1.0);
        },
    ),
    Family::global(
        "magpie_table_build_seconds",
        GAUGE,
        &[],
        "Seconds taken to build the published table.",
        |g, s| s.value(&[], g.snapshot.build_time.as_secs_f64()),
    ),
    Family::global(
        "magpie_load_peak_ratio",
        GAUGE,
        &[],
        "The busiest backend's active connections over its weighted fair share of all active connections (1 = even; 0 when idle).",
        |g, s| {
            let snapshot = g.snapshot;
            s.value(&[], peak_ratio(&snapshot.backends, snapshot.total_weight));
        },
    ),
    Family::global(
        "magpie_reloads_total",
        COUNTER,
        &["result"],
        "Config reloads, by result (ok, error).",
        |g, s| {
            s.value(&["ok"], g.stats.reloads(true) as f64);
            s.value(&["error"], g.stats.reloads(false) as f64);
        },
    ),
    Family::global(
        "magpie_key_fallbacks_total",
        COUNTER,
        &["reason"],
        "Connections (mode http: requests) keyed by the fallback because no header or body key was read, by reason.",
        |g, s| s.by(|why: FallbackReason| g.stats.fallbacks(why)),
    ),
    Family::global(
        "magpie_connections_accepted_total",
        COUNTER,
        &[],
        "Client connections accepted.",
        |g, s| s.value(&[], g.stats.accepted() as f64),
    ),
    Family::global(
        "magpie_connections_rejected_total",
        COUNTER,
        &[],
        "Client connections closed at once because max_connections was reached.",
        |g, s| s.value(&[], g.stats.rejected() as f64),
    ),
    Family::global(
        "magpie_accept_errors_total",
        COUNTER,
        &[],
        "Failed accept calls (e.g. out of file descriptors).",
        |g, s| s.value(&[], g.stats.accept_errors() as f64),
    ),
    Family::global(
        "magpie_client_failures_total",
        COUNTER,
        &["reason"],
        "Client connections (mode http: requests) that reached no backend, by reason (no_backend, proxy_protocol, head_timeout, bad_request, local_resources).",
        |g, s| s.by(|why: ClientFailure| g.stats.client_failures(why)),
    ),
    Family::global(
        "magpie_session_store_operations_total",
        COUNTER,
        &["result"],
        "Round trips to the shared session store (sessions.store: redis), by result (ok, error, timeout, skipped while backing off).",
        |g, s| s.by(|result: OpResult| g.store().map_or(0, |st| st.stats.ops(result))),
    ),
    Family::global(
        "magpie_session_store_seconds",
        HISTOGRAM,
        &[],
        "Time of session store round trips that answered.",
        |g, s| match g.store() {
            Some(store) => s.histogram(&[], &store.stats.latency),
            None => s.histogram(&[], &Histogram::with_bounds(&FAST_BUCKETS)),
        },
    ),
    Family::global(
        "magpie_session_store_fallbacks_total",
        COUNTER,
        &[],
        "Requests routed by the table because the session store did not answer within its timeout (or was backing off).",
        |g, s| s.value(&[], g.store().map_or(0, |st| st.stats.fallbacks()) as f64),
    ),
    Family::global(
        "magpie_session_bindings_replaced_total",
        COUNTER,
        &[],
        "Shared bindings to a backend that was down or gone, replaced by this instance.",
        |g, s| s.value(&[], g.store().map_or(0, |st| st.stats.replaced()) as f64),
    ),
    Family::global(
        "magpie_session_store_refreshes_total",
        COUNTER,
        &[],
        "Background TTL refreshes of shared bindings sent (at most one per key per ttl/4).",
        |g, s| s.value(&[], g.store().map_or(0, |st| st.stats.refreshes()) as f64),
    ),
    Family::global(
        "magpie_session_store_up",
        GAUGE,
        &[],
        "1 while a connection to the session store is up, else 0 (also 0 without a store).",
        |g, s| {
            let up = g.store().is_some_and(Store::is_connected);
            s.value(&[], f64::from(u8::from(up)));
        },
    ),
    Family::global(
        "magpie_discovery_lookups_total",
        COUNTER,
        &["result"],
        "DNS lookups of dns/srv backend entries, by result (ok, empty, error); a failed or empty one keeps the last good answer.",
        |g, s| s.by(|result: Lookup| g.discovery.lookups(result)),
    ),
    Family::global(
        "magpie_build_info",
        GAUGE,
        &["version"],
        "Always 1; the version label is magpie's.",
        |_, s| s.value(&[env!("CARGO_PKG_VERSION")], 1.0),
    ),
    Family::global(
        "magpie_task_restarts_total",
        COUNTER,
        &["task"],
        "Long-lived tasks (accept, admin, health, reload) that panicked and were started again; any non-zero value is a bug to report.",
        |_, s| s.by(supervise::restarts),
    ),
    Family::global(
        "magpie_panics_total",
        COUNTER,
        &[],
        "Panics in any task, connections included; any non-zero value is a bug to report.",
        |_, s| s.value(&[], supervise::panics() as f64),
    ),
    Family::global(
        "magpie_resource_exhaustion_total",
        COUNTER,
        &["during"],
        "Times magpie itself ran out of file descriptors, socket buffers or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), by what it was doing (accept, admin_accept, connect, health_check); never counted against a backend.",
        |g, s| s.by(|during: Exhausted| g.stats.exhausted(during)),
    ),
    Family::global(
        "magpie_session_pins",
        GAUGE,
        &[],
        "Session pins held (sessions on).",
        |g, s| s.value(&[], g.sessions.map_or(0, |x| x.pins.len()) as f64),
    ),
    Family::global(
        "magpie_session_pin_lookups_total",
        COUNTER,
        &["result"],
        "Session pin lookups, by result (hit, miss).",
        |g, s| {
            let pins = g.sessions.map(|x| &x.pins);
            s.value(&["hit"], pins.map_or(0, |p| p.hits()) as f64);
            s.value(&["miss"], pins.map_or(0, |p| p.misses()) as f64);
        },
    ),
    Family::global(
        "magpie_session_pin_evictions_total",
        COUNTER,
        &[],
        "Session pins evicted because sessions.max was reached.",
        |g, s| s.value(&[], g.sessions.map_or(0, |x| x.pins.evictions()) as f64),
    ),
];
