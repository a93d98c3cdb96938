//! Every family magpie exports, and a builder that fills them at scrape time.
//!
//! [`FAMILIES`] is the one list of names, types, labels and help texts; the
//! README's metrics reference lists the same, and a test checks that every
//! family is rendered.

use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};

use crate::backend::{Backend, CodeClass, Side, Spill};
use crate::health::{CheckOutcome, ConnectFailure};
use crate::sessions::store::{OpResult, Store};
use crate::stats;

use MetricType::{COUNTER, GAUGE, HISTOGRAM};

/// Every exported family: name, type, labels, help. README lists the same.
pub const FAMILIES: &[(&str, MetricType, &[&str], &str)] = &[
    (
        "magpie_backend_active_connections",
        GAUGE,
        &["backend", "addr"],
        "Open connections (and connects in progress) to the backend; in mode http, its pooled and busy upstream connections.",
    ),
    (
        "magpie_backend_connections_total",
        COUNTER,
        &["backend", "addr"],
        "Connections established to the backend.",
    ),
    (
        "magpie_backend_connect_failures_total",
        COUNTER,
        &["backend", "addr", "reason"],
        "Failed connects to the backend on the data path, by reason (refused, timeout, error).",
    ),
    (
        "magpie_backend_resets_total",
        COUNTER,
        &["backend", "addr", "by"],
        "Connections through the backend aborted (reset) by one side, by which (client, backend); magpie passes the reset on to the other side.",
    ),
    (
        "magpie_backend_received_bytes_total",
        COUNTER,
        &["backend", "addr"],
        "Bytes received from the backend (and sent on to clients).",
    ),
    (
        "magpie_backend_sent_bytes_total",
        COUNTER,
        &["backend", "addr"],
        "Bytes sent to the backend (received from clients).",
    ),
    (
        "magpie_backend_spills_total",
        COUNTER,
        &["backend", "addr", "reason"],
        "Connections (mode http: requests) whose key this backend was a candidate for but which went elsewhere, by reason: down (health) or at_cap (bounded load).",
    ),
    (
        "magpie_backend_idle_closes_total",
        COUNTER,
        &["backend", "addr"],
        "Connections (mode tcp) closed because neither side sent anything for idle_timeout.",
    ),
    (
        "magpie_backend_connect_seconds",
        HISTOGRAM,
        &["backend", "addr"],
        "Time to open a data-path connection to the backend (mode http: fresh connections only).",
    ),
    (
        "magpie_backend_connection_duration_seconds",
        HISTOGRAM,
        &["backend", "addr"],
        "Lifetime of proxied connections (mode tcp), from connected to closed.",
    ),
    (
        "magpie_backend_requests_total",
        COUNTER,
        &["backend", "addr", "code_class"],
        "mode http: requests the backend answered, by status class (1xx to 5xx), or `error` when it failed after the request was sent.",
    ),
    (
        "magpie_backend_requests_in_flight",
        GAUGE,
        &["backend", "addr"],
        "mode http: requests sent to the backend whose response has not ended (what bounded load counts in mode http).",
    ),
    (
        "magpie_backend_client_aborts_total",
        COUNTER,
        &["backend", "addr"],
        "mode http: responses the client went away from before their end.",
    ),
    (
        "magpie_backend_time_to_first_byte_seconds",
        HISTOGRAM,
        &["backend", "addr"],
        "mode http: from sending a request to the backend to its response head.",
    ),
    (
        "magpie_backend_request_duration_seconds",
        HISTOGRAM,
        &["backend", "addr"],
        "mode http: from sending a request to the last byte of its response (or the client leaving).",
    ),
    (
        "magpie_backend_health_checks_total",
        COUNTER,
        &["backend", "addr", "result"],
        "Active health checks, by result (ok, failed, timeout, bad_status).",
    ),
    (
        "magpie_backend_transitions_total",
        COUNTER,
        &["backend", "addr", "to"],
        "Times the backend was marked up or down (by checks or passive health).",
    ),
    (
        "magpie_backend_up",
        GAUGE,
        &["backend", "addr"],
        "1 if the backend is up (health), 0 if down.",
    ),
    (
        "magpie_backend_weight",
        GAUGE,
        &["backend", "addr"],
        "The backend's configured weight.",
    ),
    (
        "magpie_backend_table_share_ratio",
        GAUGE,
        &["backend", "addr"],
        "The backend's share of table slots (Maglev) or hash space (ring), 0 to 1.",
    ),
    (
        "magpie_table_version",
        GAUGE,
        &[],
        "Version of the published table; 1 at start, plus one per applied reload.",
    ),
    (
        "magpie_table_info",
        GAUGE,
        &["algorithm", "fingerprint"],
        "Always 1; labels carry the algorithm and the table fingerprint.",
    ),
    (
        "magpie_table_build_seconds",
        GAUGE,
        &[],
        "Seconds taken to build the published table.",
    ),
    (
        "magpie_load_peak_ratio",
        GAUGE,
        &[],
        "The busiest backend's active connections over its weighted fair share of all active connections (1 = even; 0 when idle).",
    ),
    (
        "magpie_reloads_total",
        COUNTER,
        &["result"],
        "Config reloads, by result (ok, error).",
    ),
    (
        "magpie_key_fallbacks_total",
        COUNTER,
        &["reason"],
        "Connections (mode http: requests) keyed by the fallback because no header or body key was read, by reason.",
    ),
    (
        "magpie_connections_accepted_total",
        COUNTER,
        &[],
        "Client connections accepted.",
    ),
    (
        "magpie_connections_rejected_total",
        COUNTER,
        &[],
        "Client connections closed at once because max_connections was reached.",
    ),
    (
        "magpie_accept_errors_total",
        COUNTER,
        &[],
        "Failed accept calls (e.g. out of file descriptors).",
    ),
    (
        "magpie_client_failures_total",
        COUNTER,
        &["reason"],
        "Client connections (mode http: requests) that reached no backend, by reason (no_backend, proxy_protocol, head_timeout, bad_request, local_resources).",
    ),
    (
        "magpie_session_store_operations_total",
        COUNTER,
        &["result"],
        "Round trips to the shared session store (sessions.store: redis), by result (ok, error, timeout, skipped while backing off).",
    ),
    (
        "magpie_session_store_seconds",
        HISTOGRAM,
        &[],
        "Time of session store round trips that answered.",
    ),
    (
        "magpie_session_store_fallbacks_total",
        COUNTER,
        &[],
        "Requests routed by the table because the session store did not answer within its timeout (or was backing off).",
    ),
    (
        "magpie_session_bindings_replaced_total",
        COUNTER,
        &[],
        "Shared bindings to a backend that was down or gone, replaced by this instance.",
    ),
    (
        "magpie_session_store_refreshes_total",
        COUNTER,
        &[],
        "Background TTL refreshes of shared bindings sent (at most one per key per ttl/4).",
    ),
    (
        "magpie_session_store_up",
        GAUGE,
        &[],
        "1 while a connection to the session store is up, else 0 (also 0 without a store).",
    ),
    (
        "magpie_discovery_lookups_total",
        COUNTER,
        &["result"],
        "DNS lookups of dns/srv backend entries, by result (ok, empty, error); a failed or empty one keeps the last good answer.",
    ),
    (
        "magpie_build_info",
        GAUGE,
        &["version"],
        "Always 1; the version label is magpie's.",
    ),
    (
        "magpie_task_restarts_total",
        COUNTER,
        &["task"],
        "Long-lived tasks (accept, admin, health, reload) that panicked and were started again; any non-zero value is a bug to report.",
    ),
    (
        "magpie_panics_total",
        COUNTER,
        &[],
        "Panics in any task, connections included; any non-zero value is a bug to report.",
    ),
    (
        "magpie_resource_exhaustion_total",
        COUNTER,
        &["during"],
        "Times magpie itself ran out of file descriptors, socket buffers or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), by what it was doing (accept, admin_accept, connect, health_check); never counted against a backend.",
    ),
    (
        "magpie_session_pins",
        GAUGE,
        &[],
        "Session pins held (sessions on).",
    ),
    (
        "magpie_session_pin_lookups_total",
        COUNTER,
        &["result"],
        "Session pin lookups, by result (hit, miss).",
    ),
    (
        "magpie_session_pin_evictions_total",
        COUNTER,
        &[],
        "Session pins evicted because sessions.max was reached.",
    ),
];

/// Builds the families in [`FAMILIES`] order.
pub(super) struct Families(pub(super) Vec<MetricFamily>);

impl Families {
    pub(super) fn new() -> Self {
        Families(
            FAMILIES
                .iter()
                .map(|(name, kind, _, help)| {
                    let mut f = MetricFamily::default();
                    f.set_name(name.to_string());
                    f.set_help(help.to_string());
                    f.set_field_type(*kind);
                    f
                })
                .collect(),
        )
    }

    /// The family `name`, and a metric with `labels` for it.
    fn metric(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
    ) -> Option<(&mut MetricFamily, Metric)> {
        let Some(family) = self.0.iter_mut().find(|f| f.name() == name) else {
            debug_assert!(false, "unknown metric family {name}");
            return None;
        };
        let mut m = Metric::default();
        m.set_label(
            labels
                .iter()
                .map(|(k, v)| {
                    let mut l = LabelPair::default();
                    l.set_name(k.to_string());
                    l.set_value(v.to_string());
                    l
                })
                .collect(),
        );
        Some((family, m))
    }

    /// A histogram series from one of magpie's latency histograms.
    /// The shared session store's families (zeros without one).
    pub(super) fn add_session_store(&mut self, store: Option<&Store>) {
        for result in OpResult::ALL {
            self.add(
                "magpie_session_store_operations_total",
                &[("result", result.as_str())],
                store.map_or(0, |s| s.stats.ops(result)) as f64,
            );
        }
        let none = stats::Histogram::with_bounds(&stats::FAST_BUCKETS);
        let latency = store.map_or(&none, |s| &s.stats.latency);
        self.add_histogram("magpie_session_store_seconds", &[], latency);
        let counters = [
            (
                "magpie_session_store_fallbacks_total",
                store.map_or(0, |s| s.stats.fallbacks()),
            ),
            (
                "magpie_session_bindings_replaced_total",
                store.map_or(0, |s| s.stats.replaced()),
            ),
            (
                "magpie_session_store_refreshes_total",
                store.map_or(0, |s| s.stats.refreshes()),
            ),
        ];
        for (name, value) in counters {
            self.add(name, &[], value as f64);
        }
        self.add(
            "magpie_session_store_up",
            &[],
            f64::from(u8::from(store.is_some_and(Store::is_connected))),
        );
    }

    fn add_histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &stats::Histogram) {
        let Some((family, mut m)) = self.metric(name, labels) else {
            return;
        };
        let mut out = Histogram::default();
        out.set_sample_count(h.count());
        out.set_sample_sum(h.sum_seconds());
        out.set_bucket(
            h.bounds()
                .iter()
                .zip(h.cumulative())
                .map(|(&bound, count)| {
                    let mut b = Bucket::default();
                    b.set_upper_bound(bound);
                    b.set_cumulative_count(count);
                    b
                })
                .collect(),
        );
        m.set_histogram(out);
        family.mut_metric().push(m);
    }

    pub(super) fn add(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let Some((family, mut m)) = self.metric(name, labels) else {
            return;
        };
        if family.get_field_type() == COUNTER {
            let mut c = Counter::default();
            c.set_value(value);
            m.set_counter(c);
        } else {
            let mut g = Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
        family.mut_metric().push(m);
    }

    /// A backend's series. Only a backend in the current table (`share` is
    /// set) has up, weight and share; a draining one keeps its counters. In
    /// mode http (`requests`), `active` counts requests in flight.
    pub(super) fn add_backend(&mut self, b: &Backend, share: Option<f64>, requests: bool) {
        let addr = b.addr.to_string();
        let l = [("backend", b.name.as_str()), ("addr", addr.as_str())];
        let live = &b.live;
        let (connections, in_flight) = if requests {
            (live.load.upstream_connections(), live.load.active())
        } else {
            (live.load.active(), 0)
        };
        self.add("magpie_backend_active_connections", &l, connections as f64);
        self.add("magpie_backend_requests_in_flight", &l, in_flight as f64);
        for class in CodeClass::ALL {
            let l = [l[0], l[1], ("code_class", class.as_str())];
            self.add(
                "magpie_backend_requests_total",
                &l,
                live.traffic.requests(class) as f64,
            );
        }
        self.add(
            "magpie_backend_client_aborts_total",
            &l,
            live.traffic.client_aborts() as f64,
        );
        self.add_histogram(
            "magpie_backend_time_to_first_byte_seconds",
            &l,
            &live.traffic.time_to_first_byte,
        );
        self.add_histogram(
            "magpie_backend_request_duration_seconds",
            &l,
            &live.traffic.request_duration,
        );
        for outcome in CheckOutcome::ALL {
            let l = [l[0], l[1], ("result", outcome.as_str())];
            self.add(
                "magpie_backend_health_checks_total",
                &l,
                live.health.checks(outcome) as f64,
            );
        }
        let (up, down) = live.health.transitions();
        self.add(
            "magpie_backend_transitions_total",
            &[l[0], l[1], ("to", "up")],
            up as f64,
        );
        self.add(
            "magpie_backend_transitions_total",
            &[l[0], l[1], ("to", "down")],
            down as f64,
        );
        self.add(
            "magpie_backend_connections_total",
            &l,
            live.traffic.connections() as f64,
        );
        for by in Side::ALL {
            self.add(
                "magpie_backend_resets_total",
                &[l[0], l[1], ("by", by.as_str())],
                live.traffic.resets(by) as f64,
            );
        }
        for why in ConnectFailure::ALL {
            let l = [l[0], l[1], ("reason", why.as_str())];
            self.add(
                "magpie_backend_connect_failures_total",
                &l,
                live.health.connect_failures(why) as f64,
            );
        }
        self.add(
            "magpie_backend_received_bytes_total",
            &l,
            live.traffic.bytes_received() as f64,
        );
        self.add(
            "magpie_backend_sent_bytes_total",
            &l,
            live.traffic.bytes_sent() as f64,
        );
        for why in Spill::ALL {
            self.add(
                "magpie_backend_spills_total",
                &[l[0], l[1], ("reason", why.as_str())],
                live.traffic.spills(why) as f64,
            );
        }
        self.add(
            "magpie_backend_idle_closes_total",
            &l,
            live.traffic.idle_closes() as f64,
        );
        self.add_histogram(
            "magpie_backend_connect_seconds",
            &l,
            &live.traffic.connect_time,
        );
        self.add_histogram(
            "magpie_backend_connection_duration_seconds",
            &l,
            &live.traffic.connection_duration,
        );
        if let Some(share) = share {
            self.add(
                "magpie_backend_up",
                &l,
                if live.health.is_up() { 1.0 } else { 0.0 },
            );
            self.add("magpie_backend_weight", &l, f64::from(b.weight));
            self.add("magpie_backend_table_share_ratio", &l, share);
        }
    }
}
