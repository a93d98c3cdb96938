//! What an engine's answer says of its cache: the prompt tokens it was
//! sent and how many of them it found cached (`usage`), read as the answer
//! streams ([`magpie_core::usage`]).
//!
//! `commit (why the key moved) ─▶ the answer's usage ─▶ Tally::served`:
//! the backend's token counters, and the key memory's note compared with
//! it: a request whose engine served fewer cached tokens than its key's
//! previous request had prompt tokens (less [`MISS_SLACK_TOKENS`]) is a
//! cache miss, counted by [`MissCause`]: why the key moved, or
//! [`MissCause::Evicted`] when it did not.

use std::sync::Arc;

use crate::routing::backend::Backend;
use crate::routing::instance::Instance;
use crate::routing::key_memory::{KeyMemory, MissCause};
use crate::routing::keys::SessionKey;

/// Cached tokens may fall this short of the previous prompt without a miss:
/// engines cache whole blocks (16 tokens in vLLM), and the last partial
/// block of a prompt is not reused.
pub(crate) const MISS_SLACK_TOKENS: u64 = 32;

/// A request's usage as the engine reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub(crate) prompt: u64,
    pub(crate) cached: u64,
}

/// Where an answer's usage goes: the key whose request it answers, and why
/// that key moved to its backend, if it did.
pub(crate) struct Tally {
    pub(crate) instance: Arc<Instance>,
    pub(crate) key: SessionKey,
    pub(crate) moved: Option<MissCause>,
}

impl Tally {
    /// `backend` answered with `tokens` of prompt (`cached` of them found
    /// in its cache) and `completion` tokens: its counters, and a cache
    /// miss counted if it was one.
    pub(crate) fn served(&self, backend: &Backend, tokens: Tokens, completion: u64) {
        (backend.live.traffic).count_tokens(tokens.prompt, tokens.cached, completion);
        let memory = &self.instance.key_memory;
        served(memory, self.key, &backend.name, tokens, self.moved);
        let computed = backend.live.load.computed();
        memory.note_mut(self.key, |note| {
            note.answered = completion;
            note.computed_at = Some(computed);
        });
    }
}

/// `key`'s request was answered by `backend` with `tokens`: a cache miss
/// (fewer cached tokens than the key's previous prompt) is counted and
/// returned, with `moved` (from [`KeyMemory::routed`]) as its cause when
/// the key changed backends, else [`MissCause::Evicted`].
pub(crate) fn served(
    memory: &KeyMemory,
    key: SessionKey,
    backend: &str,
    tokens: Tokens,
    moved: Option<MissCause>,
) -> Option<MissCause> {
    let previous = memory.note_mut(key, |note| {
        let previous = note.served.take();
        let same = previous.as_ref().is_some_and(|(b, _)| &**b == backend);
        let name = match &previous {
            Some((b, _)) if same => Arc::clone(b),
            _ => Arc::from(backend),
        };
        note.served = Some((name, tokens.prompt));
        previous.map(|(b, prompt)| (&*b == backend, prompt))
    })?;
    let (same, prompt) = previous?;
    if tokens.cached.saturating_add(MISS_SLACK_TOKENS) >= prompt {
        return None;
    }
    let cause = if same {
        MissCause::Evicted
    } else {
        moved.unwrap_or(MissCause::TableChanged)
    };
    memory.count_miss(cause);
    Some(cause)
}
