//! The Prometheus export of magpie's counters.
//!
//! The data path only touches atomics: per-backend ones in
//! [`crate::routing::backend::Live`], global ones in [`crate::telemetry::stats::Stats`]; this
//! module only reads them. Nothing on the hot path looks up a label. At
//! scrape time, [`Exporter`] (a `prometheus` collector in its own
//! `Registry`) loads the current snapshot once and walks [`families()`], the
//! one table of names, types, labels, help texts and readers. A removed
//! backend is exported until its last connection closes; then its series go.
//!
//! | module | owns |
//! |---|---|
//! | [`families`] | every family, declared once, with how its series are read; those read once per scrape |
//! | [`backend_families`] | the families read once per backend |
//! | [`queue_families`] | the queue's families: what waits, how long, what was admitted and refused, by class |
//! | [`datagram_families`] | mode udp's families: flows, dropped datagrams, datagrams per backend each way |
//! | [`series`] | what a scrape reads, and the writer a family's series go through |
//! | [`tls`] | the TLS families' readers: handshakes, certificate expiry |

pub(crate) mod backend_families;
pub(crate) mod datagram_families;
pub(crate) mod families;
pub(crate) mod queue_families;
pub(crate) mod series;
pub(crate) mod tls;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Encoder, Registry, TextEncoder};

pub(crate) use families::families;
pub(crate) use series::{Family, Read};

pub(crate) use self::series::Renders;
use self::series::{BackendView, Merge, Scrape, Series};
use crate::config::Mode;
use crate::routing::backend::Backend;
use crate::routing::instance::Instance;

/// The collector behind `/metrics`.
pub(crate) struct Exporter {
    instance: Arc<Instance>,
    descs: Vec<Desc>,
    renders: Arc<Renders>,
}

impl Exporter {
    pub(crate) fn new(instance: Arc<Instance>, renders: Arc<Renders>) -> Self {
        let descs = families()
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
        Exporter {
            instance,
            descs,
            renders,
        }
    }
}

#[cfg(any(test, feature = "testing"))]
/// A registry holding magpie's collector and the process collector.
pub(crate) fn registry(instance: Arc<Instance>) -> Registry {
    registry_counting(instance, Arc::default())
}

fn registry_counting(instance: Arc<Instance>, renders: Arc<Renders>) -> Registry {
    let registry = Registry::new();
    if let Err(e) = registry.register(Box::new(Exporter::new(instance, renders))) {
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

#[cfg(any(test, feature = "testing"))]
/// The text exposition of everything in `registry`.
pub(crate) fn render(registry: &Registry) -> String {
    let out = encode(registry);
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn encode(registry: &Registry) -> Vec<u8> {
    let mut out = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut out) {
        tracing::error!(error = %e, "cannot encode metrics");
    }
    out
}

/// A registry that counts and times its renderings (what the admin
/// endpoint serves).
pub(crate) struct Renderer {
    registry: Registry,
    renders: Arc<Renders>,
}

impl Renderer {
    pub(crate) fn new(instance: Arc<Instance>) -> Renderer {
        let renders = Arc::new(Renders::default());
        Renderer {
            registry: registry_counting(instance, Arc::clone(&renders)),
            renders,
        }
    }

    /// The text exposition (UTF-8). CPU-bound: tens of milliseconds for a
    /// pool of thousands of backends with per-backend series.
    pub(crate) fn render(&self) -> Vec<u8> {
        let started = Instant::now();
        let out = encode(&self.registry);
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.renders.took(nanos);
        out
    }
}

/// Backend families whose pool total is the largest value, not the sum.
const MAX_IN_TOTALS: &[&str] = &["magpie_backend_engine_kv_usage"];

/// One backend as the families read it: the backend, its table share
/// (`None` while draining) and its address as text (per-backend series
/// only).
type Exported = (Arc<Backend>, Option<f64>, String);

impl Collector for Exporter {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.renders.started();
        let snapshot = self.instance.snapshot.load_full();
        let sessions = self.instance.sessions();
        let scrape = Scrape {
            snapshot: &snapshot,
            stats: &self.instance.stats,
            sessions: sessions.as_deref(),
            discovery: &self.instance.discovery,
            key_memory: &self.instance.key_memory,
            access_log: self.instance.access_log.counters(),
            renders: &self.renders,
            queue: &self.instance.queue,
        };
        // The current backends with their shares, then the draining ones;
        // each with its address as text, for its labels.
        let prefill_only = (snapshot.prefill.iter())
            .flat_map(|p| p.backends.iter().zip(&p.shares))
            .filter(|(b, _)| !b.role.decodes());
        let current = (snapshot.backends.iter().zip(&snapshot.shares))
            .chain(prefill_only)
            .map(|(b, &share)| (Arc::clone(b), Some(share)));
        let draining = self.instance.retired().into_iter().map(|b| (b, None));
        let mut backends: Vec<Exported> = current
            .chain(draining)
            .map(|(b, share)| (b, share, String::new()))
            .collect();
        let per_backend = (snapshot.config.metrics.per_backend).applies(backends.len());
        if per_backend {
            for (b, _, addr) in &mut backends {
                *addr = b.addr.to_string();
            }
        }
        let pool = Pool {
            backends: &backends,
            per_backend,
            requests: snapshot.config.mode == Mode::Http,
            engine_max_age: snapshot.config.load_limits().map(|l| l.max_age),
            max_inflight: snapshot.config.queue.as_ref().map(|q| q.max_inflight),
        };
        families()
            .map(|family| {
                let mut out = MetricFamily::default();
                out.set_name(family.name.to_string());
                out.set_help(family.help.to_string());
                out.set_field_type(family.kind);
                match family.read {
                    Read::Global(read) => {
                        read(&scrape, &mut Series::new(&mut out, family.labels, &[]))
                    }
                    Read::Backend(read) => pool.write(family, read, &mut out),
                }
                out
            })
            .collect()
    }
}

/// The backends one scrape exports, and how.
struct Pool<'a> {
    backends: &'a [Exported],
    /// One series per backend; otherwise pool totals without the `backend`
    /// and `addr` labels.
    per_backend: bool,
    /// `mode: http`: the active count is requests in flight.
    requests: bool,
    engine_max_age: Option<Duration>,
    /// `queue.max_inflight`, when the queue is on.
    max_inflight: Option<u64>,
}

impl Pool<'_> {
    /// A backend family's series: one per backend, or the pool's totals.
    fn write(
        &self,
        family: &Family,
        read: fn(&BackendView<'_>, &mut Series<'_>),
        out: &mut MetricFamily,
    ) {
        // Backend families list `backend` and `addr` first.
        let after = family.labels.get(2..).unwrap_or_default();
        let merge = if MAX_IN_TOTALS.contains(&family.name) {
            Merge::Max
        } else {
            Merge::Sum
        };
        for (backend, share, addr) in self.backends {
            let view = BackendView {
                backend,
                share: *share,
                requests: self.requests,
                engine_max_age: self.engine_max_age,
                inflight_limit: self.max_inflight.map(|m| backend.max_inflight.unwrap_or(m)),
            };
            if self.per_backend {
                let fixed = [backend.name.as_str(), addr.as_str()];
                read(&view, &mut Series::new(out, family.labels, &fixed));
            } else {
                read(&view, &mut Series::totals(out, after, merge));
            }
        }
    }
}

/// The busiest backend's load over its weighted fair share: with equal
/// weights, max(active) / mean(active). Backends of weight 0 have no share
/// and are left out. 0 when nothing is active.
pub(crate) fn peak_ratio(backends: &[Arc<Backend>], total_weight: u64) -> f64 {
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
    use crate::routing::snapshot::Snapshot;

    fn instance() -> Arc<Instance> {
        let config = Config::parse(
            std::path::Path::new("t.yaml"),
            "listen: 127.0.0.1:7000\nhealth: {load: {preset: vllm}}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8002, weight: 3}\n",
        )
        .unwrap();
        Arc::new(Instance::new(
            Snapshot::build(Arc::new(config), 1, &HashMap::new()).unwrap(),
        ))
    }

    /// A mode http magpie whose listener terminates TLS, with a certificate
    /// made here (so the certificate families have a series).
    fn instance_with_tls() -> Arc<Instance> {
        let dir = std::env::temp_dir().join(format!("magpie-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["a.test".to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join("a.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("a.key"), key.serialize_pem()).unwrap();
        let text = format!(
            "mode: http\nlisten:\n  - {{addr: 127.0.0.1:7000, tls: {{cert: {0}/a.pem, key: {0}/a.key}}}}\nhealth: {{load: {{preset: vllm}}}}\nbackends:\n  - {{name: a, addr: 127.0.0.1:8001}}\n  - {{name: b, addr: 127.0.0.1:8002, weight: 3}}\n",
            dir.display()
        );
        let config = Config::parse(std::path::Path::new("t.yaml"), &text).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        Arc::new(Instance::new(
            Snapshot::build(Arc::new(config), 1, &HashMap::new()).unwrap(),
        ))
    }

    #[test]
    fn every_family_is_rendered() {
        let instance = instance_with_tls();
        // The engine gauges are there only with a fresh value.
        let sample = crate::routing::health::exposition::Sample {
            waiting: Some(3.0),
            running: Some(2.0),
            kv_usage: Some(0.5),
            kv_capacity: Some(64000.0),
            slots: Some(2.0),
        };
        let a = instance.snapshot.load().backends[0].clone();
        a.live.engine.record(sample, tokio::time::Instant::now());
        let text = render(&registry(Arc::clone(&instance)));
        for Family { name, kind, .. } in families() {
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
    fn pool_totals_drop_the_backend_labels_and_add_up() {
        let config = Config::parse(
            std::path::Path::new("t.yaml"),
            "listen: 127.0.0.1:7000\nmetrics: {per_backend: off}\nhealth: {load: {preset: vllm}}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8002, weight: 3}\n",
        )
        .unwrap();
        let instance = Arc::new(Instance::new(
            Snapshot::build(Arc::new(config), 1, &HashMap::new()).unwrap(),
        ));
        let snapshot = instance.snapshot.load_full();
        let (a, b) = (&snapshot.backends[0], &snapshot.backends[1]);
        let now = tokio::time::Instant::now();
        for (backend, kv_usage) in [(a, 0.25), (b, 0.75)] {
            let sample = crate::routing::health::exposition::Sample {
                waiting: Some(2.0),
                running: None,
                kv_usage: Some(kv_usage),
                kv_capacity: None,
                slots: None,
            };
            backend.live.engine.record(sample, now);
        }
        a.live.traffic.count_connection();
        b.live.traffic.count_connection();
        b.live.traffic.count_connection();
        a.live
            .traffic
            .count_spill(crate::routing::backend::Spill::AtCap);
        a.live
            .traffic
            .connect_time
            .observe(std::time::Duration::from_millis(2));
        b.live
            .traffic
            .connect_time
            .observe(std::time::Duration::from_millis(3));
        let text = render(&registry(Arc::clone(&instance)));
        assert!(!text.contains("backend=\""), "{text}");
        assert!(!text.contains("addr=\""), "{text}");
        for line in [
            "magpie_backend_connections_total 3",
            "magpie_backend_weight 4",
            "magpie_backend_up 2",
            "magpie_backend_table_share_ratio 1",
            "magpie_backend_spills_total{reason=\"at_cap\"} 1",
            "magpie_backend_spills_total{reason=\"down\"} 0",
            "magpie_backend_connect_seconds_count 2",
            "magpie_backend_engine_waiting 4",
            // A fraction's total is the largest, not the sum.
            "magpie_backend_engine_kv_usage 0.75",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
        }
        // Each series once, and every bucket of the merged histogram counts
        // both observations from 5 ms on.
        let spills = text
            .lines()
            .filter(|l| l.starts_with("magpie_backend_spills_total{"))
            .count();
        assert_eq!(spills, crate::routing::backend::Spill::COUNT, "{text}");
        assert!(
            text.lines()
                .any(|l| l == "magpie_backend_connect_seconds_bucket{le=\"0.005\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn peak_ratio_uses_weighted_shares() {
        let instance = instance();
        let snapshot = instance.snapshot.load();
        assert_eq!(peak_ratio(&snapshot.backends, 4), 0.0);
        // a (weight 1) has 2 of 4 active: its fair share is 1, so ratio 2.
        let _g: Vec<_> = (0..2)
            .map(|_| snapshot.backends[0].live.reserve())
            .chain((0..2).map(|_| snapshot.backends[1].live.reserve()))
            .collect();
        assert!((peak_ratio(&snapshot.backends, 4) - 2.0).abs() < 1e-9);
    }
}
