//! The Prometheus export of magpie's counters.
//!
//! The data path only touches atomics: per-backend ones in
//! [`crate::backend::Live`], global ones in [`crate::stats::Stats`]; this module
//! only reads them. Nothing on the hot path
//! looks up a label. At scrape time, [`Exporter`] (a `prometheus` collector in
//! its own `Registry`) reads the current snapshot, the draining backends and
//! the counters, and renders every family listed in [`FAMILIES`]. A removed
//! backend is exported until its last connection closes; then its series go.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, Registry, TextEncoder};

use crate::backend::{Backend, ConnectFailure};
use crate::key::FallbackReason;
use crate::snapshot::Shared;
use crate::stats::ClientFailure;

use MetricType::{COUNTER, GAUGE};

/// Every exported family: name, type, labels, help. README lists the same.
pub const FAMILIES: &[(&str, MetricType, &[&str], &str)] = &[
    (
        "magpie_backend_active_connections",
        GAUGE,
        &["backend", "addr"],
        "Open connections (and connects in progress) to the backend.",
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
        &["backend", "addr"],
        "Connections whose key this backend was a candidate for but which went elsewhere, because it was down or at its bounded-load cap.",
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
        "Connections keyed by the fallback because no header key was read, by reason.",
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
        "Client connections closed without reaching a backend, by reason (no_backend, proxy_protocol).",
    ),
];

/// The collector behind `/metrics`.
pub struct Exporter {
    shared: Arc<Shared>,
    descs: Vec<Desc>,
}

impl Exporter {
    pub fn new(shared: Arc<Shared>) -> Self {
        let descs = FAMILIES
            .iter()
            .filter_map(|(name, _, labels, help)| {
                Desc::new(
                    name.to_string(),
                    help.to_string(),
                    labels.iter().map(|l| l.to_string()).collect(),
                    HashMap::new(),
                )
                .ok()
            })
            .collect();
        Exporter { shared, descs }
    }
}

/// A registry holding magpie's collector.
pub fn registry(shared: Arc<Shared>) -> Registry {
    let registry = Registry::new();
    if let Err(e) = registry.register(Box::new(Exporter::new(shared))) {
        tracing::error!(error = %e, "cannot register metrics");
    }
    registry
}

/// The text exposition of everything in `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut out) {
        tracing::error!(error = %e, "cannot encode metrics");
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Builds the families in [`FAMILIES`] order.
struct Families(Vec<MetricFamily>);

impl Families {
    fn new() -> Self {
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

    fn add(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let Some(family) = self.0.iter_mut().find(|f| f.name() == name) else {
            debug_assert!(false, "unknown metric family {name}");
            return;
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
    /// set) has up, weight and share; a draining one keeps its counters.
    fn add_backend(&mut self, b: &Backend, share: Option<f64>) {
        let addr = b.addr.to_string();
        let l = [("backend", b.name.as_str()), ("addr", addr.as_str())];
        let live = &b.live;
        self.add(
            "magpie_backend_active_connections",
            &l,
            live.active() as f64,
        );
        self.add(
            "magpie_backend_connections_total",
            &l,
            live.connections() as f64,
        );
        for why in ConnectFailure::ALL {
            let l = [l[0], l[1], ("reason", why.as_str())];
            self.add(
                "magpie_backend_connect_failures_total",
                &l,
                live.connect_failures(why) as f64,
            );
        }
        self.add(
            "magpie_backend_received_bytes_total",
            &l,
            live.bytes_received() as f64,
        );
        self.add(
            "magpie_backend_sent_bytes_total",
            &l,
            live.bytes_sent() as f64,
        );
        self.add("magpie_backend_spills_total", &l, live.spills() as f64);
        if let Some(share) = share {
            self.add(
                "magpie_backend_up",
                &l,
                if live.is_up() { 1.0 } else { 0.0 },
            );
            self.add("magpie_backend_weight", &l, f64::from(b.weight));
            self.add("magpie_backend_table_share_ratio", &l, share);
        }
    }
}

impl Collector for Exporter {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let snapshot = self.shared.snapshot.load_full();
        let stats = &self.shared.stats;
        let mut f = Families::new();
        for (b, share) in snapshot.backends.iter().zip(&snapshot.shares) {
            f.add_backend(b, Some(*share));
        }
        for b in self.shared.retired() {
            f.add_backend(&b, None);
        }
        f.add("magpie_table_version", &[], snapshot.version as f64);
        let algorithm = snapshot.table.algorithm().as_str();
        f.add(
            "magpie_table_info",
            &[
                ("algorithm", algorithm),
                ("fingerprint", &snapshot.fingerprint),
            ],
            1.0,
        );
        f.add(
            "magpie_table_build_seconds",
            &[],
            snapshot.build_time.as_secs_f64(),
        );
        f.add(
            "magpie_load_peak_ratio",
            &[],
            peak_ratio(&snapshot.backends, snapshot.total_weight),
        );
        f.add(
            "magpie_reloads_total",
            &[("result", "ok")],
            stats.reloads(true) as f64,
        );
        f.add(
            "magpie_reloads_total",
            &[("result", "error")],
            stats.reloads(false) as f64,
        );
        for why in FallbackReason::ALL {
            f.add(
                "magpie_key_fallbacks_total",
                &[("reason", why.as_str())],
                stats.fallbacks(why) as f64,
            );
        }
        f.add(
            "magpie_connections_accepted_total",
            &[],
            stats.accepted() as f64,
        );
        f.add(
            "magpie_connections_rejected_total",
            &[],
            stats.rejected() as f64,
        );
        f.add(
            "magpie_accept_errors_total",
            &[],
            stats.accept_errors() as f64,
        );
        for why in ClientFailure::ALL {
            f.add(
                "magpie_client_failures_total",
                &[("reason", why.as_str())],
                stats.client_failures(why) as f64,
            );
        }
        f.0
    }
}

/// The busiest backend's load over its weighted fair share: with equal
/// weights, max(active) / mean(active). Backends of weight 0 have no share
/// and are left out. 0 when nothing is active.
pub fn peak_ratio(backends: &[Arc<Backend>], total_weight: u64) -> f64 {
    let total: u64 = backends
        .iter()
        .filter(|b| b.weight > 0)
        .map(|b| b.live.active())
        .sum();
    if total == 0 || total_weight == 0 {
        return 0.0;
    }
    backends
        .iter()
        .filter(|b| b.weight > 0)
        .map(|b| {
            let fair = total as f64 * f64::from(b.weight) / total_weight as f64;
            b.live.active() as f64 / fair
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::snapshot::Snapshot;

    fn shared() -> Arc<Shared> {
        let config = Config::parse(
            std::path::Path::new("t.yaml"),
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8002, weight: 3}\n",
        )
        .unwrap();
        Arc::new(Shared::new(
            Snapshot::build(Arc::new(config), 1, &HashMap::new()).unwrap(),
        ))
    }

    #[test]
    fn every_family_is_rendered() {
        let shared = shared();
        let text = render(&registry(Arc::clone(&shared)));
        for (name, kind, _, _) in FAMILIES {
            let kind = if *kind == COUNTER { "counter" } else { "gauge" };
            assert!(
                text.contains(&format!("# TYPE {name} {kind}")),
                "{name} missing in:\n{text}"
            );
        }
        assert!(
            text.contains("magpie_backend_weight{backend=\"b\",addr=\"127.0.0.1:8002\"} 3"),
            "{text}"
        );
    }

    #[test]
    fn peak_ratio_uses_weighted_shares() {
        let shared = shared();
        let snapshot = shared.snapshot.load();
        assert_eq!(peak_ratio(&snapshot.backends, 4), 0.0);
        // a (weight 1) has 2 of 4 active: its fair share is 1, so ratio 2.
        let _g: Vec<_> = (0..2)
            .map(|_| snapshot.backends[0].live.reserve())
            .chain((0..2).map(|_| snapshot.backends[1].live.reserve()))
            .collect();
        assert!((peak_ratio(&snapshot.backends, 4) - 2.0).abs() < 1e-9);
    }
}
