#![no_main]

use libfuzzer_sys::fuzz_target;

mod check {
    include!("../sni_check.rs");
}

// The first bytes of a `mode: tcp` connection keyed by `key.from: sni`,
// scanned for a ClientHello's server name whole and resumed after a first
// part; the check is shared with the corpus replay test.
fuzz_target!(|data: &[u8]| {
    check::check(data);
});
