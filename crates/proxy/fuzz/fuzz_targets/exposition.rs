#![no_main]

use libfuzzer_sys::fuzz_target;
use magpie_proxy::config::LoadPreset;
use magpie_proxy::parsers::engine_load as read;

// An engine's /metrics answer, read for the vLLM gauges: any bytes go
// through, and whatever is found is a finite, non-negative value.
fuzz_target!(|data: &[u8]| {
    let sample = read(data, &LoadPreset::Vllm.gauges());
    for v in [sample.waiting, sample.running, sample.kv_usage].into_iter().flatten() {
        assert!(v.is_finite() && v >= 0.0);
    }
});
