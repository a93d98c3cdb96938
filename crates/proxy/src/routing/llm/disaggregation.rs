//! Disaggregated prefill and decode (`disaggregation`): where a request's
//! two halves go, and when it is not split at all.
//!
//! The decode half is the request as the table routes it: pinned by its
//! conversation, so the conversation's later turns find their earlier KV
//! (its answers' included) on their decode backend. The prefill half goes
//! to the prefill pool by the same conversation key, so a conversation's
//! prompts meet their own earlier prefixes there too. And a request whose
//! decode backend lacks fewer than `disaggregation.skip_below_tokens` of its
//! prompt's tokens is not split: that backend prefills them itself, and no
//! KV moves (a conversation's next turn, or a short prompt whose long
//! shared head the backend holds).
//!
//! What the decode backend holds is told as the queue tells a request's
//! work ([`super::work`]): from the key memory's note of the conversation's
//! previous request there (its prompt, and its answer), and the heads the
//! backend served lately.

use std::sync::Arc;

use crate::routing::backend::Backend;
use crate::routing::key_memory::KeyMemory;
use crate::routing::keys::Keys;
use crate::routing::llm::work::{Heads, work};
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

/// What a request brings, as its prefill half's route is told from it:
/// its keys, its body's bytes and the heads it shares with others.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked {
    pub(crate) keys: Keys,
    pub(crate) bytes: u64,
    pub(crate) heads: Heads,
}

/// Where a request's prefill half goes: its targets, the cheapest first,
/// each with the prompt tokens it would compute there.
#[derive(Debug)]
pub(crate) struct PrefillPlan {
    /// The prefill pool's route (its caps, for the slots taken).
    pub(crate) route: Route,
    pub(crate) targets: Vec<(Arc<Backend>, u64)>,
}

/// Where the request `asked`, whose decode half goes first to `decode`,
/// has its prefill half, or `Err` with why it is not split.
///
/// The prefill pool's route for its conversation gives the candidates
/// (healthy, under their caps, in its table's order: the conversation's
/// own prefill backend first, where its earlier prompts were computed);
/// each costs the prefill work magpie holds there plus the request's own
/// (at its own backend less its previous prompt), and the cheapest goes
/// first (ties in the table's order).
pub(crate) fn prefill_route(
    snapshot: &Snapshot,
    memory: &KeyMemory,
    asked: Asked,
    decode: Option<&Arc<Backend>>,
) -> Result<PrefillPlan, Decision> {
    let (Some(config), Some(prefill)) = (&snapshot.config.disaggregation, &snapshot.prefill) else {
        return Err(Decision::Unsplittable);
    };
    let lacking = decode.map(|d| lacking_at(memory, asked, d));
    if lacking.is_some_and(|tokens| tokens < config.skip_below_tokens) {
        return Err(Decision::DecodeHolds);
    }
    let route = Route::plan(prefill, asked.keys.session.hash());
    let work = work(memory, asked.keys.session.memory(), asked.bytes);
    let own = work.warm_at.as_ref().map_or(work.tokens, |(_, t)| *t);
    let mut costed: Vec<(u64, usize, Arc<Backend>, u64)> = (route.targets.iter().enumerate())
        .map(|(i, b)| {
            let tokens = if i == 0 { own } else { work.tokens };
            let cost = b.live.load.held_tokens().saturating_add(tokens);
            (cost, i, Arc::clone(b), tokens)
        })
        .collect();
    costed.sort_by_key(|(cost, i, _, _)| (*cost, *i));
    let targets = costed.into_iter().map(|(_, _, b, t)| (b, t)).collect();
    Ok(PrefillPlan { route, targets })
}

/// The prompt tokens `backend` lacks of the request `asked`: its prefill
/// work there ([`super::work`]: its prompt less the prefix its
/// conversation's previous request left there, or less a shared head the
/// backend likely holds), less that previous request's answer when it was
/// there (the backend computed its KV as it wrote it).
pub(crate) fn lacking_at(memory: &KeyMemory, asked: Asked, backend: &Backend) -> u64 {
    let key = asked.keys.session.memory();
    let work = work(memory, key, asked.bytes).of_group(asked.keys.group, asked.heads);
    let warm_here = work
        .warm_at
        .as_ref()
        .is_some_and(|(b, _)| b.name == backend.name);
    let answered = match warm_here {
        true => memory.note(key).map_or(0, |(_, note)| note.answered),
        false => 0,
    };
    work.at(backend).saturating_sub(answered)
}
