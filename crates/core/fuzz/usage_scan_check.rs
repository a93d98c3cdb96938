// The check of the `usage_scan` fuzz target, included (`include!`) by the
// target and by the corpus replay test (tests/integration/fuzz_corpus.rs),
// so both assert the same.
//
// Input: a byte choosing the limit, a byte seeding the frame sizes, then
// the body. Each body is scanned in both formats, whole and in frames of
// 0 to 63 bytes; the answers must agree, and the bytes held must never pass
// the limit.

use magpie_core::usage::{BodyFormat, MAX_BUFFER, Usage, UsageScanner};

/// Small limits, so that short inputs reach them, and the real one.
const LIMITS: [usize; 4] = [16, 128, 1024, MAX_BUFFER];

pub fn check(data: &[u8]) {
    let [choice, seed, body @ ..] = data else {
        return;
    };
    let limit = LIMITS[usize::from(choice % 4)];
    for format in [BodyFormat::Json, BodyFormat::EventStream] {
        let whole = scan(UsageScanner::new(format, limit), limit, body, &mut || {
            body.len()
        });
        let mut x = u64::from(*seed) << 8 | u64::from(*choice) | 1 << 20;
        let mut sizes = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 64) as usize
        };
        let framed = scan(UsageScanner::new(format, limit), limit, body, &mut sizes);
        assert_eq!(framed, whole, "{format:?}, limit {limit}");
    }
}

/// `body` fed in frames of the sizes `next` gives; the bytes held checked
/// after each.
fn scan(
    mut scanner: UsageScanner,
    limit: usize,
    body: &[u8],
    next: &mut dyn FnMut() -> usize,
) -> Option<Usage> {
    let mut rest = body;
    while !rest.is_empty() {
        let (frame, after) = rest.split_at(next().min(rest.len()));
        scanner.feed(frame);
        assert!(scanner.held() <= limit, "held {} > {limit}", scanner.held());
        rest = after;
    }
    scanner.finish()
}
