//! The fuzz corpora (`fuzz/corpus/<target>/`) replayed through the same entry
//! points and assertions as the libFuzzer targets in `fuzz/fuzz_targets/`, on
//! stable Rust: an input that once found new code paths must still go through
//! without a panic. No network: config text is parsed offline.

use std::path::{Path, PathBuf};

use magpie::config::LoadPreset;
use magpie::health::exposition;
use magpie::key::group::{GroupBy, body_group_key};
use magpie::key::json::{FieldPath, json_field_key};
use magpie::proxy_protocol::{parse, signature};

/// The `json_field` target's check of bodies read a part at a time.
mod json_prefix {
    include!("../../fuzz/json_prefix_check.rs");
}

/// The `usage_scan` target's check, from the file the target includes too.
mod usage_scan {
    include!("../../fuzz/usage_scan_check.rs");
}

/// The `sni` target's check, from the file the target includes too.
mod sni {
    include!("../../fuzz/sni_check.rs");
}

/// The `head_scan` target's check, from the file the target includes too.
mod head_scan {
    include!("../../fuzz/head_scan_check.rs");
}

/// The `config` target's check, from the file the target includes too.
mod config {
    include!("../../fuzz/config_check.rs");
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

#[test]
fn json_field_corpus_is_keyed_or_falls_back() {
    // The paths the fuzz target searches, from the file it reads too.
    let paths: Vec<FieldPath> = include_str!("../../fuzz/json_paths.txt")
        .lines()
        .map(|p| FieldPath::parse(p).expect("a valid path"))
        .collect();
    assert!(!paths.is_empty());
    for (_, bytes) in corpus("json_field") {
        for path in &paths {
            let _ = json_field_key(&bytes, path);
            json_prefix::check(&bytes, path);
        }
        let _ = magpie::key::conversation::conversation_key(&bytes);
        for by in [GroupBy::System, GroupBy::PrefixBytes(16)] {
            let _ = body_group_key(&bytes, &by);
        }
    }
}

#[test]
fn usage_scan_corpus_agrees_however_framed() {
    for (_, bytes) in corpus("usage_scan") {
        usage_scan::check(&bytes);
    }
}

#[test]
fn sni_corpus_agrees_however_split() {
    for (_, bytes) in corpus("sni") {
        sni::check(&bytes);
    }
}
