//! Conversations' first requests.
//!
//! Two rules meet here. With `key.group_choices` above 1, a request that
//! opens a conversation counts among its backend's requests awaiting their
//! first byte as an opening (and, when it placed a new group, as a new
//! group's), which is what ranks a group's candidates
//! ([`super::groups::least_awaiting`]); [`Opening`] says where it was
//! placed. Under a `queue`, a conversation that opens like one served
//! lately (same model, instructions and first user message: its
//! [`OpeningKey`]) goes where the latest such request went and waits there
//! for the cache they share ([`alike`]); the key memory keeps one record
//! per opening for it ([`opened`]), and with a shared store the fleet's
//! record, read with the pin lookup, is kept there first
//! ([`crate::routing::sessions::placed::Opened`]).

use std::sync::Arc;

use crate::routing::backend::{Awaiting, Backend};
use crate::routing::key_memory::KeyMemory;
use crate::routing::keys::OpeningKey;
use crate::routing::llm::note::Sent;
use crate::routing::sessions::homes::AwaitingMark;

/// A conversation's first request, with `key.group_choices` above 1: where
/// it was placed (its group's home when it placed a new group, else its
/// session pin), and with a shared store its mark there
/// ([`crate::routing::sessions::homes`]). It counts among the requests
/// awaiting their first byte as an opening, and a new group's at its home
/// as one too, until the byte arrives ([`Opening::claimed_at`]).
#[derive(Debug)]
pub(crate) struct Opening {
    pub(crate) at: String,
    pub(crate) new_group: bool,
    pub(crate) mark: Option<AwaitingMark>,
}

impl Opening {
    /// A request that placed a new group at `home`.
    pub(crate) fn new_group(home: &Backend, mark: Option<AwaitingMark>) -> Opening {
        Opening {
            at: home.name.clone(),
            new_group: true,
            mark,
        }
    }

    /// A request that opened a conversation at `at`, its group placed before.
    pub(crate) fn conversation(at: &Backend, mark: Option<AwaitingMark>) -> Opening {
        Opening {
            at: at.name.clone(),
            new_group: false,
            mark,
        }
    }

    /// What the request counts as at `backend`, the one that takes it, and
    /// its mark if it was placed there (a mark elsewhere is dropped).
    pub(crate) fn claimed_at(self, backend: &str) -> (Awaiting, Option<AwaitingMark>) {
        match self {
            Opening {
                at,
                new_group,
                mark,
            } if at == backend => {
                let kind = if new_group {
                    Awaiting::NewGroup
                } else {
                    Awaiting::Opening
                };
                (kind, mark)
            }
            _ => (Awaiting::Opening, None),
        }
    }
}

/// A conversation's first request that opens as `opening`, one like it
/// served lately: the backend the latest such request went to moves to the
/// front of `targets`, if it is among them. Whether it was not first
/// already; `None` when no such backend is among the targets.
pub(crate) fn alike(
    memory: &KeyMemory,
    opening: OpeningKey,
    targets: &mut [Arc<Backend>],
) -> Option<bool> {
    let at = memory.kept_at(opening.memory())?;
    let i = targets
        .iter()
        .position(|b| Arc::ptr_eq(&b.live, &at.live))?;
    targets[..=i].rotate_right(1);
    Some(i > 0)
}

/// A request whose conversation opens as `opening` went to `backend` with a
/// body of `prompt_bytes`: the opening's record says so, for the next
/// conversation that opens alike ([`alike`], and its work there,
/// [`super::work::work`]). Nothing is counted.
pub(crate) fn opened(
    memory: &KeyMemory,
    opening: OpeningKey,
    backend: &Arc<Backend>,
    prompt_bytes: u64,
) {
    let sent = Sent {
        group: None,
        prompt_bytes,
    };
    memory.keep(opening.memory(), backend, sent);
}
