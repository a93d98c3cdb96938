//! Shared pins under a `queue` (`sessions.store: redis`): a conversation's
//! pin is bound where its request went, not where the table said.
//!
//! Under a queue the backend that takes a conversation's first request is
//! the one where it costs least ([`crate::routing::queue`]),
//! which the table does not know. Binding the table's choice before the
//! queue placed the request would pin the conversation where its cache is
//! not, and its next turn, through any magpie, would go there. So every
//! request reads its key's binding from the store ([`Store::lookup`], one
//! round trip, which also extends the binding's TTL and writes this
//! magpie's work); one without a binding gets the other magpies' work with
//! it ([`super::fleet`]) and is placed by the queue as on one magpie, and
//! once a backend took it the binding is written there, with this magpie's
//! work again ([`Sessions::bind_shared`]): the
//! first binding of a key still wins for every instance, and the local pin
//! follows what holds. A turn that spilled off its pin (its home was far
//! busier) moves the binding to where it went, as its cache did, unless
//! another instance moved it first; the next turn, through any magpie,
//! reads the move. The write goes in the background, long before the
//! conversation's next turn: that comes after this one's answer. While the
//! store does not answer, the local pin (else the table) routes, as without
//! a queue.
//!
//! The lookup also swaps the body's bytes of the key's latest request,
//! kept under `{prefix}sent:{key}`, for this one's: a turn whose previous
//! one went through another magpie counts as work only what it adds
//! ([`crate::routing::key_memory::KeyMemory::sent_elsewhere`]), not its
//! whole prompt.
//!
//! The same two scripts carry where the fleet's conversations opened
//! ([`Opened`]): a new binding keeps, by how its conversation opens, where
//! it went, and a lookup without a binding reads that, so a conversation
//! that opens like one another magpie placed lately goes there too
//! ([`crate::routing::llm::openings`]), and where the fleet's conversations
//! that share a head ([`SharedHead`]) were placed: a new binding keeps
//! where it went for [`HEAD_LIFETIME`], and a lookup without a binding
//! reads it, so the head counts as served there for this magpie too
//! ([`crate::routing::backend::Live::served_elsewhere`]).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use tokio::time::Instant;

use super::fleet::{self, FUNCTIONS};
use super::store::{BIND_STEP, MAX_BINDING, READ_BINDING, Store, bindable};
use super::{Member, Sessions};
use crate::routing::backend::Backend;
use crate::routing::keys::{OpeningKey, SharedHead};

/// Writes this magpie's work (the fleet's keys and arguments from KEYS[2]
/// and ARGV[3]), swaps KEYS[4]'s bytes the key's latest request sent for
/// this one's, ARGV[8], for ARGV[2] ms, reads KEYS[1]'s binding (ARGV[1]
/// is [`MAX_BINDING`]) and extends it by ARGV[2] ms: {the binding, or an
/// empty string for none, 1 if a bad value was removed, the bytes the
/// latest request before sent (or an empty string), and without a binding
/// the other magpies' work, the record of how the latest conversation that
/// opens alike went (an [`Opened`], from KEYS[5] when ARGV[9] is 1) and
/// the backend the latest conversation sharing its head went to (from the
/// key after; empty strings for none)}.
const LOOKUP: &str = r"
local function small(key, max)
  if key and redis.call('TYPE', key)['ok'] == 'string' and redis.call('STRLEN', key) <= max then
    return redis.call('GET', key)
  end
  return ''
end
write(fleet(2, 3))
local sent = small(KEYS[4], 20)
redis.call('SET', KEYS[4], ARGV[8], 'PX', ARGV[2])
local held, bad = read(tonumber(ARGV[1]))
if held then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {held, bad, sent, {}, '', ''}
end
local opened, at = '', 5
if ARGV[9] == '1' then
  opened, at = small(KEYS[5], tonumber(ARGV[1]) + 21), 6
end
return {'', bad, sent, others(fleet(2, 3)), opened, small(KEYS[at], tonumber(ARGV[1]))}
";

/// Binds KEYS[1] as [`BIND_STEP`] does and writes this magpie's work (the
/// fleet's keys and arguments from KEYS[2] and ARGV[4]); unless ARGV[9] is
/// empty, KEYS[4] keeps it, the record of how its conversation opened, for
/// ARGV[3] ms; and the key after, if given, keeps its backend, ARGV[2], as
/// where its head was served, for ARGV[10] ms: {the binding that holds
/// now, 1 if a bad value was replaced}.
const PLACE: &str = r"
write(fleet(2, 4))
local at = 4
if ARGV[9] ~= '' then
  redis.call('SET', KEYS[4], ARGV[9], 'PX', ARGV[3])
  at = 5
end
if KEYS[at] then redis.call('SET', KEYS[at], ARGV[2], 'PX', ARGV[10]) end
return {held, bad}
";

/// How long the store keeps where a head was served: as long as a backend
/// counts a head it served as cached at the longest
/// ([`crate::routing::backend::recent`]).
const HEAD_LIFETIME: std::time::Duration =
    crate::routing::backend::recent::RECENT_PERIOD.saturating_mul(2);

/// [`LOOKUP`]'s reply: the binding, whether a bad value was removed, the
/// bytes the latest request sent, the others' work, the opening's record
/// and where its head was served.
type LookupReply = (Vec<u8>, u8, Vec<u8>, Vec<Vec<u8>>, Vec<u8>, Vec<u8>);

static LOOKUP_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{READ_BINDING}{FUNCTIONS}{LOOKUP}")));
static PLACE_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{READ_BINDING}{BIND_STEP}{FUNCTIONS}{PLACE}")));

/// What the store holds for a request's key.
#[derive(Debug)]
pub(crate) struct Found {
    /// Its binding.
    pub(crate) held: Option<String>,
    /// The body's bytes of the key's latest request before this one,
    /// through any magpie.
    pub(crate) sent: Option<u64>,
    /// Without a binding (a conversation's first request): the other
    /// magpies' work, by backend name.
    pub(crate) fleet: Option<HashMap<String, u64>>,
    /// Without a binding: whether another magpie shares the store (it
    /// wrote its work within the fleet's lifetime, any or none).
    pub(crate) others_live: bool,
    /// Without a binding: where the latest conversation that opens alike
    /// went, through any magpie.
    pub(crate) opened: Option<Opened>,
    /// Without a binding: the backend the latest conversation that shares
    /// its head went to, through any magpie.
    pub(crate) head_at: Option<String>,
}

/// Where a conversation's first request went and its body's bytes, kept
/// in the store by how it opens ([`OpeningKey`]) for the fleet's next
/// conversation that opens alike ([`crate::routing::llm::openings`]):
/// `bytes:backend`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Opened {
    pub(crate) at: String,
    pub(crate) prompt_bytes: u64,
}

impl Opened {
    fn read(value: &[u8]) -> Option<Opened> {
        let (bytes, at) = std::str::from_utf8(value).ok()?.split_once(':')?;
        let prompt_bytes = bytes.parse().ok()?;
        let at = at.to_owned();
        let named = (1..=MAX_BINDING).contains(&at.len());
        named.then_some(Opened { at, prompt_bytes })
    }

    fn value(&self) -> String {
        format!("{}:{}", self.prompt_bytes, self.at)
    }
}

/// What a lookup tells the store of its request: how its conversation
/// opens, the head it shares, and its body's bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Told {
    pub(crate) opening: Option<OpeningKey>,
    pub(crate) head: Option<SharedHead>,
    pub(crate) prompt_bytes: u64,
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
    /// The binding of `key`, extended by the TTL, the bytes its latest
    /// request sent, and without a binding the fleet's work as `member`'s
    /// others last wrote it and the record of `told`'s opening; `member`'s
    /// `work` and the bytes `told` sends are written in the same round
    /// trip. `None` when the store did not answer by `deadline` (counted:
    /// the request goes by the table).
    pub(crate) async fn lookup(
        &self,
        key: u64,
        told: Told,
        (member, work): (&Member, String),
        deadline: Instant,
    ) -> Option<Found> {
        let mut invocation = LOOKUP_SCRIPT.key(self.key(key));
        invocation.arg(MAX_BINDING).arg(self.ttl_ms());
        member.add(&mut invocation, self, Some(work));
        invocation
            .key(self.prefixed(&format!("sent:{key:016x}")))
            .arg(told.prompt_bytes)
            .arg(u8::from(told.opening.is_some()));
        if let Some(opening) = told.opening {
            invocation.key(self.opening_key(opening));
        }
        if let Some(head) = told.head {
            invocation.key(self.head_key(head));
        }
        let reply: Option<LookupReply> = self
            .run(deadline, |mut c| async move {
                invocation.invoke_async(&mut c).await
            })
            .await;
        let Some((held, bad, sent, others, opened, head_at)) = reply else {
            self.fell_back();
            return None;
        };
        let held = (self.held(Some((held, bad))))
            .and_then(|h| String::from_utf8(h).ok())
            .filter(|name| !name.is_empty());
        let others_live = held.is_none() && !others.is_empty();
        let fleet = held.is_none().then(|| fleet::sum(&others));
        let sent = std::str::from_utf8(&sent).ok().and_then(|s| s.parse().ok());
        let sent = sent.filter(|&bytes: &u64| bytes > 0);
        let opened = Opened::read(&opened);
        let head_at = String::from_utf8(head_at).ok();
        let head_at = head_at.filter(|at| (1..=MAX_BINDING).contains(&at.len()));
        Some(Found {
            held,
            sent,
            fleet,
            others_live,
            opened,
            head_at,
        })
    }

    /// Where the backend the fleet last served `head` at is kept.
    fn head_key(&self, head: SharedHead) -> String {
        self.prefixed(&format!("head:{}", head.name()))
    }

    /// Where the record of conversations that open as `opening` is kept.
    fn opening_key(&self, opening: OpeningKey) -> String {
        self.prefixed(&format!("opened:{:016x}", opening.hash()))
    }

    /// Binds `key` to `backend` unless it is bound (as [`Store::pin`]
    /// does, a backend down or gone aside) and writes `member`'s `work` and
    /// the record of how the conversation opened in the same round trip:
    /// the binding that holds; `None` without an answer in time (counted).
    async fn place(
        &self,
        key: u64,
        backend: &str,
        member: &Member,
        work: String,
        (opened, head): (Option<(OpeningKey, Opened)>, Option<SharedHead>),
    ) -> Option<Vec<u8>> {
        if !bindable(backend) {
            return None;
        }
        let mut invocation = PLACE_SCRIPT.key(self.key(key));
        invocation.arg(MAX_BINDING).arg(backend).arg(self.ttl_ms());
        member.add(&mut invocation, self, Some(work));
        match opened {
            Some((opening, opened)) => invocation
                .key(self.opening_key(opening))
                .arg(opened.value()),
            None => invocation.arg(""),
        };
        invocation.arg(HEAD_LIFETIME.as_millis() as u64);
        if let Some(head) = head {
            invocation.key(self.head_key(head));
        }
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

/// What serving a request writes to the store.
enum Write {
    /// A binding to a backend down or gone, or one a turn spilled off, is
    /// replaced.
    Replace { stale: String },
    /// A new binding, and beside it this magpie's work and, if known, the
    /// record of how its conversation opened.
    Place {
        work: String,
        opened: Option<(OpeningKey, Opened)>,
        head: Option<SharedHead>,
    },
}

/// What a new binding writes beside it.
pub(crate) struct Beside<'a> {
    /// The snapshot's backends, where this magpie's work is read.
    pub(crate) backends: &'a [Arc<Backend>],
    /// How its conversation opens, and its body's bytes.
    pub(crate) opening: Option<(OpeningKey, u64)>,
    /// The head it shares with other conversations.
    pub(crate) head: Option<SharedHead>,
}

impl Sessions {
    /// `key`'s request was served at `backend`; `pin` says what that does
    /// to its binding. The local pin is bound at once, the store's in the
    /// background (bound if the key has none, with this magpie's work and
    /// the record of how its conversation opened, `beside`, written in the
    /// same round trip, or `stale` replaced by compare-and-set), and the
    /// local pin follows the binding that holds.
    pub(crate) fn bind_shared(
        self: &Arc<Self>,
        key: u64,
        backend: &str,
        pin: &SharedPin,
        beside: Beside<'_>,
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
        let write = match replacing {
            Some(stale) => Write::Replace { stale },
            None => {
                let opened = (beside.opening).map(|(opening, prompt_bytes)| {
                    let at = backend.clone();
                    (opening, Opened { at, prompt_bytes })
                });
                let work = fleet::own_work(beside.backends);
                let head = beside.head;
                Write::Place { work, opened, head }
            }
        };
        tokio::spawn(async move {
            let held = match write {
                Write::Replace { stale } => {
                    let deadline = store.deadline();
                    (store.replace(key, stale.as_bytes(), &backend, deadline)).await
                }
                Write::Place { work, opened, head } => {
                    let member = &sessions.fleet;
                    (store.place(key, &backend, member, work, (opened, head))).await
                }
            };
            if let Some(held) = held.filter(|held| held != backend.as_bytes()) {
                let now = std::str::from_utf8(&held).ok();
                sessions.pins.follow(key, &backend, now);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_opening_record_reads_back_and_a_bad_one_is_none() {
        let opened = Opened {
            at: "gpu-1".to_string(),
            prompt_bytes: 4096,
        };
        assert_eq!(Opened::read(opened.value().as_bytes()), Some(opened));
        for bad in ["", "gpu-1", "x:gpu-1", "12:", "-1:gpu-1", "\u{ff}"] {
            assert_eq!(Opened::read(bad.as_bytes()), None, "{bad:?}");
        }
        let long = format!("1:{}", "x".repeat(MAX_BINDING + 1));
        assert_eq!(Opened::read(long.as_bytes()), None);
    }
}
