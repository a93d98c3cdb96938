#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use magpie::config::Config;

// YAML text through parsing and validation, without DNS; an error must render.
fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Err(e) = Config::parse_offline(Path::new("fuzz.yaml"), text)
    {
        let _ = e.to_string();
    }
});
