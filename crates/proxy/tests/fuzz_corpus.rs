//! The fuzz corpora (`fuzz/corpus/<target>/`) replayed through the same entry
//! points and assertions as the libFuzzer targets in `fuzz/fuzz_targets/`, on
//! stable Rust: an input that once found new code paths must still pass the
//! target's checks. No network: config text is parsed offline.

use std::path::{Path, PathBuf};

use magpie_proxy::config::LoadPreset;
use magpie_proxy::intake::proxy_protocol::{parse, signature};
use magpie_proxy::routing::health::exposition;

/// The `head_scan` target's check, from the file the target includes too.
mod head_scan {
    include!("../fuzz/head_scan_check.rs");
}

/// The `config` target's check, from the file the target includes too.
mod config {
    include!("../fuzz/config_check.rs");
}

/// Every file in `fuzz/corpus/<target>/`, with its bytes; never empty.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    let mut inputs = Vec::new();
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_file() {
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            inputs.push((path, bytes));
        }
    }
    assert!(!inputs.is_empty(), "{} has no inputs", dir.display());
    inputs
}

#[test]
fn config_corpus_is_placed_or_accepted_alike() {
    for (_, bytes) in corpus("config") {
        config::check(&bytes);
    }
}

#[test]
fn exposition_corpus_reads_only_finite_values() {
    for (path, bytes) in corpus("exposition") {
        let sample = exposition::read(&bytes, &LoadPreset::Vllm.gauges());
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
