//! What the key memory keeps with each key for the LLM policy: what the
//! key's last request sent (its group, its body's bytes) and what its
//! engine last reported (the backend and the prompt tokens of the last
//! answer whose usage was read, and how much that backend had computed
//! then).
//!
//! The key memory stores a [`Note`] beside each decision without reading
//! it; the prefill work ([`super::work`]) and cache misses
//! ([`super::usage`]) are told from it.

use std::sync::Arc;

use crate::routing::keys::GroupKey;

/// What a request sent, as the key memory keeps it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sent {
    /// Its group (`key.group`), if it had one.
    pub(crate) group: Option<GroupKey>,
    /// Its body's bytes (mode http; 0 when unknown, and in mode tcp and udp).
    pub(crate) prompt_bytes: u64,
}

/// One key's note.
#[derive(Debug, Clone, Default)]
pub(crate) struct Note {
    /// What its last request sent.
    pub(crate) sent: Sent,
    /// The backend and prompt tokens of its last request whose usage was
    /// read.
    pub(crate) served: Option<(Arc<str>, u64)>,
    /// The completion tokens of that answer: its engine computed their KV
    /// as it wrote them, so it holds them as the next request's prompt.
    pub(crate) answered: u64,
    /// The tokens this magpie had that backend compute, all told, when
    /// the answer was read: what it computed since pushes the
    /// conversation's cache out ([`super::work::evicted`]).
    pub(crate) computed_at: Option<u64>,
}

impl Note {
    /// The note of a key whose first request sent `sent`.
    pub(crate) fn of(sent: Sent) -> Note {
        Note {
            sent,
            served: None,
            answered: 0,
            computed_at: None,
        }
    }
}
