//! The Prometheus export of magpie's counters.
//!
//! The data path only touches atomics: per-backend ones in
//! [`crate::backend::Live`], global ones in [`crate::stats::Stats`]; this
//! module only reads them. Nothing on the hot path looks up a label. At
//! scrape time, [`Exporter`] (a `prometheus` collector in its own
//! `Registry`) loads the current snapshot once and walks [`FAMILIES`], the
//! one table of names, types, labels, help texts and readers. A removed
//! backend is exported until its last connection closes; then its series go.
//!
//! | module | owns |
//! |---|---|
//! | [`families`] | every family, declared once, with how its series are read |
//! | [`series`] | what a scrape reads, and the writer a family's series go through |

pub mod families;
pub mod series;

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Encoder, Registry, TextEncoder};

pub use families::{FAMILIES, Family, Read};

use self::series::{BackendView, Scrape, Series};
use crate::backend::Backend;
use crate::config::Mode;
use crate::snapshot::Shared;

/// The collector behind `/metrics`.
pub struct Exporter {
    shared: Arc<Shared>,
    descs: Vec<Desc>,
}

impl Exporter {
    pub fn new(shared: Arc<Shared>) -> Self {
        let descs = FAMILIES
            .iter()
            .filter_map(|f| {
                Desc::new(
                    f.name.to_string(),
                    f.help.to_string(),
                    f.labels.iter().map(|l| l.to_string()).collect(),
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

impl Collector for Exporter {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let snapshot = self.shared.snapshot.load_full();
        let sessions = self.shared.sessions();
        let scrape = Scrape {
            snapshot: &snapshot,
            stats: &self.shared.stats,
            sessions: sessions.as_deref(),
            discovery: &self.shared.discovery,
            recent: &self.shared.recent,
        };
        let requests = snapshot.config.mode == Mode::Http;
        let engine_max_age = snapshot.config.load_limits().map(|l| l.max_age);
        // The current backends with their shares, then the draining ones;
        // each with its address as text, for its labels.
        let current = snapshot
            .backends
            .iter()
            .zip(&snapshot.shares)
            .map(|(b, &share)| (Arc::clone(b), Some(share)));
        let draining = self.shared.retired().into_iter().map(|b| (b, None));
        let backends: Vec<(Arc<Backend>, Option<f64>, String)> = current
            .chain(draining)
            .map(|(b, share)| {
                let addr = b.addr.to_string();
                (b, share, addr)
            })
            .collect();
        FAMILIES
            .iter()
            .map(|family| {
                let mut out = MetricFamily::default();
                out.set_name(family.name.to_string());
                out.set_help(family.help.to_string());
                out.set_field_type(family.kind);
                match family.read {
                    Read::Global(read) => {
                        read(&scrape, &mut Series::new(&mut out, family.labels, &[]))
                    }
                    Read::Backend(read) => {
                        for (backend, share, addr) in &backends {
                            let view = BackendView {
                                backend,
                                share: *share,
                                requests,
                                engine_max_age,
                            };
                            let fixed = [backend.name.as_str(), addr.as_str()];
                            read(&view, &mut Series::new(&mut out, family.labels, &fixed));
                        }
                    }
                }
                out
            })
            .collect()
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
            "listen: 127.0.0.1:7000\nhealth: {load: {preset: vllm}}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8002, weight: 3}\n",
        )
        .unwrap();
        Arc::new(Shared::new(
            Snapshot::build(Arc::new(config), 1, &HashMap::new()).unwrap(),
        ))
    }

    #[test]
    fn every_family_is_rendered() {
        let shared = shared();
        // The engine gauges are there only with a fresh value.
        let sample = crate::health::exposition::Sample {
            waiting: Some(3.0),
            running: Some(2.0),
            kv_usage: Some(0.5),
        };
        let a = shared.snapshot.load().backends[0].clone();
        a.live.engine.record(sample, tokio::time::Instant::now());
        let text = render(&registry(Arc::clone(&shared)));
        for Family { name, kind, .. } in FAMILIES {
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
        assert!(
            text.contains(
                "magpie_backend_engine_kv_usage{backend=\"a\",addr=\"127.0.0.1:8001\"} 0.5"
            ),
            "{text}"
        );
        assert!(
            !text.contains("magpie_backend_engine_waiting{backend=\"b\""),
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
