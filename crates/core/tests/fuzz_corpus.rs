//! The fuzz corpora (`fuzz/corpus/<target>/`) replayed through the same entry
//! points and assertions as the libFuzzer targets in `fuzz/fuzz_targets/`, on
//! stable Rust: an input that once found new code paths must still pass the
//! target's checks.

use magpie_core::key::group::{GroupBy, body_group_key};
use magpie_core::key::json::{FieldPath, json_field_key};

/// The `json_field` target's check of bodies read a part at a time.
mod json_prefix {
    include!("../fuzz/json_prefix_check.rs");
}

/// The `usage_scan` target's check, from the file the target includes too.
mod usage_scan {
    include!("../fuzz/usage_scan_check.rs");
}

/// The `sni` target's check, from the file the target includes too.
mod sni {
    include!("../fuzz/sni_check.rs");
}

/// Every file in `fuzz/corpus/<target>/`, with its bytes; never empty.
mod files {
    include!("../fuzz/corpus_files.rs");
}
use files::corpus;

#[test]
fn json_field_corpus_is_keyed_or_falls_back() {
    // The paths the fuzz target searches, from the file it reads too.
    let paths: Vec<FieldPath> = include_str!("../fuzz/json_paths.txt")
        .lines()
        .map(|p| FieldPath::parse(p).expect("a valid path"))
        .collect();
    assert!(!paths.is_empty());
    for (_, bytes) in corpus("json_field") {
        for path in &paths {
            let _ = json_field_key(&bytes, path);
            json_prefix::check(&bytes, path);
        }
        let _ = magpie_core::key::conversation::conversation_key(&bytes);
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
