//! A request's prefill work (`queue`): the prompt tokens a backend would
//! still have to compute for it, told from its body's bytes and what its
//! key's previous request left in that backend's cache.
//!
//! The queue counts work at each backend ([`crate::routing::backend::load`])
//! and weighs a spill by it; the estimate comes from the key memory's note
//! ([`super::note`]): the previous request's body bytes, and once its usage
//! was read, its own bytes-to-tokens ratio. A grouped request also brings
//! its head's size: a backend that served its group lately holds that much
//! of it ([`Work::at`]). A backend that computed as many tokens since the
//! key's last answer was read there as its KV cache keeps of what running
//! requests do not hold has likely evicted what that answer left
//! ([`evicted`]): its work there is all of it.

use std::sync::Arc;

use crate::routing::backend::Backend;
use crate::routing::key_memory::KeyMemory;
use crate::routing::keys::{GroupKey, MemoryKey};
use crate::routing::llm::note::Note;

/// What a request's work is estimated from when nothing better is known:
/// JSON chat bodies run about four bytes to a token.
pub(crate) const BYTES_PER_TOKEN: u64 = 4;

/// A request's prefill work, in prompt tokens.
#[derive(Debug, Clone, Default)]
pub(crate) struct Work {
    /// At a backend whose cache holds nothing of it.
    pub(crate) tokens: u64,
    /// The backend its key's previous request went to, and its work there.
    pub(crate) warm_at: Option<(Arc<Backend>, u64)>,
    /// Its group, and the tokens of its head the group's conversations
    /// share: a backend that served the group lately holds them.
    pub(crate) head: Option<(GroupKey, u64)>,
    /// Its system head's hash and tokens: a backend that answered a request
    /// with the same system head lately holds them.
    pub(crate) system_head: Option<(u64, u64)>,
    /// Its class, where engines take it (`queue.priority.engine`): inside
    /// one it waits only behind the work of its class and the higher ones.
    pub(crate) class: Option<usize>,
}

/// What of a request's body other requests share, as read for its key:
/// the bytes of its group's head (0 when not known: no group, or a
/// header's), and its system head (model, instructions, tools: hash and
/// bytes) when its chat head was read and its group is not that already.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Heads {
    pub(crate) group_bytes: u64,
    pub(crate) system: Option<(u64, u64)>,
}

impl Work {
    /// Work that no cache holds a part of.
    pub(crate) fn cold(tokens: u64) -> Work {
        Work {
            tokens,
            warm_at: None,
            head: None,
            system_head: None,
            class: None,
        }
    }

    /// The same work, counted in `class` (`None`: with every class).
    pub(crate) fn in_class(self, class: Option<usize>) -> Work {
        Work { class, ..self }
    }

    /// The same work, of `group`, with the `heads` it shares with others.
    pub(crate) fn of_group(self, group: Option<GroupKey>, heads: Heads) -> Work {
        let shared = heads.group_bytes / BYTES_PER_TOKEN;
        Work {
            head: group.filter(|_| shared > 0).map(|g| (g, shared)),
            system_head: (heads.system).map(|(hash, bytes)| (hash, bytes / BYTES_PER_TOKEN)),
            ..self
        }
    }

    /// Its work at `backend`: less the prefix its key's previous request
    /// left there, or less its group's head or its system head if the
    /// backend's cache likely holds it
    /// ([`crate::routing::backend::Live::holds_head`]), whichever it holds
    /// most of.
    pub(crate) fn at(&self, backend: &Backend) -> u64 {
        let warm = match &self.warm_at {
            Some((warm, tokens)) if warm.name == backend.name => *tokens,
            _ => self.tokens,
        };
        let headed = match self.head {
            Some((group, shared)) if backend.live.holds_head(group) => shared,
            _ => 0,
        };
        let system = match self.system_head {
            Some((hash, shared)) if backend.live.holds_system_head(hash) => shared,
            _ => 0,
        };
        warm.min(self.tokens.saturating_sub(headed.max(system)))
    }
}

/// The work a request with a body of `bytes` brings, its key's record at
/// `key`: its prompt tokens anywhere, less, at the backend the record's
/// request went to, the prefix that request left in the cache. Tokens are
/// told from bytes by the previous request's own ratio when its usage was
/// read, else at [`BYTES_PER_TOKEN`].
pub(crate) fn work(memory: &KeyMemory, key: MemoryKey, bytes: u64) -> Work {
    let Some((backend, note)) = memory.note(key).filter(|(_, n)| n.sent.prompt_bytes > 0) else {
        return Work::cold(bytes / BYTES_PER_TOKEN);
    };
    let evicted = evicted_from(&note, &backend);
    let before = note.sent.prompt_bytes;
    let tokens = |bytes: u64| match &note.served {
        Some((_, served)) => {
            let scaled = u128::from(bytes) * u128::from(*served) / u128::from(before);
            u64::try_from(scaled).unwrap_or(u64::MAX)
        }
        None => bytes / BYTES_PER_TOKEN,
    };
    let warm = tokens(bytes.saturating_sub(before));
    Work {
        tokens: tokens(bytes),
        warm_at: (!evicted).then_some((backend, warm)),
        head: None,
        system_head: None,
        class: None,
    }
}

/// Whether `at`'s engine has likely evicted what `key`'s last answer left
/// in its cache: that answer was read there, the engine says the size of
/// its cache, and this magpie had it compute at least as many tokens since
/// as the cache keeps of what running requests do not hold
/// ([`crate::routing::backend::Live::pushed_out`]). What other
/// magpies sent it, and the tokens it decoded, count not: it errs towards
/// a cache that still holds the conversation.
pub(crate) fn evicted(memory: &KeyMemory, key: MemoryKey, at: &Backend) -> bool {
    memory
        .note(key)
        .is_some_and(|(_, note)| evicted_from(&note, at))
}

/// [`evicted`], told from the key's `note`.
fn evicted_from(note: &Note, at: &Backend) -> bool {
    let served_at = (note.served.as_ref()).is_some_and(|(name, _)| **name == *at.name);
    served_at && (note.computed_at).is_some_and(|then| at.live.pushed_out(then))
}
