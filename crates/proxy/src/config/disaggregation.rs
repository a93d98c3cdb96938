//! `disaggregation` (mode http): prefill and decode on separate pools.
//!
//! Each backend plays a [`Role`]: `prefill`, `decode` or `both` (the
//! default, and what every backend found through DNS plays). A request's
//! prefill half goes to a backend that prefills, its decode half to one
//! that decodes, by the [`Protocol`] the engines speak. The section as
//! YAML says it ([`RawDisaggregation`]) and as magpie runs it
//! ([`DisaggregationConfig`]); bounds are checked by `validate`.

use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::duration::HumanDuration;

/// What a backend does for a disaggregated request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Either half, or a whole request.
    #[default]
    Both,
    /// Prefill halves only: the pool that computes a prompt's KV.
    Prefill,
    /// Decode halves (and whole requests): the pool the conversation is
    /// pinned to.
    Decode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }

    /// It takes decode halves: it is in the table requests are keyed to.
    pub fn decodes(self) -> bool {
        self != Role::Prefill
    }

    /// It takes prefill halves.
    pub fn prefills(self) -> bool {
        self != Role::Decode
    }
}

/// How the two halves find each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// vLLM's (NIXL and Mooncake connectors): the prefill half first, with
    /// `kv_transfer_params: {do_remote_decode: true}`; its answer's
    /// `kv_transfer_params` go with the decode half.
    Vllm,
    /// SGLang's: both halves at once, with `bootstrap_host`,
    /// `bootstrap_port` and `bootstrap_room` naming the prefill engine.
    Sglang,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Vllm => "vllm",
            Protocol::Sglang => "sglang",
        }
    }
}

/// `disaggregation.skip_below_tokens` when not written.
pub const DEFAULT_SKIP_BELOW_TOKENS: u64 = 256;
/// The largest `disaggregation.skip_below_tokens`.
pub const MAX_SKIP_BELOW_TOKENS: u64 = 1_000_000;
/// `disaggregation.prefill_timeout` when not written.
pub const DEFAULT_PREFILL_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest `disaggregation.prefill_timeout`.
pub const MAX_PREFILL_TIMEOUT: Duration = Duration::from_secs(600);

/// The `disaggregation` section, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DisaggregationConfig {
    pub protocol: Protocol,
    /// A request whose decode backend is estimated to lack fewer of its
    /// prompt's tokens than this goes to that backend alone, which
    /// prefills them itself (0: every request is split).
    pub skip_below_tokens: u64,
    /// How long a prefill half may take, connect to answer, before its
    /// request is prefilled elsewhere.
    pub prefill_timeout: Duration,
}

/// `disaggregation`, as YAML says it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDisaggregation {
    pub(super) protocol: Spanned<Protocol>,
    #[serde(default)]
    pub(super) skip_below_tokens: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) prefill_timeout: Option<Spanned<HumanDuration>>,
}
