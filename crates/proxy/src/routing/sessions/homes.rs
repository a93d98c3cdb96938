//! Groups' homes in the shared store (`key.group_choices` above 1 with
//! `sessions.store: redis`): one script chooses and binds a new group's
//! home for every instance at once.
//!
//! A group's first prefill (its head, which no engine has seen) is the
//! longest request an engine serves, so a new group should go where no
//! other new group's request is waiting. Each magpie sees only the requests
//! it sent itself; the store sees every instance's new groups. So every
//! request that placed a new group leaves a mark in a sorted set per
//! backend (`{prefix}cold:{backend}`, scored by the store's clock) until
//! its answer's first byte of body arrives, and every home bound is kept in
//! another sorted set per backend (`{prefix}homes:{backend}`, scored by
//! when the binding's TTL ends): the heads its cache holds, as the whole
//! fleet placed them. A conversation's first request in a group that has
//! its home (a new prompt, which may bring an evicted head to prefill
//! again) is marked the same way in `{prefix}first:{backend}` by the script
//! that binds its session pin ([`Store::pin_opening`]). The script that
//! places a group, given the group and its first candidates (with this
//! instance's count of requests awaiting their first byte there), returns
//! the group's binding if it has one, else binds the group to the
//! candidate with the fewest new groups' marks, then the fewest homes, then
//! the fewest conversations' first requests (both kinds of marks), then the
//! fewest requests awaiting, then the earlier, and marks it. One magpie
//! ranks its candidates by the same four counts of its own
//! ([`crate::routing::llm::groups::least_awaiting`]), so a fleet sharing a store
//! places groups as one magpie would.
//!
//! A mark that is never removed (its magpie died half-way) stops counting
//! after [`COLD_WINDOW`]; each set of marks expires that long after its
//! last mark. A home counts for `sessions.ttl` from its binding (a group
//! that lives longer still has its binding, only no longer its count).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::time::Instant;

use super::store::{BIND_STEP, MAX_BINDING, READ_BINDING, Store};

/// How long a new group's mark counts at most.
pub(crate) const COLD_WINDOW: Duration = Duration::from_secs(30);

/// The store's clock in ms, as `now`.
const NOW: &str = r"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
";

/// KEYS[1] is the group's binding, then the candidates' sets of new groups'
/// marks, their sets of homes, their sets of first requests' marks; ARGV:
/// [`MAX_BINDING`], the TTL in ms, the window in ms, the mark, the
/// candidates' names, then their requests awaiting. Returns {the binding
/// that holds, 1 if a bad value was removed, 1 if this call bound it}.
const PLACE: &str = r"
local held, bad = read(tonumber(ARGV[1]))
if held then return {held, bad, 0} end
local n = (#KEYS - 1) / 3
local ttl, window = tonumber(ARGV[2]), tonumber(ARGV[3])
local best, best_score = 0, nil
for i = 1, n do
  local marks, homes, firsts = KEYS[1 + i], KEYS[1 + n + i], KEYS[1 + 2 * n + i]
  redis.call('ZREMRANGEBYSCORE', marks, '-inf', now - window)
  redis.call('ZREMRANGEBYSCORE', homes, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', firsts, '-inf', now - window)
  local cold = redis.call('ZCARD', marks)
  local score = {cold, redis.call('ZCARD', homes), cold + redis.call('ZCARD', firsts), tonumber(ARGV[4 + n + i])}
  local better = best == 0
  for k = 1, 4 do
    if better or score[k] ~= best_score[k] then
      better = better or score[k] < best_score[k]
      break
    end
  end
  if better then best, best_score = i, score end
end
local home = ARGV[4 + best]
redis.call('SET', KEYS[1], home, 'PX', ttl)
redis.call('ZADD', KEYS[1 + best], now, ARGV[4])
redis.call('PEXPIRE', KEYS[1 + best], window)
redis.call('ZADD', KEYS[1 + n + best], now + ttl, KEYS[1])
redis.call('PEXPIRE', KEYS[1 + n + best], ttl)
return {home, bad, 1}
";

static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{READ_BINDING}{NOW}{PLACE}")));

/// After [`BIND_STEP`] (KEYS[1] bound to ARGV[2] for ARGV[3] ms unless it
/// is bound): when this call bound it, adds the mark ARGV[4] to the set
/// KEYS[2] for ARGV[5] ms. Returns {the binding that holds now, 1 if a bad
/// value was replaced, 1 if this call bound it}.
const OPEN: &str = r"
if bound then
  redis.call('ZADD', KEYS[2], now, ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
  return {held, bad, 1}
end
return {held, bad, 0}
";

static OPEN_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{READ_BINDING}{NOW}{BIND_STEP}{OPEN}")));

/// One of a new group's first candidates, with this instance's count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candidate<'a> {
    pub(crate) name: &'a str,
    /// Requests awaiting their first byte of body there.
    pub(crate) awaiting: u64,
}

/// A group's home as the store holds it.
#[derive(Debug)]
pub(crate) struct Home {
    pub(crate) backend: String,
    /// Set when this call placed the group: its request's mark, removed
    /// when dropped (at the answer's first byte).
    pub(crate) mark: Option<AwaitingMark>,
}

/// A request's mark in one of a backend's sets (a new group's, or a
/// conversation's first request), while it awaits its first byte of body;
/// dropping it removes the mark in the background.
pub(crate) struct AwaitingMark {
    store: Arc<Store>,
    set: String,
    member: String,
}

impl std::fmt::Debug for AwaitingMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwaitingMark")
            .field("set", &self.set)
            .finish()
    }
}

impl Drop for AwaitingMark {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = Arc::clone(&self.store);
        let (set, member) = (
            std::mem::take(&mut self.set),
            std::mem::take(&mut self.member),
        );
        runtime.spawn(async move {
            let deadline = store.deadline();
            // Not answered: the mark stops counting after the window.
            let _removed: Option<i64> = store
                .run(deadline, |mut c| async move {
                    redis::cmd("ZREM")
                        .arg(&set)
                        .arg(&member)
                        .query_async(&mut c)
                        .await
                })
                .await;
        });
    }
}

/// A mark unique to this process and call.
fn next_member() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static PROCESS: LazyLock<u64> = LazyLock::new(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        magpie_core::hash::h64_parts(&[&now.to_le_bytes(), &std::process::id().to_le_bytes()])
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}-{n:x}", *PROCESS)
}

impl Store {
    /// The home of the group whose binding is under `key`: the store's, or
    /// the least busy of `candidates`, bound and marked now. `None`: no
    /// answer in time, or a candidate's name is too long to bind.
    pub(crate) async fn place_home(
        self: &Arc<Self>,
        key: u64,
        candidates: &[Candidate<'_>],
    ) -> Option<Home> {
        if candidates.is_empty() || candidates.iter().any(|c| c.name.len() > MAX_BINDING) {
            return None;
        }
        let member = next_member();
        let mut invocation = SCRIPT.key(self.key(key));
        for c in candidates {
            invocation.key(self.prefixed(&format!("cold:{}", c.name)));
        }
        for c in candidates {
            invocation.key(self.prefixed(&format!("homes:{}", c.name)));
        }
        for c in candidates {
            invocation.key(self.prefixed(&format!("first:{}", c.name)));
        }
        invocation
            .arg(MAX_BINDING)
            .arg(self.ttl_ms())
            .arg(COLD_WINDOW.as_millis() as u64)
            .arg(&member);
        for c in candidates {
            invocation.arg(c.name);
        }
        for c in candidates {
            invocation.arg(c.awaiting);
        }
        let reply: Option<(Vec<u8>, u8, u8)> = self
            .run(self.deadline(), |mut c| async move {
                invocation.invoke_async(&mut c).await
            })
            .await;
        let Some((held, bad, placed)) = reply else {
            self.fell_back();
            return None;
        };
        let backend = String::from_utf8(self.held(Some((held, bad)))?).ok()?;
        let mark = (placed == 1).then(|| AwaitingMark {
            store: Arc::clone(self),
            set: self.prefixed(&format!("cold:{backend}")),
            member,
        });
        Some(Home { backend, mark })
    }

    /// [`Store::pin`] for a conversation's first request in a group: the
    /// binding of `key`, or `choice` bound now, and then also that request's
    /// mark among the first requests awaiting at `choice`, removed when
    /// dropped (at the answer's first byte). A binding that `usable`
    /// refuses is replaced by `choice`, unmarked. `None`: route by the
    /// table (the store did not answer by `deadline`, or refused).
    pub(crate) async fn pin_opening(
        self: &Arc<Self>,
        key: u64,
        choice: &str,
        usable: impl Fn(&str) -> bool,
        deadline: Instant,
    ) -> Option<(String, Option<AwaitingMark>)> {
        if choice.len() > MAX_BINDING {
            let pinned = self.pin(key, choice, usable, deadline).await;
            return pinned.map(|p| (p, None));
        }
        let member = next_member();
        let set = self.prefixed(&format!("first:{choice}"));
        let mut invocation = OPEN_SCRIPT.key(self.key(key));
        invocation
            .key(&set)
            .arg(MAX_BINDING)
            .arg(choice)
            .arg(self.ttl_ms())
            .arg(&member)
            .arg(COLD_WINDOW.as_millis() as u64);
        let reply: Option<(Vec<u8>, u8, u8)> = self
            .run(deadline, |mut c| async move {
                invocation.invoke_async(&mut c).await
            })
            .await;
        let Some((held, bad, bound)) = reply else {
            self.fell_back();
            return None;
        };
        let held = self.held(Some((held, bad)))?;
        if bound == 1 {
            let store = Arc::clone(self);
            let mark = AwaitingMark { store, set, member };
            return Some((choice.to_owned(), Some(mark)));
        }
        let settled = self.usable_or_replaced(key, held, choice, usable, deadline);
        let Some(pin) = settled.await else {
            self.fell_back();
            return None;
        };
        pin.map(|name| (name, None))
    }
}
