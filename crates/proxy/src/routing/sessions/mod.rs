//! Session pins (`sessions: { ttl, max }`, `mode: http`): a key's first
//! request is placed by the table; later requests of that key go to the same
//! backend while the key keeps being used within `ttl` and that backend is up
//! and in the table, even after a reload added replicas. New keys spread over
//! the new table at once; live conversations keep their warm caches.
//!
//! The map is bounded (`max` entries, least recently used evicted first) and
//! split into shards by key, so concurrent requests rarely wait on one lock.
//! A pin names its backend by name: identity is the name, so a pin survives
//! reloads that keep the backend. Without `sessions`, routing stays stateless
//! and every instance agrees.
//!
//! With `key.group_choices` above 1 the same map (and store) also holds each
//! group's home, under [`group_pin`]: a key no session has, counted in no
//! session's hits or misses.

pub(crate) mod fleet;
pub(crate) mod homes;
pub(crate) mod placed;
pub(crate) mod store;

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lru::LruCache;
use tokio::time::Instant;

use crate::routing::keys::GroupKey;

/// Shards of the map; a power of two.
const SHARDS: usize = 16;

struct Pin {
    backend: Arc<str>,
    last_used: Instant,
    /// When the shared store was last asked to extend (or re-bind) this
    /// pin's binding (`store: redis`); `None`: due now.
    refreshed: Option<Instant>,
}

/// The pins of one process.
pub(crate) struct Pins {
    shards: Vec<Mutex<LruCache<u64, Pin>>>,
    ttl: Duration,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

impl std::fmt::Debug for Pins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pins")
            .field("len", &self.len())
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl Pins {
    /// A map of at most `max` pins (at least one per shard), each released
    /// after `ttl` unused.
    pub(crate) fn new(max: usize, ttl: Duration) -> Pins {
        let per_shard = NonZeroUsize::new(max.div_ceil(SHARDS).max(1)).unwrap_or(NonZeroUsize::MIN);
        Pins {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(LruCache::new(per_shard)))
                .collect(),
            ttl,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, LruCache<u64, Pin>> {
        // The low bits pick the table slot; the high ones pick the shard.
        let m = &self.shards[(key >> 60) as usize % SHARDS];
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The backend `key` is pinned to, if the pin is alive; counts a hit or a
    /// miss. An expired pin is removed.
    pub(crate) fn get(&self, key: u64) -> Option<Arc<str>> {
        let mut shard = self.shard(key);
        let found = match shard.get(&key) {
            Some(pin) if pin.last_used.elapsed() < self.ttl => Some(Arc::clone(&pin.backend)),
            Some(_) => {
                shard.pop(&key);
                None
            }
            None => None,
        };
        drop(shard);
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Like [`Pins::get`], and whether the shared store's TTL for the pin is
    /// due for a refresh (none for `every` so far); a due pin counts as
    /// refreshed from now.
    pub(crate) fn get_and_due(&self, key: u64, every: Duration) -> Option<(Arc<str>, bool)> {
        let backend = self.get(key)?;
        Some((backend, self.due(key, every)))
    }

    /// Like [`Pins::get_and_due`], counting neither a hit nor a miss (a
    /// group's pin, which is not a session's).
    pub(crate) fn peek_and_due(&self, key: u64, every: Duration) -> Option<(Arc<str>, bool)> {
        let backend = self.peek(key)?;
        Some((backend, self.due(key, every)))
    }

    /// Whether `key`'s binding in the shared store is due for a refresh;
    /// if so, it counts as refreshed from now.
    fn due(&self, key: u64, every: Duration) -> bool {
        let mut shard = self.shard(key);
        match shard.peek_mut(&key) {
            Some(pin) if pin.refreshed.is_none_or(|at| at.elapsed() >= every) => {
                pin.refreshed = Some(Instant::now());
                true
            }
            _ => false,
        }
    }

    /// The refresh of `key`'s pin to `backend` got no answer: it is due
    /// again (the next use asks once more).
    pub(crate) fn refresh_failed(&self, key: u64, backend: &str) {
        if let Some(pin) = self.shard(key).peek_mut(&key)
            && &*pin.backend == backend
        {
            pin.refreshed = None;
        }
    }

    /// The shared store binds `key` to `now`, not to the cached `was`: the
    /// pin follows (it stays as used as it was); `None` (the store holds no
    /// backend's name) drops it, so the next request asks the store.
    pub(crate) fn follow(&self, key: u64, was: &str, now: Option<&str>) {
        let mut shard = self.shard(key);
        let Some(pin) = shard.peek_mut(&key) else {
            return;
        };
        if &*pin.backend != was {
            return;
        }
        match now {
            Some(now) => pin.backend = Arc::from(now),
            None => {
                shard.pop(&key);
            }
        }
    }

    /// Uses the pin of `key` now (it lives another `ttl`).
    pub(crate) fn touch(&self, key: u64) {
        if let Some(pin) = self.shard(key).peek_mut(&key) {
            pin.last_used = Instant::now();
        }
    }

    /// What `key` is pinned to, without counting or refreshing it.
    pub(crate) fn peek(&self, key: u64) -> Option<Arc<str>> {
        let shard = self.shard(key);
        shard
            .peek(&key)
            .filter(|pin| pin.last_used.elapsed() < self.ttl)
            .map(|pin| Arc::clone(&pin.backend))
    }

    /// Pins `key` to `backend` (or refreshes the pin), as used now.
    pub(crate) fn bind(&self, key: u64, backend: &str) {
        let mut shard = self.shard(key);
        if let Some(pin) = shard.get_mut(&key)
            && &*pin.backend == backend
        {
            pin.last_used = Instant::now();
            return;
        }
        let now = Instant::now();
        let pin = Pin {
            backend: Arc::from(backend),
            last_used: now,
            refreshed: Some(now),
        };
        self.push(&mut shard, key, pin);
    }

    /// Puts `pin` in `shard`, counting the pin it evicts (if another key's).
    fn push(&self, shard: &mut LruCache<u64, Pin>, key: u64, pin: Pin) {
        if let Some((evicted, _)) = shard.push(key, pin)
            && evicted != key
        {
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every live pin, with how long it has been unused: what a hand-over
    /// to the next process carries.
    pub(crate) fn export(&self) -> Vec<(u64, Arc<str>, Duration)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            out.extend(
                (shard.iter())
                    .map(|(&key, pin)| (key, Arc::clone(&pin.backend), pin.last_used.elapsed()))
                    .filter(|(_, _, idle)| *idle < self.ttl),
            );
        }
        out
    }

    /// Pins `key` to `backend` as last used `idle` ago (handed over by the
    /// process before this one); due for a refresh in a shared store.
    pub(crate) fn import(&self, key: u64, backend: &str, idle: Duration) {
        let Some(last_used) = Instant::now().checked_sub(idle) else {
            return;
        };
        if idle >= self.ttl {
            return;
        }
        let pin = Pin {
            backend: Arc::from(backend),
            last_used,
            refreshed: None,
        };
        self.push(&mut self.shard(key), key, pin);
    }

    /// Pins held now (expired ones not yet removed included).
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counts a pin found (a hit) or not (a miss) elsewhere: in the shared
    /// store, read first under a queue.
    pub(crate) fn count(&self, hit: bool) {
        let counter = if hit { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub(crate) fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    pub(crate) fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

/// Where a group's pin (`key.group`) is kept, in the map and in the shared
/// store: its hash with a fixed pattern flipped, so it is no session's key.
/// Every instance computes the same.
pub(crate) fn group_pin(group: GroupKey) -> u64 {
    group.hash() ^ 0x6772_6f75_702d_7069 // "group-pi"
}

/// This magpie in the fleet sharing a store ([`fleet`]): its id, unique
/// to this process and instance, kept across reloads and restarts of the
/// sharing task (so its work is never counted twice, as its own and as
/// another's).
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub(super) id: Arc<str>,
}

impl Default for Member {
    fn default() -> Self {
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
        Member {
            id: Arc::from(format!("{id:016x}")),
        }
    }
}

/// The session pins of one process, and the shared store behind them.
#[derive(Debug)]
pub(crate) struct Sessions {
    pub(crate) pins: Pins,
    /// `store: redis`; `None` keeps pins in this process only.
    pub(crate) store: Option<Arc<store::Store>>,
    pub(crate) ttl: Duration,
    /// This magpie in the fleet sharing the store ([`fleet`]).
    pub(crate) fleet: Member,
}

impl Sessions {
    /// Pins for `config`, for `fleet`; a shared store starts connecting in
    /// the background.
    pub(crate) fn new(config: &crate::config::SessionsConfig, fleet: Member) -> Sessions {
        let store = config.redis.clone().map(|redis| {
            let store = Arc::new(store::Store::new(redis, config.ttl));
            store.start();
            store
        });
        Sessions {
            pins: Pins::new(config.max, config.ttl),
            store,
            ttl: config.ttl,
            fleet,
        }
    }

    /// With a shared store: the cached pin of `key`, and whether its
    /// binding in the store is due for a refresh (at most once per
    /// `ttl / 4`, and only while the store is asked at all; a store that
    /// dropped its connection is reconnected meanwhile).
    pub(crate) fn cached(&self, key: u64) -> Option<(Arc<str>, bool)> {
        match &self.store {
            Some(store) if store.is_usable() => self.pins.get_and_due(key, self.ttl / 4),
            Some(store) => {
                store.ensure_connecting();
                self.pins.get(key).map(|backend| (backend, false))
            }
            None => self.pins.get(key).map(|backend| (backend, false)),
        }
    }

    /// Like [`Sessions::cached`] for a group's pin (counted as no session
    /// pin's hit or miss).
    pub(crate) fn cached_group(&self, group: GroupKey) -> Option<(Arc<str>, bool)> {
        let at = group_pin(group);
        match &self.store {
            Some(store) if store.is_usable() => self.pins.peek_and_due(at, self.ttl / 4),
            _ => self.pins.peek(at).map(|backend| (backend, false)),
        }
    }

    /// Refreshes `key`'s binding to its cached `backend` in the background:
    /// the store extends it, or binds it again if it was lost. If another
    /// instance bound the key to another backend meanwhile, the store's
    /// binding wins and the cached pin follows it.
    pub(crate) fn refresh(self: &Arc<Self>, key: u64, backend: Arc<str>) {
        let sessions = Arc::clone(self);
        tokio::spawn(async move {
            let Some(store) = &sessions.store else {
                return;
            };
            match store.refresh(key, &backend).await {
                // The store failed and backs off: ask again at the first use
                // once it is back. (An operation refused alone waits its
                // `ttl / 4` like any refresh, so a key cannot storm it.)
                None if !store.is_usable() => sessions.pins.refresh_failed(key, &backend),
                None => {}
                Some(held) if held == backend.as_bytes() => {}
                Some(held) => {
                    let now = std::str::from_utf8(&held).ok();
                    sessions.pins.follow(key, &backend, now);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pins_live_while_used_within_ttl() {
        let pins = Pins::new(100, Duration::from_secs(60));
        assert_eq!(pins.get(1), None);
        pins.bind(1, "a");
        tokio::time::advance(Duration::from_secs(50)).await;
        assert_eq!(pins.get(1).as_deref(), Some("a"));
        pins.bind(1, "a");
        tokio::time::advance(Duration::from_secs(50)).await;
        assert_eq!(pins.peek(1).as_deref(), Some("a"));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(pins.get(1), None);
        assert_eq!((pins.hits(), pins.misses()), (1, 2));
        assert!(pins.is_empty());
    }

    #[test]
    fn the_map_is_bounded_and_evicts_the_least_recent() {
        let pins = Pins::new(SHARDS, Duration::from_secs(60));
        // Two keys in the same shard, one slot each.
        let (k1, k2) = (1u64, 2u64);
        pins.bind(k1, "a");
        pins.bind(k2, "b");
        assert_eq!(pins.peek(k1), None);
        assert_eq!(pins.peek(k2).as_deref(), Some("b"));
        assert_eq!(pins.evictions(), 1);
        pins.bind(k2, "c");
        assert_eq!(pins.peek(k2).as_deref(), Some("c"));
        assert_eq!(pins.evictions(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refresh_is_due_once_per_period_and_again_after_a_failure() {
        let pins = Pins::new(100, Duration::from_secs(60));
        let every = Duration::from_secs(15);
        let due = |pins: &Pins| pins.get_and_due(1, every).map(|(_, due)| due);
        pins.bind(1, "a");
        assert_eq!(due(&pins), Some(false));
        tokio::time::advance(every).await;
        assert_eq!(due(&pins), Some(true));
        assert_eq!(due(&pins), Some(false));
        // A failure for another backend's refresh changes nothing.
        pins.refresh_failed(1, "b");
        assert_eq!(due(&pins), Some(false));
        pins.refresh_failed(1, "a");
        assert_eq!(due(&pins), Some(true));
        assert_eq!(due(&pins), Some(false));
    }

    #[test]
    fn a_cached_pin_follows_the_store_only_from_what_it_was() {
        let pins = Pins::new(100, Duration::from_secs(60));
        pins.bind(1, "a");
        // Re-bound locally meanwhile: an older answer does not apply.
        pins.follow(1, "b", Some("c"));
        assert_eq!(pins.peek(1).as_deref(), Some("a"));
        pins.follow(1, "a", Some("d"));
        assert_eq!(pins.peek(1).as_deref(), Some("d"));
        // The store holds no backend's name: the pin goes.
        pins.follow(1, "d", None);
        assert_eq!(pins.peek(1), None);
        pins.follow(2, "a", Some("b"));
        assert!(pins.is_empty());
    }
}
