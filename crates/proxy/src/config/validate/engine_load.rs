//! Validation of `health.load`: engine load signals read from each
//! backend's own metrics.
//!
//! Part of [`Validator`]. A preset fills in the gauge names, which the
//! section may override; without one (`preset: none`) at least the waiting
//! or the KV cache gauge must be named, or nothing could ever make a backend
//! full. Every duration and limit has a bound: the interval from 100 ms to
//! 5 min, a timeout below the interval, a `max_age` above it (else every
//! value would age out before the next scrape), `max_kv_usage` in (0, 1].

use std::time::Duration;

use serde_saphyr::{Location, Spanned};

use super::Validator;
use crate::config::raw::{HumanDuration, RawLoad};
use crate::config::{
    DEFAULT_LOAD_INTERVAL, DEFAULT_LOAD_MAX_AGE_INTERVALS, DEFAULT_LOAD_PATH, DEFAULT_LOAD_TIMEOUT,
    DEFAULT_MAX_KV_USAGE, Gauges, LoadConfig, LoadLimits, LoadPreset, MAX_LOAD_INTERVAL,
    MAX_LOAD_MAX_AGE, MAX_MAX_WAITING, MIN_LOAD_INTERVAL,
};

impl Validator<'_> {
    /// The `health.load` section.
    pub(super) fn load(&mut self, raw: Spanned<RawLoad>) -> LoadConfig {
        let at = raw.referenced;
        let raw = raw.value;
        let preset = raw.preset.map_or(LoadPreset::None, |p| p.value);
        let path = match raw.path {
            None => DEFAULT_LOAD_PATH.to_string(),
            Some(p) => {
                let text = p.value.trim();
                if !text.starts_with('/') || text.parse::<hyper::Uri>().is_err() {
                    self.err(
                        &p.referenced,
                        format!(
                            "health.load.path {text:?} is not a request path (write e.g. /metrics)"
                        ),
                    );
                }
                text.to_string()
            }
        };
        let interval = self.load_interval(raw.interval);
        let timeout = self.load_timeout(raw.timeout, interval);
        let written = [raw.waiting, raw.running, raw.kv_usage, raw.kv_capacity];
        let gauges = self.gauges(preset, written, &at);
        let limits = LoadLimits {
            max_waiting: (raw.max_waiting).map(|m| {
                let (what, written) = ("health.load.max_waiting", m.value);
                self.count(Some(m), what, written, 0..=MAX_MAX_WAITING)
            }),
            max_kv_usage: self.kv_usage(raw.max_kv_usage),
            max_age: self.max_age(raw.max_age, interval),
        };
        LoadConfig {
            preset,
            path,
            interval,
            timeout,
            gauges,
            limits,
        }
    }

    fn load_interval(&mut self, raw: Option<Spanned<HumanDuration>>) -> Duration {
        let Some(d) = raw else {
            return DEFAULT_LOAD_INTERVAL;
        };
        if d.value.0 < MIN_LOAD_INTERVAL {
            self.err(
                &d.referenced,
                format!(
                    "health.load.interval must be at least {}",
                    humantime::format_duration(MIN_LOAD_INTERVAL)
                ),
            );
            return DEFAULT_LOAD_INTERVAL;
        }
        self.at_most(&d, "health.load.interval", MAX_LOAD_INTERVAL)
            .unwrap_or(DEFAULT_LOAD_INTERVAL)
    }

    /// Above zero and below `interval`, so one round ends before the next.
    fn load_timeout(
        &mut self,
        raw: Option<Spanned<HumanDuration>>,
        interval: Duration,
    ) -> Duration {
        let default = DEFAULT_LOAD_TIMEOUT.min(interval / 2);
        let Some(d) = raw else {
            return default;
        };
        if d.value.0.is_zero() {
            self.err(
                &d.referenced,
                "health.load.timeout must be greater than zero",
            );
        } else if d.value.0 >= interval {
            self.err(
                &d.referenced,
                format!(
                    "health.load.timeout ({}) must be shorter than health.load.interval ({})",
                    humantime::format_duration(d.value.0),
                    humantime::format_duration(interval)
                ),
            );
        } else {
            return d.value.0;
        }
        default
    }

    /// The preset's names, each overridden where the section names one.
    fn gauges(
        &mut self,
        preset: LoadPreset,
        written: [Option<Spanned<String>>; 4],
        at: &Location,
    ) -> Gauges {
        let mut gauges = preset.gauges();
        let [waiting, running, kv_usage, kv_capacity] = written;
        // Another waiting gauge need not mean that every slot is taken.
        gauges.waits_for_a_slot &= waiting.is_none();
        let slots = [
            ("waiting", waiting, &mut gauges.waiting),
            ("running", running, &mut gauges.running),
            ("kv_usage", kv_usage, &mut gauges.kv_usage),
            ("kv_capacity", kv_capacity, &mut gauges.kv_capacity),
        ];
        for (what, name, slot) in slots {
            let Some(name) = name else {
                continue;
            };
            let text = name.value.trim();
            if !is_metric_name(text) {
                self.err(
                    &name.referenced,
                    format!("health.load.{what} {text:?} is not a Prometheus metric name (letters, digits, `_` and `:`, not starting with a digit)"),
                );
            }
            *slot = Some(text.to_string());
        }
        if gauges.waiting.is_none() && gauges.kv_usage.is_none() {
            self.err(
                at,
                "health.load needs a preset (vllm, sglang or llamacpp) or the gauges to read (waiting, kv_usage)",
            );
        }
        gauges
    }

    fn kv_usage(&mut self, raw: Option<Spanned<f64>>) -> f64 {
        let Some(v) = raw else {
            return DEFAULT_MAX_KV_USAGE;
        };
        if v.value > 0.0 && v.value <= 1.0 {
            return v.value;
        }
        self.err(
            &v.referenced,
            format!(
                "health.load.max_kv_usage {} must be above 0 and at most 1 (0.95: full at 95% of the KV cache)",
                v.value
            ),
        );
        DEFAULT_MAX_KV_USAGE
    }

    /// Longer than `interval` (else every value ages out before the next
    /// scrape), at most [`MAX_LOAD_MAX_AGE`].
    fn max_age(&mut self, raw: Option<Spanned<HumanDuration>>, interval: Duration) -> Duration {
        let default = interval * DEFAULT_LOAD_MAX_AGE_INTERVALS;
        let Some(d) = raw else {
            return default;
        };
        if d.value.0 <= interval {
            self.err(
                &d.referenced,
                format!(
                    "health.load.max_age ({}) must be longer than health.load.interval ({}), or every value ages out before the next scrape",
                    humantime::format_duration(d.value.0),
                    humantime::format_duration(interval)
                ),
            );
            return default;
        }
        self.at_most(&d, "health.load.max_age", MAX_LOAD_MAX_AGE)
            .unwrap_or(default)
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`, the text format's metric names.
fn is_metric_name(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::LoadPreset;
    use crate::config::test_util::{parse, problems};

    const BACKENDS: &str = "backends:\n  - {name: a, addr: 127.0.0.1:8001}\n";

    fn with_load(load: &str) -> String {
        format!("listen: 127.0.0.1:7000\nhealth:\n  load: {load}\n{BACKENDS}")
    }

    #[test]
    fn presets_fill_the_gauges_and_defaults_apply() {
        let config = parse(&with_load("{preset: vllm}")).unwrap();
        let load = config.health.unwrap().load.unwrap();
        assert_eq!(load.preset, LoadPreset::Vllm);
        assert_eq!(load.path, "/metrics");
        assert_eq!(load.interval, Duration::from_secs(1));
        assert_eq!(load.timeout, Duration::from_millis(500));
        assert_eq!(
            load.gauges.waiting.as_deref(),
            Some("vllm:num_requests_waiting")
        );
        // No bound on waiting unless one is written: a queue's length in
        // requests is sized to an engine's batch, and placement weighs load.
        assert_eq!(load.limits.max_waiting, None);
        assert_eq!(load.limits.max_kv_usage, 0.95);
        assert_eq!(load.limits.max_age, Duration::from_secs(5));

        let text = with_load(
            "{preset: sglang, kv_usage: \"sglang:cache_hit_rate\", interval: 2s, max_waiting: 0}",
        );
        let load = parse(&text).unwrap().health.unwrap().load.unwrap();
        assert_eq!(
            load.gauges.waiting.as_deref(),
            Some("sglang:num_queue_reqs")
        );
        assert_eq!(
            load.gauges.kv_usage.as_deref(),
            Some("sglang:cache_hit_rate")
        );
        assert_eq!(load.limits.max_age, Duration::from_secs(10));
        assert_eq!(load.limits.max_waiting, Some(0));
        assert_eq!(
            load.gauges.kv_capacity.as_deref(),
            Some("sglang:max_total_num_tokens")
        );
        let text = with_load("{preset: vllm, kv_capacity: \"kv:tokens\"}");
        let load = parse(&text).unwrap().health.unwrap().load.unwrap();
        assert_eq!(load.gauges.kv_capacity.as_deref(), Some("kv:tokens"));
        assert!(
            problems(&with_load("{preset: vllm, kv_capacity: \"a b\"}"))
                .iter()
                .any(|e| e
                    .contains("health.load.kv_capacity \"a b\" is not a Prometheus metric name"))
        );
    }

    #[test]
    fn the_llamacpp_preset_reads_its_queue_and_no_kv_cache() {
        let text = with_load("{preset: llamacpp}");
        let load = parse(&text).unwrap().health.unwrap().load.unwrap();
        assert_eq!(load.preset, LoadPreset::Llamacpp);
        let gauges = &load.gauges;
        assert_eq!(
            gauges.waiting.as_deref(),
            Some("llamacpp:requests_deferred")
        );
        assert_eq!(
            gauges.running.as_deref(),
            Some("llamacpp:requests_processing")
        );
        assert_eq!(
            (gauges.kv_usage.as_deref(), gauges.kv_capacity.as_deref()),
            (None, None)
        );
        // Its requests wait only for a slot, so its slots can be learned;
        // not from another waiting gauge, nor from vLLM's.
        assert!(gauges.waits_for_a_slot);
        assert_eq!(gauges.slots_path.as_deref(), Some("/props"));
        let text = with_load("{preset: llamacpp, waiting: my_queue}");
        let load = parse(&text).unwrap().health.unwrap().load.unwrap();
        assert!(!load.gauges.waits_for_a_slot);
        assert!(!LoadPreset::Vllm.gauges().waits_for_a_slot);
    }

    #[test]
    fn every_bound_is_enforced_with_its_place() {
        let text = with_load(
            "{interval: 50ms, waiting: \"9bad\", max_kv_usage: 1.5, max_waiting: 2000000, path: metrics}",
        );
        let p = problems(&text);
        for needle in [
            "interval must be at least 100ms",
            "\"9bad\" is not a Prometheus metric name",
            "max_kv_usage 1.5 must be above 0",
            "max_waiting 2000000 is too large",
            "\"metrics\" is not a request path",
        ] {
            assert!(p.iter().any(|e| e.contains(needle)), "{needle}: {p:?}");
        }
        assert!(p.iter().all(|e| e.starts_with("test.yaml:3:")), "{p:?}");

        let p = problems(&with_load(
            "{preset: vllm, interval: 1s, timeout: 1s, max_age: 1s}",
        ));
        assert!(
            p.iter().any(|e| e.contains("timeout (1s) must be shorter")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|e| e.contains("max_age (1s) must be longer")),
            "{p:?}"
        );
        let p = problems(&with_load("{preset: vllm, interval: 10m, max_age: 2h}"));
        assert!(
            p.iter().any(|e| e.contains("interval 10m is too long")),
            "{p:?}"
        );
        let p = problems(&with_load("{preset: none, running: r}"));
        assert!(p.iter().any(|e| e.contains("needs a preset")), "{p:?}");
        let p = problems(&with_load("{preset: vllm, max_kv_usage: 0}"));
        assert!(p.iter().any(|e| e.contains("must be above 0")), "{p:?}");
        let p = problems(&with_load("{preset: tgi}"));
        assert!(!p.is_empty());
    }
}
