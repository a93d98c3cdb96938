#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use magpie_core::key::conversation::conversation_key;
use magpie_core::key::group::{GroupBy, body_group_key};
use magpie_core::key::json::{FieldPath, json_field_key};

mod json_prefix {
    include!("../json_prefix_check.rs");
}

// The body_field forms a config can name (a top-level field and JSON
// pointers), one per line; the corpus replay test reads the same file.
static PATHS: LazyLock<Vec<FieldPath>> = LazyLock::new(|| {
    include_str!("../json_paths.txt")
        .lines()
        .map(|p| FieldPath::parse(p).expect("a valid path"))
        .collect()
});

// A request body, searched for the key at each path, for its
// conversation's head (key.from: conversation), and for its group
// (key.group: system, and a prefix of its rendered head); and read a part
// at a time, a key known early must be the whole body's.
fuzz_target!(|data: &[u8]| {
    for path in PATHS.iter() {
        let _ = json_field_key(data, path);
        json_prefix::check(data, path);
    }
    let _ = conversation_key(data);
    for by in [GroupBy::System, GroupBy::PrefixBytes(16)] {
        let _ = body_group_key(data, &by);
    }
});
