#![no_main]

use libfuzzer_sys::fuzz_target;
use magpie::tcp::header_key::scan_head;

// The first bytes of a TCP connection, scanned for an HTTP/1.x header key.
fuzz_target!(|data: &[u8]| {
    let _ = scan_head(data, "x-session-id");
});
