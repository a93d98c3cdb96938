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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::store::Store;
use crate::routing::instance::Instance;

/// How often each magpie writes its work and reads the others'.
pub(crate) const PERIOD: Duration = Duration::from_millis(100);
/// How long a magpie's work counts after it last wrote it.
pub(crate) const LIFETIME: Duration = Duration::from_secs(2);
/// The most bytes of one magpie's work read.
pub(crate) const MAX_VALUE: usize = 64 * 1024;

/// KEYS[1] is the set of live magpies, KEYS[2] this one's work; ARGV: this
/// magpie's work, its id, the lifetime in ms, the prefix of work keys, and
/// [`MAX_VALUE`]. Returns every other live magpie's work.
const SHARE: &str = r"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local life = tonumber(ARGV[3])
redis.call('SET', KEYS[2], ARGV[1], 'PX', life)
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - life)
redis.call('PEXPIRE', KEYS[1], life)
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if id ~= ARGV[2] then
    local key = ARGV[4] .. id
    if redis.call('TYPE', key)['ok'] == 'string' and redis.call('STRLEN', key) <= tonumber(ARGV[5]) then
      table.insert(out, redis.call('GET', key))
    end
  end
end
return out
";

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SHARE));

/// A new id in the fleet: unique to this process and call (each run of the
/// task, each instance in one process).
fn new_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let id = magpie_core::hash::h64_parts(&[
        &now.to_le_bytes(),
        &std::process::id().to_le_bytes(),
        &n.to_le_bytes(),
    ]);
    format!("{id:016x}")
}

/// Shares the work every [`PERIOD`] while `instance` has a queue and a
/// shared store, until `shutdown`.
pub(crate) async fn run(instance: Arc<Instance>, shutdown: CancellationToken) {
    let id = new_id();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let store = instance.sessions().and_then(|s| s.store.clone());
        let queued = instance.snapshot.load().config.queue.is_some();
        let others = match store.filter(|_| queued) {
            Some(store) => share(&instance, &store, &id).await,
            None => Some(HashMap::new()),
        };
        // No answer: the others' work counts as none until one comes.
        apply(&instance, &others.unwrap_or_default());
    }
}

/// Writes this magpie's work, and returns the others' summed by backend
/// name; `None` without an answer.
async fn share(instance: &Instance, store: &Arc<Store>, id: &str) -> Option<HashMap<String, u64>> {
    let snapshot = instance.snapshot.load();
    let mut own = String::new();
    for b in &snapshot.backends {
        let tokens = b.live.load.prefill_tokens();
        if tokens > 0 {
            own.push_str(&format!("{}\t{tokens}\n", b.name));
        }
    }
    let mut invocation = SCRIPT.key(store.prefixed("fleet"));
    invocation
        .key(store.prefixed(&format!("work:{id}")))
        .arg(own)
        .arg(id)
        .arg(LIFETIME.as_millis() as u64)
        .arg(store.prefixed("work:"))
        .arg(MAX_VALUE);
    let reply: Vec<Vec<u8>> = store
        .run(store.deadline(), |mut c| async move {
            invocation.invoke_async(&mut c).await
        })
        .await?;
    Some(sum(&reply))
}

/// The work in `values` (lines of name TAB tokens), by backend name.
fn sum(values: &[Vec<u8>]) -> HashMap<String, u64> {
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

/// Sets each backend's fleet work; a backend whose fleet work fell tells
/// the requests waiting for it.
fn apply(instance: &Instance, others: &HashMap<String, u64>) {
    for b in &instance.snapshot.load().backends {
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
