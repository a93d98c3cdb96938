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
}

impl Sample {
    /// Whether no wanted gauge was found.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_none() && self.running.is_none() && self.kv_usage.is_none()
    }
}

/// The wanted gauges of `text`, combined over their series.
pub fn read(text: &[u8], gauges: &Gauges) -> Sample {
    let wanted =
        |name: &Option<String>, line: &[u8]| name.as_deref().is_some_and(|n| n.as_bytes() == line);
    let mut sample = Sample::default();
    for line in text.split(|&b| b == b'\n') {
        let Some((name, value)) = sample_line(line) else {
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
    }
    sample
}

/// A sample line's metric name and value: `name{labels} value [timestamp]`.
/// `None` for comments, blank lines and anything malformed.
fn sample_line(line: &[u8]) -> Option<(&[u8], f64)> {
    let line = line.trim_ascii();
    let name_len = line
        .iter()
        .position(|&b| !is_name_byte(b))
        .unwrap_or(line.len());
    if name_len == 0 || line[0].is_ascii_digit() {
        return None;
    }
    let (name, mut rest) = line.split_at(name_len);
    if rest.first() == Some(&b'{') {
        rest = &rest[labels_end(rest)?..];
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
    Some((name, value))
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
sglang:token_usage{model_name=\"qwen\",tp_rank=\"0\"} 0.25\r\n";

    #[test]
    fn vllm_gauges_are_summed_and_maxed_over_series() {
        let s = read(VLLM.as_bytes(), &LoadPreset::Vllm.gauges());
        assert_eq!(s.waiting, Some(9.0));
        assert_eq!(s.running, Some(15.0));
        assert_eq!(s.kv_usage, Some(0.62));
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
        );
        let s = read(text.as_bytes(), &gauges);
        assert_eq!(s.waiting, Some(5.0));
        assert_eq!(s.running, Some(4.0));
        assert_eq!(s.kv_usage, Some(0.5));
        assert_eq!(sample_line(b"1abc 3"), None);
        assert_eq!(sample_line(b"a 3 "), Some((&b"a"[..], 3.0)));
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
