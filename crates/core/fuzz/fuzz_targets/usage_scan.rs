#![no_main]

use libfuzzer_sys::fuzz_target;

mod check {
    include!("../usage_scan_check.rs");
}

// A response body, scanned for usage as JSON and as an event stream, whole
// and in frames; the check is shared with the corpus replay test.
fuzz_target!(|data: &[u8]| {
    check::check(data);
});
