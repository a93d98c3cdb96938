// The check of the `sni` fuzz target, included (`include!`) by the target
// and by the corpus replay test (tests/integration/fuzz_corpus.rs), so both
// assert the same.
//
// Input: a connection's first bytes. Each is scanned for a ClientHello's
// server name under three limits, whole and resumed after a first part at
// many split points; the answers must agree, and a scan that needs more
// must say so beyond what it was given.

use magpie_core::key::sni::{HelloScan, HelloScanner, scan_client_hello};

/// A limit short inputs reach, a small one, and `key.max_bytes`'s default.
const LIMITS: [usize; 3] = [64, 512, 8192];

pub fn check(data: &[u8]) {
    for limit in LIMITS {
        let whole = scan_client_hello(data, limit);
        let given = data.len().min(limit);
        if let HelloScan::NeedMore(n) = whole {
            assert!(n > given && n <= limit, "limit {limit}: needs {n} of {given}");
        }
        for split in splits(data.len()) {
            let mut scanner = HelloScanner::new(limit);
            let first = scanner.scan(&data[..split]);
            match first {
                HelloScan::NeedMore(n) if n > given => {
                    // Nothing in the rest can be looked at yet.
                    assert_eq!(whole, first, "limit {limit}, split {split}");
                }
                HelloScan::NeedMore(_) => {}
                decided => assert_eq!(decided, whole, "limit {limit}, split {split}"),
            }
            assert_eq!(scanner.scan(data), whole, "limit {limit}, split {split}");
        }
    }
}

/// Every split point of a short input; about 100 spread over a long one,
/// the first 16 among them.
fn splits(len: usize) -> impl Iterator<Item = usize> {
    let step = (len / 100).max(1);
    (0..=len).filter(move |&i| i < 16 || i % step == 0)
}
