// The json_field target's check of a body read a part at a time, shared
// with the corpus replay test (`include!`d by both): whatever first part of
// a body the HTTP path has read when it looks for the key, a key it settles
// on early is the key the whole body gives.
use magpie_core::key::json::{FieldPath, Prefix, json_field_key, json_field_prefix};

/// Checks every cut of `body` (or 64 spread over a long one) at `path`.
pub fn check(body: &[u8], path: &FieldPath) {
    let whole = json_field_key(body, path);
    let cuts: Vec<usize> = if body.len() <= 512 {
        (0..=body.len()).collect()
    } else {
        (0..=64).map(|i| body.len() * i / 64).collect()
    };
    for cut in cuts {
        match json_field_prefix(&body[..cut], path) {
            // A valid body whose key is known early: the same key.
            Prefix::Known(early) if whole != Err(magpie_core::key::FallbackReason::NotJson) => {
                assert_eq!(early, whole, "cut at {cut} of {} bytes", body.len())
            }
            // Not JSON so far: the whole body is not JSON either.
            Prefix::NotJson => assert_eq!(
                whole,
                Err(magpie_core::key::FallbackReason::NotJson),
                "cut at {cut} of {} bytes",
                body.len()
            ),
            _ => {}
        }
    }
}
