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
//! gets the other magpies' work with it ([`super::fleet`]) and is placed by
//! the queue as on one magpie, and once a backend took it the binding is
//! written there, with this magpie's work ([`Sessions::bind_shared`]): the
//! first binding of a key still wins for every instance, and the local pin
//! follows what holds. A turn that spilled off its pin (its home was far
//! busier) moves the binding to where it went, as its cache did, unless
//! another instance moved it first; the next turn, through any magpie,
//! reads the move. The write goes in the background, long before the
//! conversation's next turn: that comes after this one's answer. While the
//! store does not answer, the local pin (else the table) routes, as without
//! a queue.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use tokio::time::Instant;

use super::fleet::{self, FUNCTIONS};
use super::store::{BIND_STEP, MAX_BINDING, READ_BINDING, Store, bindable};
use super::{Member, Sessions};
use crate::routing::backend::Backend;

/// Reads KEYS[1]'s binding (ARGV[1] is [`MAX_BINDING`]) and extends it by
/// ARGV[2] ms: {the binding, or an empty string for none, 1 if a bad value
/// was removed, and without a binding the other magpies' work (the fleet's
/// keys and arguments from KEYS[2] and ARGV[3])}.
const LOOKUP: &str = r"
local held, bad = read(tonumber(ARGV[1]))
if held then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {held, bad, {}}
end
return {'', bad, others(fleet(2, 3))}
";

/// Binds KEYS[1] as [`BIND_STEP`] does and writes this magpie's work (the
/// fleet's keys and arguments from KEYS[2] and ARGV[4]): {the binding that
/// holds now, 1 if a bad value was replaced}.
const PLACE: &str = "write(fleet(2, 4))\nreturn {held, bad}\n";

static LOOKUP_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{READ_BINDING}{FUNCTIONS}{LOOKUP}")));
static PLACE_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{READ_BINDING}{BIND_STEP}{FUNCTIONS}{PLACE}")));

/// What the store holds for a request's key.
#[derive(Debug)]
pub(crate) struct Found {
    /// Its binding.
    pub(crate) held: Option<String>,
    /// Without a binding (a conversation's first request): the other
    /// magpies' work, by backend name.
    pub(crate) fleet: Option<HashMap<String, u64>>,
}

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
    /// The binding of `key`, extended by the TTL, and without one the
    /// fleet's work as `member`'s others last wrote it; `None` when the
    /// store did not answer by `deadline` (counted: the request goes by
    /// the table).
    pub(crate) async fn lookup(
        &self,
        key: u64,
        member: &Member,
        deadline: Instant,
    ) -> Option<Found> {
        let mut invocation = LOOKUP_SCRIPT.key(self.key(key));
        invocation.arg(MAX_BINDING).arg(self.ttl_ms());
        member.add(&mut invocation, self, None);
        let reply: Option<(Vec<u8>, u8, Vec<Vec<u8>>)> = self
            .run(deadline, |mut c| async move {
                invocation.invoke_async(&mut c).await
            })
            .await;
        let Some((held, bad, others)) = reply else {
            self.fell_back();
            return None;
        };
        let held = (self.held(Some((held, bad))))
            .and_then(|h| String::from_utf8(h).ok())
            .filter(|name| !name.is_empty());
        let fleet = held.is_none().then(|| fleet::sum(&others));
        Some(Found { held, fleet })
    }

    /// Binds `key` to `backend` unless it is bound (as [`Store::pin`]
    /// does, a backend down or gone aside) and writes `member`'s `work` in
    /// the same round trip: the binding that holds; `None` without an
    /// answer in time (counted).
    async fn place(
        &self,
        key: u64,
        backend: &str,
        member: &Member,
        work: String,
    ) -> Option<Vec<u8>> {
        if !bindable(backend) {
            return None;
        }
        let mut invocation = PLACE_SCRIPT.key(self.key(key));
        invocation.arg(MAX_BINDING).arg(backend).arg(self.ttl_ms());
        member.add(&mut invocation, self, Some(work));
        let reply = self
            .run(self.deadline(), |mut c| async move {
                invocation.invoke_async(&mut c).await
            })
            .await;
        let held = self.held(reply);
        if held.is_none() {
            self.fell_back();
        }
        held
    }
}

impl Sessions {
    /// `key`'s request was served at `backend`, one of `backends`; `pin`
    /// says what that does to its binding. The local pin is bound at once,
    /// the store's in the background (bound if the key has none, with this
    /// magpie's work at `backends` written in the same round trip, or
    /// `stale` replaced by compare-and-set), and the local pin follows the
    /// binding that holds.
    pub(crate) fn bind_shared(
        self: &Arc<Self>,
        key: u64,
        backend: &str,
        pin: &SharedPin,
        backends: &[Arc<Backend>],
    ) {
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
        let work = replacing.is_none().then(|| fleet::own_work(backends));
        tokio::spawn(async move {
            let held = match &replacing {
                Some(stale) => {
                    let deadline = store.deadline();
                    store
                        .replace(key, stale.as_bytes(), &backend, deadline)
                        .await
                }
                None => {
                    let work = work.unwrap_or_default();
                    store.place(key, &backend, &sessions.fleet, work).await
                }
            };
            if let Some(held) = held.filter(|held| held != backend.as_bytes()) {
                let now = std::str::from_utf8(&held).ok();
                sessions.pins.follow(key, &backend, now);
            }
        });
    }
}
