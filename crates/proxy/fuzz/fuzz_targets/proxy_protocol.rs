#![no_main]

use libfuzzer_sys::fuzz_target;
use magpie_proxy::parsers::{parse, signature};

// The first bytes from a trusted peer, read as a PROXY v1/v2 header.
fuzz_target!(|data: &[u8]| {
    let _ = signature(data);
    if let Ok(Some(p)) = parse(data) {
        assert!(p.length <= data.len(), "{} > {}", p.length, data.len());
    }
});
