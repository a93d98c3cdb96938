#![no_main]

use libfuzzer_sys::fuzz_target;

mod check {
    include!("../head_scan_check.rs");
}

// The first bytes of a TCP connection, scanned for an HTTP/1.x header key.
fuzz_target!(|data: &[u8]| check::check(data));
