//! What one scrape reads, and the writer a family's series go through.
//!
//! A family's reader (in [`super::families`]) gets a [`Scrape`] (global
//! families) or a [`BackendView`] (backend families, once per backend) and
//! writes values to a [`Series`], naming only the label *values*: the label
//! names come from the family's row, and a backend family's `backend` and
//! `addr` values are filled in by the series itself. For pool totals
//! (`metrics.per_backend`), every backend's reader writes to one series
//! without those two labels, which adds each value to the series with the
//! same labels (or keeps the largest, see [`Merge`]).

use crate::routing::queue::Queue;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};

use crate::routing::backend::{Backend, Live};
use crate::routing::discovery::Discovery;
use crate::routing::key_memory::KeyMemory;
use crate::routing::sessions::Sessions;
use crate::routing::sessions::store::Store;
use crate::routing::snapshot::Snapshot;
use crate::telemetry::access_log::Counters;
use crate::telemetry::stats::{self, Stats};
use magpie_core::label::Label;

/// How a family's series are read.
#[derive(Clone, Copy)]
pub(crate) enum Read {
    /// Once per scrape.
    Global(fn(&Scrape<'_>, &mut Series<'_>)),
    /// Once per backend, in the table or draining; `backend` and `addr`
    /// come first among its labels.
    Backend(fn(&BackendView<'_>, &mut Series<'_>)),
}

/// One exported family.
pub(crate) struct Family {
    pub(crate) name: &'static str,
    pub(crate) kind: MetricType,
    /// Every label name, in order.
    pub(crate) labels: &'static [&'static str],
    pub(crate) help: &'static str,
    pub(crate) read: Read,
}

/// Everything a global family reads, loaded once per scrape.
pub(crate) struct Scrape<'a> {
    pub(crate) snapshot: &'a Snapshot,
    pub(crate) stats: &'a Stats,
    pub(crate) sessions: Option<&'a Sessions>,
    pub(crate) discovery: &'a Discovery,
    pub(crate) key_memory: &'a KeyMemory,
    /// Lines written, dropped and failed.
    pub(crate) access_log: &'a Counters,
    /// The exporter's renderings (the admin endpoint's families).
    pub(crate) renders: &'a Renders,
    /// `queue`: what waits, and what was admitted and refused.
    pub(crate) queue: &'a Queue,
}

impl Scrape<'_> {
    /// The queue's class names, the highest first (one, `default`, when
    /// the queue has no classes or is off).
    pub(crate) fn classes(&self) -> Vec<String> {
        match &self.snapshot.config.queue {
            Some(q) => q.priority.classes.clone(),
            None => vec!["default".to_string()],
        }
    }
}

impl Scrape<'_> {
    /// The shared session store, if `sessions.store: redis`.
    pub(crate) fn store(&self) -> Option<&Store> {
        self.sessions.and_then(|s| s.store.as_deref())
    }
}

/// How often, and how long, the exposition was rendered: read by the
/// `magpie_admin_metrics_render*` families.
#[derive(Debug, Default)]
pub(crate) struct Renders {
    count: AtomicU64,
    /// The previous rendering's time, in nanoseconds.
    last_nanos: AtomicU64,
}

impl Renders {
    /// A rendering starts (the collector is read).
    pub(super) fn started(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// A rendering ended after `nanos`.
    pub(super) fn took(&self, nanos: u64) {
        self.last_nanos.store(nanos, Ordering::Relaxed);
    }

    /// Renderings so far, the one in progress included.
    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// How long the previous rendering took (zero before the first ended).
    pub(crate) fn last(&self) -> Duration {
        Duration::from_nanos(self.last_nanos.load(Ordering::Relaxed))
    }
}

/// One backend as its families read it.
pub(crate) struct BackendView<'a> {
    pub(crate) backend: &'a Backend,
    /// Its share of the table; `None` for a removed backend still draining
    /// (it keeps its counters, but has no health, weight or share).
    pub(crate) share: Option<f64>,
    /// `mode: http`: the active count is requests in flight.
    pub(crate) requests: bool,
    /// `health.load.max_age`, when engine load is on.
    pub(crate) engine_max_age: Option<std::time::Duration>,
    /// With `queue`: the most requests (or connections) it takes at once.
    pub(crate) inflight_limit: Option<u64>,
}

impl BackendView<'_> {
    pub(crate) fn live(&self) -> &Live {
        &self.backend.live
    }

    /// The engine's values if they are fresh (engine load on, a backend in
    /// the table, a good scrape at most `max_age` ago).
    pub(crate) fn engine(&self) -> Option<crate::routing::health::exposition::Sample> {
        let max_age = self.engine_max_age.filter(|_| self.share.is_some())?;
        (self.live().engine).fresh(tokio::time::Instant::now(), max_age)
    }
}

/// How pool totals combine the backends' values of one series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Merge {
    /// Added: what `sum()` over the per-backend series gives. Histograms
    /// add their counts, sums and buckets.
    Sum,
    /// The largest (a fraction such as a KV cache's usage, whose sum means
    /// nothing).
    Max,
}

/// Writes one family's series.
pub(crate) struct Series<'a> {
    family: &'a mut MetricFamily,
    /// The family's label names, in order.
    names: &'static [&'static str],
    /// The values of the first labels, the same for every series written
    /// here (a backend's name and address).
    fixed: &'a [&'a str],
    /// Pool totals: a value for labels already written is merged into that
    /// series instead of adding one.
    merge: Option<Merge>,
}

impl<'a> Series<'a> {
    pub(crate) fn new(
        family: &'a mut MetricFamily,
        names: &'static [&'static str],
        fixed: &'a [&'a str],
    ) -> Series<'a> {
        Series {
            family,
            names,
            fixed,
            merge: None,
        }
    }

    /// A writer of pool totals: `names` are the family's labels after
    /// `backend` and `addr`, and each value is merged by `merge` into the
    /// series written before with the same labels.
    pub(crate) fn totals(
        family: &'a mut MetricFamily,
        names: &'static [&'static str],
        merge: Merge,
    ) -> Series<'a> {
        Series {
            family,
            names,
            fixed: &[],
            merge: Some(merge),
        }
    }

    /// A counter or gauge (by the family's type) with `labels` after the
    /// fixed ones.
    pub(crate) fn value(&mut self, labels: &[&str], value: f64) {
        let counter = self.family.get_field_type() == prometheus::proto::MetricType::COUNTER;
        if let Some((merge, m)) = self.written(labels) {
            let before = if counter {
                m.get_counter().get_value()
            } else {
                m.get_gauge().get_value()
            };
            let merged = match merge {
                Merge::Sum => before + value,
                Merge::Max => before.max(value),
            };
            if counter {
                let mut c = Counter::default();
                c.set_value(merged);
                m.set_counter(c);
            } else {
                let mut g = Gauge::default();
                g.set_value(merged);
                m.set_gauge(g);
            }
            return;
        }
        let mut m = self.metric(labels);
        if counter {
            let mut c = Counter::default();
            c.set_value(value);
            m.set_counter(c);
        } else {
            let mut g = Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
        self.family.mut_metric().push(m);
    }

    /// A counter or gauge per value of the label `L`.
    pub(crate) fn by<L: Label>(&mut self, value: impl Fn(L) -> u64) {
        for &l in L::ALL {
            self.value(&[l.as_str()], value(l) as f64);
        }
    }

    /// One of magpie's latency histograms.
    pub(crate) fn histogram(&mut self, labels: &[&str], h: &stats::Histogram) {
        if let Some((_, m)) = self.written(labels) {
            // Every backend's histogram of a family has the same bounds.
            let mut sum = m.get_histogram().clone();
            sum.set_sample_count(sum.get_sample_count() + h.count());
            sum.set_sample_sum(sum.get_sample_sum() + h.sum_seconds());
            let buckets = sum
                .get_bucket()
                .iter()
                .zip(h.cumulative())
                .map(|(b, count)| {
                    let mut b = b.clone();
                    b.set_cumulative_count(b.cumulative_count() + count);
                    b
                })
                .collect();
            sum.set_bucket(buckets);
            m.set_histogram(sum);
            return;
        }
        let mut m = self.metric(labels);
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
        self.family.mut_metric().push(m);
    }

    /// Pool totals: the series already written with these label values.
    /// A family has a handful of series, so a scan is cheaper than a map.
    fn written(&mut self, labels: &[&str]) -> Option<(Merge, &mut Metric)> {
        let merge = self.merge?;
        let m = self.family.mut_metric().iter_mut().find(|m| {
            let values = m.get_label().iter().map(|l| l.value());
            values.eq(labels.iter().copied())
        })?;
        Some((merge, m))
    }

    fn metric(&self, labels: &[&str]) -> Metric {
        let values = self.fixed.iter().chain(labels);
        debug_assert_eq!(
            self.fixed.len() + labels.len(),
            self.names.len(),
            "{}: label values do not match the names",
            self.family.name()
        );
        let mut m = Metric::default();
        m.set_label(
            self.names
                .iter()
                .zip(values)
                .map(|(name, value)| {
                    let mut l = LabelPair::default();
                    l.set_name(name.to_string());
                    l.set_value(value.to_string());
                    l
                })
                .collect(),
        );
        m
    }
}
