//! The fleet's work (`queue` with `sessions.store: redis`): every magpie
//! sharing a store counts the prefill work all of them hold at each
//! backend, so they place and wait as one.
//!
//! One magpie sees only the requests it sent itself: behind a load balancer
//! that alternates between two, each would see an engine half as busy as it
//! is, and send it a new conversation the other just filled it with. So
//! every [`PERIOD`] each magpie writes its own work per backend (the
//! `magpie_backend_prefill_tokens` it holds) under a key of its own,
//! `{prefix}work:{id}`, that expires after [`LIFETIME`], and notes its id in
//! a sorted set, `{prefix}fleet`, scored by the store's clock; the same
//! script returns every other live magpie's work. Each backend's sum is its
//! fleet work ([`crate::routing::backend::load`]): the queue adds it to the
//! backend's own when it weighs where a first request costs least, whether a
//! spill pays, and whether work has room. A magpie that stops writing (it
//! died, or lost the store) stops counting after [`LIFETIME`]; while this
//! one gets no answer, it counts the others' work as none.
//!
//! The work is written as lines of `name` TAB `tokens`; at most
//! [`MAX_VALUE`] bytes of each value are read, and a line that does not
//! parse, or names no backend of this table, counts nothing.
//!
//! Every [`PERIOD`] is too slow for a burst: conversations that open
//! within a few milliseconds of each other through two magpies would each
//! be placed on the other's work as it was up to two periods ago, and land
//! together. So the round trips requests make anyway carry the fleet's
//! work too, with no round trip of their own
//! ([`crate::routing::sessions::placed`]): every request's pin lookup
//! writes this magpie's work (every request it sent before counted), the
//! lookup that finds no binding returns the others' work as they last
//! wrote it, fresh at placement, and the binding written once a backend
//! took the request writes this magpie's work again, its new request
//! counted.
//!
//! Requests that come at one instant through two magpies cannot see each
//! other that way: every lookup of a burst is answered before either magpie
//! placed anything, so both place on the view from before it and fill the
//! same engine. So a conversation's first request, once placed while other
//! magpies are live, writes this magpie's work with it counted and reads
//! the others' again in one more round trip ([`crowded`]); the store runs
//! these one after another, so of two placed at one instant the later
//! sees the earlier, and if the others' work at its backend grew since its
//! lookup it is placed again on the fresh view
//! ([`crate::routing::decision`]). Later turns, which go to their pin, and
//! a magpie alone make no such round trip.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Member;
use super::store::Store;
use crate::routing::backend::Backend;
use crate::routing::instance::Instance;

/// How often each magpie writes its work and reads the others'.
pub(crate) const PERIOD: Duration = Duration::from_millis(100);
/// How long a magpie's work counts after it last wrote it.
pub(crate) const LIFETIME: Duration = Duration::from_secs(2);
/// The most bytes of one magpie's work read.
pub(crate) const MAX_VALUE: usize = 64 * 1024;

/// Lua functions on the fleet's keys and arguments, found from KEYS[k] and
/// ARGV[a] on ([`Member::add`]): the set of live magpies and this one's
/// work key; this magpie's id, the lifetime in ms, the prefix of work
/// keys, [`MAX_VALUE`] and (to write) this magpie's work. `write` keeps
/// this magpie's work and notes its id at the store's clock; `others`
/// returns every other live magpie's work.
pub(super) const FUNCTIONS: &str = r"
local function fleet(k, a)
  return {set = KEYS[k], key = KEYS[k + 1], id = ARGV[a], life = tonumber(ARGV[a + 1]),
    prefix = ARGV[a + 2], max = tonumber(ARGV[a + 3]), work = ARGV[a + 4]}
end
local function write(f)
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  redis.call('SET', f.key, f.work, 'PX', f.life)
  redis.call('ZADD', f.set, now, f.id)
  redis.call('ZREMRANGEBYSCORE', f.set, '-inf', now - f.life)
  redis.call('PEXPIRE', f.set, f.life)
end
local function others(f)
  local out = {}
  for _, id in ipairs(redis.call('ZRANGE', f.set, 0, -1)) do
    if id ~= f.id then
      local key = f.prefix .. id
      if redis.call('TYPE', key)['ok'] == 'string' and redis.call('STRLEN', key) <= f.max then
        table.insert(out, redis.call('GET', key))
      end
    end
  end
  return out
end
";

/// Writes this magpie's work and returns every other live magpie's.
const SHARE: &str = "local f = fleet(1, 1)\nwrite(f)\nreturn others(f)\n";

static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{FUNCTIONS}{SHARE}")));

impl Member {
    /// Adds the fleet's keys and arguments to `invocation`, after those it
    /// has: with `work`, this magpie's work to write.
    pub(super) fn add(
        &self,
        invocation: &mut redis::ScriptInvocation<'_>,
        store: &Store,
        work: Option<String>,
    ) {
        invocation
            .key(store.prefixed("fleet"))
            .key(store.prefixed(&format!("work:{}", self.id)))
            .arg(&*self.id)
            .arg(LIFETIME.as_millis() as u64)
            .arg(store.prefixed("work:"))
            .arg(MAX_VALUE);
        if let Some(work) = work {
            invocation.arg(work);
        }
    }
}

/// This magpie's work at `backends`, as it is written: a line of name TAB
/// tokens for each backend where it holds any.
pub(crate) fn own_work(backends: &[Arc<Backend>]) -> String {
    let mut own = String::new();
    for b in backends {
        let tokens = b.live.load.prefill_tokens();
        if tokens > 0 {
            own.push_str(&format!("{}\t{tokens}\n", b.name));
        }
    }
    own
}

/// Shares the work every [`PERIOD`] while `instance` has a queue and a
/// shared store, until `shutdown`.
pub(crate) async fn run(instance: Arc<Instance>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let sessions = instance.sessions();
        let shared = sessions
            .as_ref()
            .and_then(|s| Some((s.store.as_ref()?, &s.fleet)));
        let snapshot = instance.snapshot.load_full();
        let others = match shared.filter(|_| snapshot.config.queue.is_some()) {
            Some((store, member)) => share(store, member, &snapshot.backends).await,
            None => Some(HashMap::new()),
        };
        // No answer: the others' work counts as none until one comes.
        apply(
            &instance.snapshot.load().backends,
            &others.unwrap_or_default(),
        );
    }
}

/// Writes this magpie's work at `backends`, and returns the others'
/// summed by backend name; `None` without an answer.
async fn share(
    store: &Arc<Store>,
    member: &Member,
    backends: &[Arc<Backend>],
) -> Option<HashMap<String, u64>> {
    let own = own_work(backends);
    let mut invocation = SCRIPT.prepare_invoke();
    member.add(&mut invocation, store, Some(own));
    let reply: Vec<Vec<u8>> = store
        .run(store.deadline(), |mut c| async move {
            invocation.invoke_async(&mut c).await
        })
        .await?;
    Some(sum(&reply))
}

/// A conversation's first request was placed at `at` on the others' work
/// as its lookup read it: writes this magpie's work at `backends` (the
/// request counted) and reads the others' again. Whether their work at `at`
/// grew meanwhile (another magpie placed a request there since, maybe at
/// the same instant: this one is placed again on the fresh view); `false`
/// without an answer within the store's timeout.
pub(crate) async fn crowded(
    store: &Arc<Store>,
    member: &Member,
    backends: &[Arc<Backend>],
    at: &Backend,
) -> bool {
    let before = at.live.load.fleet_tokens();
    let Some(others) = share(store, member, backends).await else {
        return false;
    };
    apply(backends, &others);
    at.live.load.fleet_tokens() > before
}

/// The work in `values` (lines of name TAB tokens), by backend name.
pub(crate) fn sum(values: &[Vec<u8>]) -> HashMap<String, u64> {
    let mut by_name: HashMap<String, u64> = HashMap::new();
    for value in values {
        let text = String::from_utf8_lossy(&value[..value.len().min(MAX_VALUE)]);
        for line in text.lines() {
            let Some((name, tokens)) = line.split_once('\t') else {
                continue;
            };
            if let Ok(tokens) = tokens.parse::<u64>() {
                let held = by_name.entry(name.to_owned()).or_default();
                *held = held.saturating_add(tokens);
            }
        }
    }
    by_name
}

/// Sets each of `backends`' fleet work; a backend whose fleet work fell
/// tells the requests waiting for it.
pub(crate) fn apply(backends: &[Arc<Backend>], others: &HashMap<String, u64>) {
    for b in backends {
        let tokens = others.get(&b.name).copied().unwrap_or(0);
        let before = b.live.load.set_fleet_work(tokens);
        if tokens < before
            && let Some(waiters) = b.live.waiters.get()
        {
            waiters.slot_freed(&b.live);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_summed_by_name_and_bad_lines_count_nothing() {
        let values = vec![
            b"a\t100\nb\t5\n".to_vec(),
            b"a\t50\nnot a line\nb\tmany\n\t7\n".to_vec(),
        ];
        let sum = sum(&values);
        assert_eq!(sum.get("a"), Some(&150));
        assert_eq!(sum.get("b"), Some(&5));
        assert_eq!(sum.get(""), Some(&7));
        assert_eq!(sum.len(), 3);
    }
}
