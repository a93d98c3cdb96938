//! Header-field rules both wire formats apply: which fields describe one
//! hop and are never passed on (RFC 9110 §7.6.1), the field that names the
//! backend, and which answers are read for their usage.

use magpie_core::usage::UsageScanner;

/// The header that names the backend in an answer, when
/// `http.expose_backend` is on (one the backend sent is replaced).
pub(crate) const BACKEND_HEADER: &str = "x-magpie-backend";

/// Hop-by-hop fields: never passed on, and neither are the fields the
/// `Connection` field names. `transfer-encoding` comes last: hyper frames
/// bodies itself, while the pass-through passes a body in the coding it
/// came in, and keeps that field with it ([`HOP_BY_HOP_BUT_FRAMING`]).
pub(crate) const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "transfer-encoding",
];

/// [`HOP_BY_HOP`] but `transfer-encoding`, for a body passed on in its own
/// framing.
pub(crate) const HOP_BY_HOP_BUT_FRAMING: &[&str] = HOP_BY_HOP.split_last().expect("not empty").1;

/// The reader of an answer's `usage`: only a successful, uncompressed JSON
/// or event-stream answer reports usage worth reading.
pub(crate) fn usage_reader(
    status: u16,
    encoded: bool,
    content_type: Option<&str>,
) -> Option<UsageScanner> {
    ((200..300).contains(&status) && !encoded)
        .then(|| UsageScanner::for_content_type(content_type))
        .flatten()
}
