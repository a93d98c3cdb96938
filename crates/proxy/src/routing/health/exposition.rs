//! The few gauges engine load needs, read out of a Prometheus text
//! exposition (an engine's `/metrics`).
//!
//! Pure and bounded: one pass over the bytes, no allocation per line, every
//! line looked at once; any bytes are accepted (a line that is not a sample
//! of a wanted gauge is skipped), so a backend can send garbage and get
//! nothing but "no gauges found". Names may hold colons (`vllm:...`), label
//! values may hold `}`, `"` and `\` (escaped), comments and blank lines are
//! skipped, and a timestamp after the value is ignored.
//!
//! A gauge with several series (one per model, or per engine of a data
//! parallel server) is summed for request counts and maxed for the KV
//! cache's used fraction: two engines each 60% full are not 120% full.
//! The KV cache's capacity is summed too (each engine its own cache); a
//! series whose labels say `num_gpu_blocks` and `block_size` (vLLM's
//! `cache_config_info`, an info metric whose value is 1) counts their
//! product in tokens, any other its value.
//! `NaN`, infinities and negative values are ignored: they say nothing
//! about a queue.

use crate::config::Gauges;

/// What one scrape found; `None`: the gauge was not read or not found.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// Requests waiting, summed over series.
    pub waiting: Option<f64>,
    /// Requests running, summed over series.
    pub running: Option<f64>,
    /// The KV cache's used fraction, the largest series.
    pub kv_usage: Option<f64>,
    /// The KV cache's size in tokens, summed over series.
    pub kv_capacity: Option<f64>,
    /// The engine's slots: its running requests, when some wait and its
    /// requests wait only for a slot ([`Gauges::waits_for_a_slot`]); or
    /// what its `/props` told ([`Gauges::slots_path`], set by the scrape).
    pub slots: Option<f64>,
}

impl Sample {
    /// Whether no wanted gauge was found.
    pub(crate) fn is_empty(&self) -> bool {
        self.waiting.is_none()
            && self.running.is_none()
            && self.kv_usage.is_none()
            && self.kv_capacity.is_none()
    }

    /// The sample, with its slots where `gauges` tell them.
    fn with_slots(self, gauges: &Gauges) -> Sample {
        let waiting = self.waiting.is_some_and(|w| w > 0.0);
        let slots = (self.running).filter(|r| gauges.waits_for_a_slot && waiting && *r > 0.0);
        Sample { slots, ..self }
    }
}

/// The wanted gauges of `text`, combined over their series.
pub fn read(text: &[u8], gauges: &Gauges) -> Sample {
    let wanted =
        |name: &Option<String>, line: &[u8]| name.as_deref().is_some_and(|n| n.as_bytes() == line);
    let mut sample = Sample::default();
    for line in text.split(|&b| b == b'\n') {
        let Some((name, labels, value)) = sample_line(line) else {
            continue;
        };
        if !value.is_finite() || value < 0.0 {
            continue;
        }
        if wanted(&gauges.waiting, name) {
            *sample.waiting.get_or_insert(0.0) += value;
        }
        if wanted(&gauges.running, name) {
            *sample.running.get_or_insert(0.0) += value;
        }
        if wanted(&gauges.kv_usage, name) {
            let kv = sample.kv_usage.get_or_insert(value);
            *kv = kv.max(value);
        }
        if wanted(&gauges.kv_capacity, name) {
            let blocks = label_number(labels, b"num_gpu_blocks");
            let tokens = match (blocks, label_number(labels, b"block_size")) {
                (Some(blocks), Some(size)) => blocks * size,
                _ => value,
            };
            if tokens.is_finite() {
                *sample.kv_capacity.get_or_insert(0.0) += tokens;
            }
        }
    }
    sample.with_slots(gauges)
}

/// The number a label of `labels` (`{a="1",b="2"}`) holds, if it has it.
fn label_number(labels: &[u8], name: &[u8]) -> Option<f64> {
    let mut rest = labels.strip_prefix(b"{")?;
    loop {
        let eq = rest.iter().position(|&b| b == b'=')?;
        let key = rest[..eq].trim_ascii();
        let quoted = rest[eq + 1..].trim_ascii_start().strip_prefix(b"\"")?;
        let close = quoted.iter().position(|&b| b == b'"' || b == b'\\')?;
        if key == name {
            let value = std::str::from_utf8(&quoted[..close]).ok()?;
            return value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0);
        }
        // Past this value (skipping escapes) and the comma after it.
        let end = labels_end_of_value(quoted)?;
        rest = quoted[end..].trim_ascii_start();
        rest = rest.strip_prefix(b",").unwrap_or(rest);
        if rest.first().is_none_or(|&b| b == b'}') {
            return None;
        }
    }
}

/// The index just past the `"` closing a quoted value (its opening quote
/// already taken off).
fn labels_end_of_value(quoted: &[u8]) -> Option<usize> {
    let mut escaped = false;
    for (i, &b) in quoted.iter().enumerate() {
        match (escaped, b) {
            (true, _) => escaped = false,
            (false, b'\\') => escaped = true,
            (false, b'"') => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// A sample line's metric name, label set (`{...}`, or empty) and value:
/// `name{labels} value [timestamp]`. `None` for comments, blank lines and
/// anything malformed.
fn sample_line(line: &[u8]) -> Option<(&[u8], &[u8], f64)> {
    let line = line.trim_ascii();
    let name_len = line
        .iter()
        .position(|&b| !is_name_byte(b))
        .unwrap_or(line.len());
    if name_len == 0 || line[0].is_ascii_digit() {
        return None;
    }
    let (name, mut rest) = line.split_at(name_len);
    let mut labels: &[u8] = &[];
    if rest.first() == Some(&b'{') {
        let end = labels_end(rest)?;
        (labels, rest) = rest.split_at(end);
    }
    let rest = rest.trim_ascii_start();
    let end = rest
        .iter()
        .position(|b| b.is_ascii_whitespace())
        .unwrap_or(rest.len());
    let value = std::str::from_utf8(&rest[..end])
        .ok()?
        .parse::<f64>()
        .ok()?;
    Some((name, labels, value))
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

/// The index just past the `}` closing the label set `labels` opens,
/// skipping quoted values (with `\` escapes).
fn labels_end(labels: &[u8]) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, &b) in labels.iter().enumerate().skip(1) {
        match (quoted, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => quoted = false,
            (false, _, b'"') => quoted = true,
            (false, _, b'}') => return Some(i + 1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LoadPreset;

    /// Trimmed from a vLLM 0.10 `/metrics`: two models (engines), histograms
    /// and counters around the gauges.
    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.62
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.41
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="27051",prefix_caching_hash_algo="sha256"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",gpu_memory_utilization="0.9",num_gpu_blocks="27051",prefix_caching_hash_algo="sha256"} 1.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 1422.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} NaN
"#;

    /// Trimmed from an SGLang `/metrics` (with `--enable-metrics`).
    const SGLANG: &str = "# HELP sglang:num_running_reqs The number of running requests.\r\n\
# TYPE sglang:num_running_reqs gauge\r\n\
sglang:num_running_reqs{model_name=\"qwen\",tp_rank=\"0\"} 7.0\r\n\
# TYPE sglang:num_queue_reqs gauge\r\n\
sglang:num_queue_reqs{model_name=\"qwen\",tp_rank=\"0\"} 0.0\r\n\
# TYPE sglang:token_usage gauge\r\n\
sglang:token_usage{model_name=\"qwen\",tp_rank=\"0\"} 0.25\r\n\
# TYPE sglang:max_total_num_tokens gauge\r\n\
sglang:max_total_num_tokens{model_name=\"qwen\",tp_rank=\"0\"} 412000.0\r\n";

    #[test]
    fn vllm_gauges_are_summed_and_maxed_over_series() {
        let s = read(VLLM.as_bytes(), &LoadPreset::Vllm.gauges());
        assert_eq!(s.waiting, Some(9.0));
        assert_eq!(s.running, Some(15.0));
        assert_eq!(s.kv_usage, Some(0.62));
        // Two engines of 27,051 blocks of 16 tokens each.
        assert_eq!(s.kv_capacity, Some(2.0 * 27051.0 * 16.0));
        // vLLM's waiting requests say nothing of its batch's size.
        assert_eq!(s.slots, None);
    }

    #[test]
    fn llama_servers_slots_are_its_processing_while_one_is_deferred() {
        let text = |deferred: u32| {
            format!(
                "# TYPE llamacpp:requests_processing gauge\n\
                 llamacpp:requests_processing 4\n\
                 # TYPE llamacpp:requests_deferred gauge\n\
                 llamacpp:requests_deferred {deferred}\n"
            )
        };
        let preset = LoadPreset::Llamacpp.gauges();
        let s = read(text(2).as_bytes(), &preset);
        assert_eq!(
            (s.waiting, s.running, s.slots),
            (Some(2.0), Some(4.0), Some(4.0))
        );
        assert_eq!(
            read(text(0).as_bytes(), &preset).slots,
            None,
            "none deferred"
        );
        let other = Gauges {
            waits_for_a_slot: false,
            ..preset
        };
        assert_eq!(read(text(2).as_bytes(), &other).slots, None);
    }

    #[test]
    fn sglang_gauges_with_crlf_lines() {
        let s = read(SGLANG.as_bytes(), &LoadPreset::Sglang.gauges());
        assert_eq!(
            s,
            Sample {
                waiting: Some(0.0),
                running: Some(7.0),
                kv_usage: Some(0.25),
                kv_capacity: Some(412000.0),
                slots: None,
            }
        );
        // The other engine's names find nothing.
        assert!(read(SGLANG.as_bytes(), &LoadPreset::Vllm.gauges()).is_empty());
    }

    #[test]
    fn odd_lines_are_read_or_skipped() {
        let gauges = Gauges {
            waiting: Some("w".into()),
            running: Some("r".into()),
            kv_usage: Some("kv".into()),
            kv_capacity: Some("cap".into()),
            waits_for_a_slot: false,
            slots_path: None,
        };
        let text = concat!(
            "w{a=\"x}y\",b=\"q\\\"}\\\\\"} 2 1700000000000\n",
            "  w 3\n",
            "w NaN\n",
            "w +Inf\n",
            "w -1\n",
            "w{unclosed=\"} 100\n",
            "w\n",
            "wx 100\n",
            "# w 100\n",
            "r\t4e0\n",
            "kv{} -Inf\n",
            "kv{} 0.5\n",
            "kv{} Nan\n",
            "\u{0}\u{ff}garbage{{{ 1\n",
            "cap{x=\"a,b=\\\"1\\\"\",num_gpu_blocks=\"10\",block_size=\"4\"} 1\n",
            "cap{num_gpu_blocks=\"x\",block_size=\"4\"} 7\n",
            "cap{block_size=\"4\"} 100\n",
            "cap{num_gpu_blocks=\"-5\",block_size=\"4\"} 1\n",
        );
        let s = read(text.as_bytes(), &gauges);
        assert_eq!(s.waiting, Some(5.0));
        assert_eq!(s.running, Some(4.0));
        assert_eq!(s.kv_usage, Some(0.5));
        // 10 x 4 from the labels (an escaped quote and a comma in an earlier
        // value skipped); then the values of series without both numbers.
        assert_eq!(s.kv_capacity, Some(40.0 + 7.0 + 100.0 + 1.0));
        assert_eq!(sample_line(b"1abc 3"), None);
        assert_eq!(sample_line(b"a 3 "), Some((&b"a"[..], &b""[..], 3.0)));
        assert_eq!(label_number(b"{a=\"2\",b=\"3\"}", b"b"), Some(3.0));
        assert_eq!(label_number(b"{a=\"2\"}", b"b"), None);
        assert_eq!(label_number(b"{a=\"2", b"b"), None);
    }

    #[test]
    fn only_nan_or_absent_is_nothing() {
        let gauges = LoadPreset::Vllm.gauges();
        let s = read(b"vllm:num_requests_waiting NaN\n", &gauges);
        assert!(s.is_empty());
        assert!(read(b"<html>not metrics</html>", &gauges).is_empty());
        assert!(read(b"", &gauges).is_empty());
        let bytes: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        assert!(read(&bytes, &gauges).is_empty());
    }
}
