//! The `health.load` section's validated types: where an engine's own
//! Prometheus text is read, which gauges say how loaded it is, and the
//! limits past which it takes no new keys.
//!
//! Validation ([`super::validate`]) fills these in from the raw section;
//! the scraper ([`crate::routing::health::engine_scrape`]) reads the names and the schedule,
//! and routing reads the [`LoadLimits`] through [`Config::load_limits`].

use std::time::Duration;

use serde::Deserialize;

use super::Config;

/// Which engine's gauge names `health.load` starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadPreset {
    /// vLLM's `vllm:` gauges.
    Vllm,
    /// SGLang's `sglang:` gauges.
    Sglang,
    /// llama.cpp's `llama-server --metrics` gauges: its queue, no KV cache.
    Llamacpp,
    /// No preset: the gauges are named in the section.
    #[default]
    None,
}

impl LoadPreset {
    pub fn as_str(self) -> &'static str {
        match self {
            LoadPreset::Vllm => "vllm",
            LoadPreset::Sglang => "sglang",
            LoadPreset::Llamacpp => "llamacpp",
            LoadPreset::None => "none",
        }
    }

    /// The preset's gauge names: waiting, running, KV cache usage, KV
    /// cache capacity. `llama-server` reports its requests deferred (no
    /// slot free) and processing, and nothing of its KV cache's use or size.
    pub fn gauges(self) -> Gauges {
        let names = match self {
            LoadPreset::Llamacpp => {
                return Gauges {
                    waiting: Some("llamacpp:requests_deferred".to_string()),
                    running: Some("llamacpp:requests_processing".to_string()),
                    kv_usage: None,
                    kv_capacity: None,
                    waits_for_a_slot: true,
                    slots_path: Some("/props".to_string()),
                };
            }
            LoadPreset::Vllm => [
                "vllm:num_requests_waiting",
                "vllm:num_requests_running",
                "vllm:kv_cache_usage_perc",
                "vllm:cache_config_info",
            ],
            LoadPreset::Sglang => [
                "sglang:num_queue_reqs",
                "sglang:num_running_reqs",
                "sglang:token_usage",
                "sglang:max_total_num_tokens",
            ],
            LoadPreset::None => return Gauges::default(),
        };
        let [waiting, running, kv_usage, kv_capacity] = names.map(|n| Some(n.to_string()));
        Gauges {
            waiting,
            running,
            kv_usage,
            kv_capacity,
            waits_for_a_slot: false,
            slots_path: None,
        }
    }
}

/// The gauges read from an engine's metrics; `None`: not read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Gauges {
    /// Requests queued, not yet scheduled (summed over series).
    pub waiting: Option<String>,
    /// Requests being generated (summed over series); shown, never a limit.
    pub running: Option<String>,
    /// The KV cache's used fraction, 0 to 1 (the largest series).
    pub kv_usage: Option<String>,
    /// The KV cache's size in tokens (summed over series): a series'
    /// labels `num_gpu_blocks` × `block_size` where it has them (vLLM's
    /// `cache_config_info`), else its value. Shown; never a limit.
    pub kv_capacity: Option<String>,
    /// Whether a request waits only while every one of the engine's slots
    /// is taken (`llama-server`'s deferred requests): then the running
    /// gauge of a scrape that found one waiting is its slot count. vLLM's
    /// and SGLang's waiting requests are those their scheduler left for a
    /// later step, which says nothing of their batch's size.
    pub waits_for_a_slot: bool,
    /// Where the engine tells its slots: a JSON object whose `total_slots`
    /// they are (`llama-server`'s `GET /props`), asked while not known.
    pub slots_path: Option<String>,
}

/// When a backend is full for new keys, and how long a value counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadLimits {
    /// More requests waiting than this: full for new keys (`None`: waiting
    /// never makes it full; placement weighs the load magpie sends).
    pub max_waiting: Option<u64>,
    /// A KV cache fuller than this (0 < x <= 1): full for new keys.
    pub max_kv_usage: f64,
    /// A value older than this is ignored.
    pub max_age: Duration,
}

/// `health.load`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadConfig {
    pub preset: LoadPreset,
    /// The request path of the engine's metrics (`/metrics`).
    pub path: String,
    /// Time between scrapes of each backend.
    pub interval: Duration,
    /// A scrape's deadline, shorter than `interval`.
    pub timeout: Duration,
    pub gauges: Gauges,
    pub limits: LoadLimits,
}

impl Config {
    /// The engine load limits in force, if `health.load` is set.
    pub fn load_limits(&self) -> Option<&LoadLimits> {
        self.health
            .as_ref()
            .and_then(|h| h.load.as_ref())
            .map(|l| &l.limits)
    }
}
