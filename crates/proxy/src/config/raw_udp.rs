//! The sections `mode: udp` adds, as YAML says them: `udp` and
//! `health.datagram`.
//!
//! Part of the parse step ([`raw`](super::raw)); their bounds and whether
//! they fit the mode are [`validate`](super::validate)'s.

use serde::Deserialize;
use serde_saphyr::Spanned;

/// `udp` (mode udp): how flows end.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUdp {
    #[serde(default)]
    pub(super) responses: Option<Spanned<u64>>,
}

/// `health.datagram` (mode udp): a probe datagram and the start of the
/// answer it expects, both in hex.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDatagram {
    pub(super) send: Spanned<String>,
    #[serde(default)]
    pub(super) expect: Option<Spanned<String>>,
}
