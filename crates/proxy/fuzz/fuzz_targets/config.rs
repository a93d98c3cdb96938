#![no_main]

use libfuzzer_sys::fuzz_target;

mod check {
    include!("../config_check.rs");
}

// YAML text through parsing and validation, without DNS.
fuzz_target!(|data: &[u8]| check::check(data));
