//! A backend's engine load: what its inference engine last said about its
//! queue and its KV cache, how fresh that is, and whether it is too full
//! to take new keys.
//!
//! The scraper ([`super::engine_scrape`]) writes here after each good scrape and
//! counts every scrape by result; routing reads [`EngineLoad::full_for_new_keys`]
//! and [`EngineLoad::far_over`] on the data path, without a lock (atomics:
//! the three values as `f64` bits, `NaN` for "not reported", and the
//! instant of the last good scrape). A value older than `max_age` is
//! ignored: a backend whose scrapes fail is judged by the table and its
//! health alone, never marked down for it. Like [`super::Health`], the
//! state lives in a backend's live state and survives a reload that keeps
//! the backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::exposition::Sample;
use crate::config::LoadLimits;
use magpie_core::labels;

/// Far over: more than this many times `max_waiting` waiting (at least 1
/// is taken for `max_waiting`). Then even pinned keys move.
pub(crate) const FAR_WAITING_FACTOR: u64 = 4;
/// Far over: a KV cache at least this full (or `max_kv_usage`, if higher).
pub(crate) const FAR_KV_USAGE: f64 = 0.99;

labels! {
    /// What one scrape of an engine's metrics came to.
    pub(crate) enum ScrapeResult {
        Ok => "ok",
        /// No complete answer within `health.load.timeout`.
        Timeout => "timeout",
        /// No connection, or it broke before the answer was complete.
        Connect => "connect",
        /// An answer other than `200`.
        Status => "status",
        /// An answer without any of the gauges.
        Parse => "parse",
        /// An answer larger than the scrape's limit.
        TooLarge => "too_large",
    }
}

/// One backend's engine load.
#[derive(Debug)]
pub(crate) struct EngineLoad {
    /// `updated` counts from here.
    epoch: Instant,
    waiting: AtomicU64,
    running: AtomicU64,
    kv_usage: AtomicU64,
    kv_capacity: AtomicU64,
    slots: AtomicU64,
    /// Nanoseconds from `epoch` to the last good scrape, plus one; 0: never.
    updated: AtomicU64,
    scrapes: [AtomicU64; ScrapeResult::COUNT],
}

impl Default for EngineLoad {
    fn default() -> Self {
        let nothing = || AtomicU64::new(f64::NAN.to_bits());
        EngineLoad {
            epoch: Instant::now(),
            waiting: nothing(),
            running: nothing(),
            kv_usage: nothing(),
            kv_capacity: nothing(),
            slots: nothing(),
            updated: AtomicU64::new(0),
            scrapes: Default::default(),
        }
    }
}

impl EngineLoad {
    /// A good scrape at `now` found `sample` (counted as `ok`).
    pub(crate) fn record(&self, sample: Sample, now: Instant) {
        let bits = |v: Option<f64>| v.unwrap_or(f64::NAN).to_bits();
        self.waiting.store(bits(sample.waiting), Ordering::Relaxed);
        self.running.store(bits(sample.running), Ordering::Relaxed);
        self.kv_usage
            .store(bits(sample.kv_usage), Ordering::Relaxed);
        if sample.kv_capacity.is_some() {
            // A cache's size outlives a scrape that did not say it.
            (self.kv_capacity).store(bits(sample.kv_capacity), Ordering::Relaxed);
        }
        if sample.slots.is_some() {
            // Told by `/props`, or while some request waits; kept until
            // told again.
            (self.slots).store(bits(sample.slots), Ordering::Relaxed);
        }
        let since = now.saturating_duration_since(self.epoch).as_nanos();
        let since = u64::try_from(since).unwrap_or(u64::MAX - 1);
        self.updated.store(since + 1, Ordering::Release);
        self.count(ScrapeResult::Ok);
    }

    /// A scrape ended with `result` (a failure leaves the last value alone).
    pub(crate) fn count(&self, result: ScrapeResult) {
        self.scrapes[result.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn scrapes(&self, result: ScrapeResult) -> u64 {
        self.scrapes[result.index()].load(Ordering::Relaxed)
    }

    /// The last good scrape's values, if it is at most `max_age` old.
    pub(crate) fn fresh(&self, now: Instant, max_age: Duration) -> Option<Sample> {
        let updated = self.updated.load(Ordering::Acquire);
        let at = self.epoch + Duration::from_nanos(updated.checked_sub(1)?);
        if now.saturating_duration_since(at) > max_age {
            return None;
        }
        let read =
            |v: &AtomicU64| Some(f64::from_bits(v.load(Ordering::Relaxed))).filter(|v| !v.is_nan());
        Some(Sample {
            waiting: read(&self.waiting),
            running: read(&self.running),
            kv_usage: read(&self.kv_usage),
            kv_capacity: read(&self.kv_capacity),
            slots: read(&self.slots),
        })
    }

    /// The KV cache's size in tokens, as the engine last said it, however
    /// long ago: a cache does not shrink because a scrape failed.
    pub(crate) fn kv_capacity(&self) -> Option<f64> {
        Some(f64::from_bits(self.kv_capacity.load(Ordering::Relaxed))).filter(|v| !v.is_nan())
    }

    /// The tokens its KV cache keeps of what no running request holds:
    /// its size less the share its running requests hold (vLLM's and
    /// SGLang's usage count only those; a cached block nobody holds is
    /// free to them), both as last said, however long ago. A cache evicts
    /// only there, the least recently used first: what a request left is
    /// pushed out once the engine computed this many tokens since.
    pub(crate) fn kv_room(&self) -> Option<f64> {
        let usage = f64::from_bits(self.kv_usage.load(Ordering::Relaxed));
        let held = if usage.is_nan() {
            0.0
        } else {
            usage.clamp(0.0, 1.0)
        };
        Some(self.kv_capacity()? * (1.0 - held))
    }

    /// [`EngineLoad::kv_room`] while its usage is at most `max_age` old;
    /// `None` after (a backend whose scrapes fail is held to no such bound).
    pub(crate) fn fresh_kv_room(&self, now: Instant, max_age: Duration) -> Option<f64> {
        self.fresh(now, max_age)?;
        self.kv_room()
    }

    /// The engine's slots, as last learned (its `/props`,
    /// [`crate::config::Gauges::slots_path`], or a scrape that found a
    /// request waiting for one, [`crate::config::Gauges::waits_for_a_slot`]),
    /// however long ago.
    pub(crate) fn slots(&self) -> Option<u64> {
        let slots = f64::from_bits(self.slots.load(Ordering::Relaxed));
        (slots.is_finite() && slots >= 1.0).then_some(slots as u64)
    }

    /// Whether the engine is too loaded to take a key it does not hold yet:
    /// a fresh value with more than `max_waiting` requests waiting (where
    /// that is set), or a KV cache fuller than `max_kv_usage`.
    pub(crate) fn full_for_new_keys(&self, limits: &LoadLimits, now: Instant) -> bool {
        self.fresh(now, limits.max_age).is_some_and(|s| {
            (s.waiting.zip(limits.max_waiting)).is_some_and(|(w, max)| w > max as f64)
                || s.kv_usage.is_some_and(|kv| kv > limits.max_kv_usage)
        })
    }

    /// Whether the engine is so loaded that even keys pinned to it move: a
    /// fresh value with more than [`FAR_WAITING_FACTOR`] × `max_waiting`
    /// waiting (where that is set), or a KV cache at least [`FAR_KV_USAGE`]
    /// full.
    pub(crate) fn far_over(&self, limits: &LoadLimits, now: Instant) -> bool {
        let waiting =
            (limits.max_waiting).map(|m| FAR_WAITING_FACTOR.saturating_mul(m.max(1)) as f64);
        let kv_usage = FAR_KV_USAGE.max(limits.max_kv_usage);
        self.fresh(now, limits.max_age).is_some_and(|s| {
            (s.waiting.zip(waiting)).is_some_and(|(w, far)| w > far)
                || s.kv_usage.is_some_and(|kv| kv >= kv_usage)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: LoadLimits = LoadLimits {
        max_waiting: Some(8),
        max_kv_usage: 0.95,
        max_age: Duration::from_secs(5),
    };

    fn sample(waiting: f64, kv_usage: f64) -> Sample {
        Sample {
            waiting: Some(waiting),
            running: Some(1.0),
            kv_usage: Some(kv_usage),
            kv_capacity: None,
            slots: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn full_and_far_over_by_waiting_and_kv_usage() {
        let load = EngineLoad::default();
        let now = Instant::now();
        assert!(!load.full_for_new_keys(&LIMITS, now), "no value yet");
        assert_eq!(load.fresh(now, LIMITS.max_age), None);
        let cases = [
            (8.0, 0.5, false, false),
            (9.0, 0.5, true, false),
            (32.0, 0.5, true, false),
            (33.0, 0.5, true, true),
            (0.0, 0.95, false, false),
            (0.0, 0.96, true, false),
            (0.0, 0.99, true, true),
        ];
        for (waiting, kv, full, far) in cases {
            load.record(sample(waiting, kv), now);
            assert_eq!(load.full_for_new_keys(&LIMITS, now), full, "{waiting} {kv}");
            assert_eq!(load.far_over(&LIMITS, now), far, "{waiting} {kv}");
        }
        assert_eq!(load.scrapes(ScrapeResult::Ok), cases.len() as u64);
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_ages_out_after_max_age_and_failures_keep_it() {
        let load = EngineLoad::default();
        load.record(sample(100.0, 1.0), Instant::now());
        tokio::time::advance(Duration::from_secs(4)).await;
        load.count(ScrapeResult::Timeout);
        assert!(
            load.full_for_new_keys(&LIMITS, Instant::now()),
            "kept through a failure"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            load.far_over(&LIMITS, Instant::now()),
            "exactly max_age old still counts"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        let now = Instant::now();
        assert!(!load.full_for_new_keys(&LIMITS, now));
        assert!(!load.far_over(&LIMITS, now));
        assert_eq!(load.fresh(now, LIMITS.max_age), None);
        assert_eq!(load.scrapes(ScrapeResult::Timeout), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_cache_size_outlives_stale_and_silent_scrapes() {
        let load = EngineLoad::default();
        assert_eq!(load.kv_capacity(), None);
        let with = Sample {
            kv_capacity: Some(32000.0),
            ..sample(0.0, 0.1)
        };
        load.record(with, Instant::now());
        // A later scrape without it, and one too old to count for load.
        load.record(sample(0.0, 0.2), Instant::now());
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(load.fresh(Instant::now(), LIMITS.max_age), None);
        assert_eq!(load.kv_capacity(), Some(32000.0));
    }

    #[tokio::test(start_paused = true)]
    async fn the_room_a_cache_keeps_is_what_running_requests_do_not_hold() {
        let load = EngineLoad::default();
        let now = Instant::now();
        load.record(sample(0.0, 0.25), now);
        assert_eq!(load.kv_room(), None, "no size said yet");
        let with = Sample {
            kv_capacity: Some(32000.0),
            ..sample(0.0, 0.25)
        };
        load.record(with, now);
        assert_eq!(load.kv_room(), Some(24000.0));
        assert_eq!(load.fresh_kv_room(now, LIMITS.max_age), Some(24000.0));
        // No usage said: all of it.
        load.record(Sample::default(), now);
        assert_eq!(load.kv_room(), Some(32000.0));
        load.record(sample(0.0, 1.5), now);
        assert_eq!(load.kv_room(), Some(0.0), "a usage over 1 holds it all");
        // Stale: the gate knows no room; the last usage still tells evictions.
        tokio::time::advance(LIMITS.max_age + Duration::from_millis(1)).await;
        assert_eq!(load.fresh_kv_room(Instant::now(), LIMITS.max_age), None);
        assert_eq!(load.kv_room(), Some(0.0));
    }

    #[tokio::test(start_paused = true)]
    async fn unreported_gauges_never_make_a_backend_full() {
        let load = EngineLoad::default();
        let now = Instant::now();
        load.record(
            Sample {
                running: Some(500.0),
                ..Sample::default()
            },
            now,
        );
        let fresh = load.fresh(now, LIMITS.max_age).unwrap();
        assert_eq!(
            (fresh.waiting, fresh.running, fresh.kv_usage),
            (None, Some(500.0), None)
        );
        assert!(!load.full_for_new_keys(&LIMITS, now));
        // max_waiting 0: anything waiting is full, more than 4 far over.
        let zero = LoadLimits {
            max_waiting: Some(0),
            ..LIMITS
        };
        load.record(sample(1.0, 0.0), now);
        assert!(load.full_for_new_keys(&zero, now) && !load.far_over(&zero, now));
        load.record(sample(5.0, 0.0), now);
        assert!(load.far_over(&zero, now));
        // No max_waiting: however many wait, only the KV cache fills it.
        let unbounded = LoadLimits {
            max_waiting: None,
            ..LIMITS
        };
        load.record(sample(1_000.0, 0.5), now);
        assert!(!load.full_for_new_keys(&unbounded, now) && !load.far_over(&unbounded, now));
        load.record(sample(1_000.0, 0.96), now);
        assert!(load.full_for_new_keys(&unbounded, now) && !load.far_over(&unbounded, now));
        load.record(sample(0.0, 0.99), now);
        assert!(load.far_over(&unbounded, now));
    }
}
