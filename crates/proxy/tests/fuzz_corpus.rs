//! The fuzz corpora (`fuzz/corpus/<target>/`) replayed through the same entry
//! points and assertions as the libFuzzer targets in `fuzz/fuzz_targets/`, on
//! stable Rust: an input that once found new code paths must still pass the
//! target's checks. No network: config text is parsed offline.

use magpie_proxy::config::LoadPreset;
use magpie_proxy::parsers::{engine_load, parse, signature};

/// The `head_scan` target's check, from the file the target includes too.
mod head_scan {
    include!("../fuzz/head_scan_check.rs");
}

/// The `config` target's check, from the file the target includes too.
mod config {
    include!("../fuzz/config_check.rs");
}

/// Every file in `fuzz/corpus/<target>/`, with its bytes; never empty (the
/// reader the core crate's replay test uses too).
mod files {
    include!("../../core/fuzz/corpus_files.rs");
}
use files::corpus;

#[test]
fn config_corpus_is_placed_or_accepted_alike() {
    for (_, bytes) in corpus("config") {
        config::check(&bytes);
    }
}

#[test]
fn exposition_corpus_reads_only_finite_values() {
    for (path, bytes) in corpus("exposition") {
        let sample = engine_load(&bytes, &LoadPreset::Vllm.gauges());
        for v in [sample.waiting, sample.running, sample.kv_usage]
            .into_iter()
            .flatten()
        {
            assert!(v.is_finite() && v >= 0.0, "{}: {v}", path.display());
        }
    }
}

#[test]
fn head_scan_corpus_agrees_with_its_lines_and_prefixes() {
    for (_, bytes) in corpus("head_scan") {
        head_scan::check(&bytes);
    }
}

#[test]
fn proxy_protocol_corpus_parses_within_its_input() {
    for (path, bytes) in corpus("proxy_protocol") {
        let _ = signature(&bytes);
        if let Ok(Some(p)) = parse(&bytes) {
            assert!(
                p.length <= bytes.len(),
                "{}: header length {} > input {}",
                path.display(),
                p.length,
                bytes.len()
            );
        }
    }
}
