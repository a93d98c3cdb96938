//! Shared pins under a `queue` (`sessions.store: redis`): a conversation's
//! pin is bound where its request went, not where the table said.
//!
//! Under a queue the backend that takes a conversation's first request is
//! the one where it costs least ([`crate::routing::queue`]),
//! which the table does not know. Binding the table's choice before the
//! queue placed the request would pin the conversation where its cache is
//! not, and its next turn, through any magpie, would go there. So every
//! request reads its key's binding from the store ([`Store::lookup`], one
//! round trip, which also extends the binding's TTL); one without a binding
//! is placed by the queue as on one magpie, and once a backend took it the
//! binding is written there ([`Sessions::bind_shared`]): the first binding
//! of a key still wins for every instance, and the local pin follows what
//! holds. A turn that spilled off its pin (its home was far busier) moves
//! the binding to where it went, as its cache did, unless another instance
//! moved it first; the next turn, through any magpie, reads the move. The
//! write goes in the background, long before the conversation's next turn:
//! that comes after this one's answer. While the store does not answer,
//! the local pin (else the table) routes, as without a queue.

use std::sync::{Arc, LazyLock};

use super::Sessions;
use super::store::{MAX_BINDING, READ_BINDING, Store};

/// Reads KEYS[1]'s binding (ARGV[1] is [`MAX_BINDING`]) and extends it by
/// ARGV[2] ms: {the binding, or an empty string for none, 1 if a bad value
/// was removed}.
const LOOKUP: &str = r"
local held, bad = read(tonumber(ARGV[1]))
if held then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return {held or '', bad}
";

static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{READ_BINDING}{LOOKUP}")));

/// What serving a request does to its binding in the shared store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SharedPin {
    /// It had no usable binding (none, or one to a backend down or gone,
    /// given here): the backend that serves it is bound.
    Place { stale: Option<String> },
    /// It was pinned to this backend: if another serves it, the binding moves.
    Move { was: String },
}

impl Store {
    /// The binding of `key`, extended by the TTL: `Some(None)` when there is none, `None` when
    /// the store did not answer in time (counted: the request goes by the
    /// table).
    pub(crate) async fn lookup(&self, key: u64) -> Option<Option<String>> {
        let deadline = self.deadline();
        let mut invocation = SCRIPT.key(self.key(key));
        invocation.arg(MAX_BINDING).arg(self.ttl_ms());
        let reply = self
            .run(deadline, |mut c| async move {
                invocation.invoke_async(&mut c).await
            })
            .await;
        let Some(held) = self.held(reply) else {
            self.fell_back();
            return None;
        };
        Some(String::from_utf8(held).ok().filter(|name| !name.is_empty()))
    }
}

impl Sessions {
    /// `key`'s request was served at `backend`; `pin` says what that does to
    /// its binding. The local pin is bound at once, the store's in the
    /// background (bound if the key has none, or `stale` replaced by
    /// compare-and-set), and the local pin follows the binding that holds.
    pub(crate) fn bind_shared(self: &Arc<Self>, key: u64, backend: &str, pin: &SharedPin) {
        let replacing = match pin {
            SharedPin::Move { was } if was == backend => return,
            SharedPin::Move { was } => Some(was.clone()),
            SharedPin::Place { stale } => stale.clone(),
        };
        self.pins.bind(key, backend);
        let Some(store) = self.store.clone() else {
            return;
        };
        let (sessions, backend) = (Arc::clone(self), backend.to_owned());
        tokio::spawn(async move {
            let held = match &replacing {
                Some(stale) => {
                    let deadline = store.deadline();
                    store
                        .replace(key, stale.as_bytes(), &backend, deadline)
                        .await
                }
                None => store
                    .pin(key, &backend, |_| true)
                    .await
                    .map(String::into_bytes),
            };
            if let Some(held) = held.filter(|held| held != backend.as_bytes()) {
                let now = std::str::from_utf8(&held).ok();
                sessions.pins.follow(key, &backend, now);
            }
        });
    }
}
