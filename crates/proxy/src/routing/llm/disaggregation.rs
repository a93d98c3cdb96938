//! Disaggregated prefill and decode (`disaggregation`): where a request's
//! two halves go, and when it is not split at all.
//!
//! The decode half is the request as the table routes it: pinned by its
//! conversation, so the conversation's later turns find their earlier KV
//! (its answers' included) on their decode backend. The prefill half goes
//! to the prefill pool by the same conversation key, so a conversation's
//! prompts meet their own earlier prefixes there too. And a request whose
//! decode backend already holds all but a few of its prompt's tokens
//! (fewer than `disaggregation.skip_below_tokens`) is not split: that
//! backend prefills the rest itself, and no KV moves.
//!
//! What the decode backend holds is told from the key memory's note
//! ([`super::note`]): the tokens of the conversation's previous prompt and
//! answer there, the rest of this prompt being what it lacks.

use std::sync::Arc;

use crate::routing::backend::Backend;
use crate::routing::key_memory::KeyMemory;
use crate::routing::keys::Keys;
use crate::routing::llm::work::work;
use crate::routing::route::Route;
use crate::routing::snapshot::Snapshot;

/// How a disaggregated request was served, as metrics and the access log
/// count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Split: its prefill half went to the prefill pool.
    Split,
    /// Its decode backend held all but fewer than
    /// `disaggregation.skip_below_tokens` of its prompt: sent there whole.
    DecodeHolds,
    /// Its body was not one JSON object read whole (too large for
    /// `key.max_bytes`, chunked past it, or not JSON): sent whole.
    Unsplittable,
    /// No prefill backend answered (down, full, failed or late): its
    /// decode backend prefilled it.
    PrefillFailed,
}

impl Decision {
    pub(crate) const ALL: [Decision; 4] = [
        Decision::Split,
        Decision::DecodeHolds,
        Decision::Unsplittable,
        Decision::PrefillFailed,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Decision::Split => "split",
            Decision::DecodeHolds => "decode_holds",
            Decision::Unsplittable => "unsplittable",
            Decision::PrefillFailed => "prefill_failed",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// How many prefill backends a request's prefill half is offered to: its
/// own, then one retry on the next.
pub(crate) const PREFILL_TRIES: usize = 2;

/// Where a request keyed `keys`, with a body of `bytes`, whose decode half
/// goes first to `decode`, has its prefill half: the prefill pool's route
/// for its conversation, or `Err` with why it is not split.
pub(crate) fn prefill_route(
    snapshot: &Snapshot,
    memory: &KeyMemory,
    keys: Keys,
    bytes: u64,
    decode: Option<&Arc<Backend>>,
) -> Result<Route, Decision> {
    let (Some(config), Some(prefill)) = (&snapshot.config.disaggregation, &snapshot.prefill)
    else {
        return Err(Decision::Unsplittable);
    };
    let lacking = decode.and_then(|d| lacking_at(memory, keys, bytes, d));
    if lacking.is_some_and(|tokens| tokens < config.skip_below_tokens) {
        return Err(Decision::DecodeHolds);
    }
    Ok(Route::plan(prefill, keys.session.hash()))
}

/// The prompt tokens `backend` lacks of a request keyed `keys` with a body
/// of `bytes`, when its conversation's previous request went there: what
/// its body added since, less the previous answer (whose KV the backend
/// computed as it decoded it). `None` when the conversation was not there.
pub(crate) fn lacking_at(memory: &KeyMemory, keys: Keys, bytes: u64, backend: &Backend) -> Option<u64> {
    let key = keys.session.memory();
    let (at, tokens) = work(memory, key, bytes).warm_at?;
    if at.name != backend.name {
        return None;
    }
    let answered = memory.note(key).map_or(0, |(_, note)| note.answered);
    Some(tokens.saturating_sub(answered))
}
