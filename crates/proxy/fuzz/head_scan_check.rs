// The check of the `head_scan` fuzz target, included (`include!`) by the
// target and by the corpus replay test, so both assert the same.
//
// Input: a connection's first bytes, scanned for the header `x-session-id`.
// A key found is the value a plain reading of the head's lines finds (the
// first line naming the header); a prefix of the input scans as incomplete
// or as the whole does (more bytes never change a complete answer).

use magpie_core::key::FallbackReason;
use magpie_core::key::text_key;
use magpie_proxy::parsers::{HeadScan, scan_head};

const HEADER: &str = "x-session-id";

/// The most prefixes of one input scanned (evenly spaced, the head's end
/// among them).
const PREFIXES: usize = 64;

pub fn check(data: &[u8]) {
    let whole = scan_head(data, HEADER);
    if let HeadScan::Found(key) = whole {
        let value = plain_reading(data).expect("a key the scan found is in the head's lines");
        assert_eq!(key, text_key(value), "the key is the header's value");
    }
    if whole == HeadScan::Fallback(FallbackReason::MissingHeader) {
        assert!(
            plain_reading(data).is_none_or(|v| v.trim_ascii().is_empty()),
            "the scan missed a header the lines carry"
        );
    }
    let step = (data.len() / PREFIXES).max(1);
    for cut in (0..data.len()).step_by(step) {
        let prefix = scan_head(&data[..cut], HEADER);
        let agrees = match whole {
            HeadScan::NeedMore => prefix == HeadScan::NeedMore,
            HeadScan::Fallback(FallbackReason::NotHttp) => {
                matches!(prefix, HeadScan::NeedMore | HeadScan::Fallback(FallbackReason::NotHttp))
            }
            complete => prefix == HeadScan::NeedMore || prefix == complete,
        };
        assert!(agrees, "the first {cut} bytes scan as {prefix:?}, the whole as {whole:?}");
    }
}

/// The value of the first header line naming [`HEADER`] in the complete
/// head at the start of `data`, read line by line.
fn plain_reading(data: &[u8]) -> Option<&[u8]> {
    let mut lines = data.split(|&b| b == b'\n').skip(1);
    for line in &mut lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return None;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if line[..colon].eq_ignore_ascii_case(HEADER.as_bytes()) {
            return Some(&line[colon + 1..]);
        }
    }
    None
}
