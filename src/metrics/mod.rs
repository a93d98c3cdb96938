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
use prometheus::proto::MetricFamily;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::backend::Backend;
use crate::config::Mode;
use crate::discovery::Lookup;
use crate::key::FallbackReason;
use crate::snapshot::Shared;
use crate::stats::{ClientFailure, Exhausted};
use crate::supervise::{self, Task};

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
    // process_open_fds, process_max_fds, process_resident_memory_bytes,
    // process_cpu_seconds_total, process_start_time_seconds, ...
    let process = prometheus::process_collector::ProcessCollector::for_self();
    if let Err(e) = registry.register(Box::new(process)) {
        tracing::error!(error = %e, "cannot register process metrics");
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

mod families;

pub use families::FAMILIES;
use families::Families;

impl Collector for Exporter {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let snapshot = self.shared.snapshot.load_full();
        let stats = &self.shared.stats;
        let mut f = Families::new();
        let requests = snapshot.config.mode == Mode::Http;
        for (b, share) in snapshot.backends.iter().zip(&snapshot.shares) {
            f.add_backend(b, Some(*share), requests);
        }
        for b in self.shared.retired() {
            f.add_backend(&b, None, requests);
        }
        let sessions = self.shared.sessions();
        let pins = sessions.as_deref().map(|s| &s.pins);
        f.add(
            "magpie_session_pins",
            &[],
            pins.map_or(0, |p| p.len()) as f64,
        );
        for (result, n) in [
            ("hit", pins.map_or(0, |p| p.hits())),
            ("miss", pins.map_or(0, |p| p.misses())),
        ] {
            f.add(
                "magpie_session_pin_lookups_total",
                &[("result", result)],
                n as f64,
            );
        }
        f.add(
            "magpie_session_pin_evictions_total",
            &[],
            pins.map_or(0, |p| p.evictions()) as f64,
        );
        let store = sessions.as_deref().and_then(|s| s.store.as_deref());
        f.add_session_store(store);
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
        for task in Task::ALL {
            f.add(
                "magpie_task_restarts_total",
                &[("task", task.as_str())],
                supervise::restarts(task) as f64,
            );
        }
        f.add("magpie_panics_total", &[], supervise::panics() as f64);
        f.add(
            "magpie_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1.0,
        );
        for result in Lookup::ALL {
            f.add(
                "magpie_discovery_lookups_total",
                &[("result", result.as_str())],
                self.shared.discovery.lookups(result) as f64,
            );
        }
        for during in Exhausted::ALL {
            f.add(
                "magpie_resource_exhaustion_total",
                &[("during", during.as_str())],
                stats.exhausted(during) as f64,
            );
        }
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
        .map(|b| b.live.load.active())
        .sum();
    if total == 0 || total_weight == 0 {
        return 0.0;
    }
    backends
        .iter()
        .filter(|b| b.weight > 0)
        .map(|b| {
            let fair = total as f64 * f64::from(b.weight) / total_weight as f64;
            b.live.load.active() as f64 / fair
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
            let kind = match kind {
                prometheus::proto::MetricType::COUNTER => "counter",
                prometheus::proto::MetricType::HISTOGRAM => "histogram",
                _ => "gauge",
            };
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
