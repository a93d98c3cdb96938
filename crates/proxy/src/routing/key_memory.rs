//! What routing last did with each key (the session key, with
//! `key.group`): the backend its last request went
//! to and why ([`How`](crate::routing::route::How)), where it spilled to (so it stays there), and the
//! prompt tokens the engine last reported for it (so a cache miss can be
//! told and given a cause).
//!
//! `routed ─▶ (the response streams) ─▶ served(usage)`. [`KeyMemory::routed`]
//! records the decision and says why the key moved, if it did;
//! [`KeyMemory::served`] compares the engine's `cached_tokens` with the prompt
//! the key's previous request had on record: a request whose engine served
//! fewer cached tokens than that (less [`MISS_SLACK_TOKENS`]) is a cache
//! miss, counted by [`MissCause`]. Everything here is counted in the
//! process; every magpie keeps its own memory, and the routing that reads it
//! (a spilled key stays put) depends only on loads every instance sees.
//!
//! Under a `queue`, how conversations open is remembered too: beside the
//! session keys, a record per opening (the conversation key of a body read
//! for a key, [`opening_record`]) says where the latest request that opened
//! so went, so that a new conversation that opens alike waits there for
//! the cache it shares.
//!
//! The map is bounded (`sessions.max`, or [`DEFAULT_MAX`] keys without
//! `sessions`; least recently used forgotten first) and split into shards by
//! key. A spill is remembered for `sessions.ttl`, or [`SPILL_TTL`].

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lru::LruCache;
use tokio::time::Instant;

use crate::routing::backend::Backend;
use crate::routing::backend::load::BYTES_PER_TOKEN;
use crate::routing::route::How;
use magpie_core::labels;

/// Shards of the map; a power of two.
const SHARDS: usize = 16;
/// Keys remembered without `sessions`.
pub const DEFAULT_MAX: usize = 100_000;
/// How long a key that spilled stays where it spilled without `sessions`.
pub const SPILL_TTL: Duration = Duration::from_secs(5 * 60);
/// Cached tokens may fall this short of the previous prompt without a miss:
/// engines cache whole blocks (16 tokens in vLLM), and the last partial
/// block of a prompt is not reused.
pub const MISS_SLACK_TOKENS: u64 = 32;

labels! {
    /// Why a request's engine served fewer cached prompt tokens than its
    /// key's previous request had.
    pub enum MissCause {
        /// The key left a loaded backend (or came back to its primary).
        Spill => "spill",
        /// The key's backend was down.
        BackendDown => "backend_down",
        /// The table gave the key another backend (a reload or a change of
        /// the pool).
        TableChanged => "table_changed",
        /// The key's session pin had expired or been evicted.
        PinExpired => "pin_expired",
        /// Same backend: the engine evicted the cache on its own.
        Evicted => "evicted",
    }
}

/// The key of an opening's own record ([`KeyMemory::opened`]), apart from any
/// session key's (with `key.from: conversation` the session key is the
/// opening itself).
pub fn opening_record(opening: u64) -> u64 {
    opening ^ 0x6f70_656e_696e_6773 // "openings"
}

/// One key's memory.
struct Record {
    /// Where its last request went, and why.
    backend: Arc<Backend>,
    how: How,
    at: Instant,
    /// Set while the key stays on the backend it spilled to.
    spilled: bool,
    /// The group of its last request (`key.group`), if it had one.
    group: Option<u64>,
    /// The backend and prompt tokens of its last request whose usage was read.
    served: Option<(Arc<str>, u64)>,
    /// The body bytes of its last request (mode http; 0 when unknown).
    prompt_bytes: u64,
}

/// The key's last routing decision, for admin `/route`.
#[derive(Debug, Clone)]
pub struct Last {
    pub backend: String,
    pub how: How,
    pub age: Duration,
    pub spilled: bool,
    pub prompt_tokens: Option<u64>,
    /// The group of the key's last request (`key.group`).
    pub group: Option<u64>,
}

/// What one request's route means for the key's memory.
#[derive(Debug, Clone, Copy)]
pub struct Decision {
    pub how: How,
    /// Sessions are on and the key was not routed by its pin.
    pub pin_lost: bool,
    /// The request's group (`key.group`); the memory stays the session key's.
    pub group: Option<u64>,
    /// Its body's bytes (mode http; 0 when unknown or mode tcp).
    pub prompt_bytes: u64,
}

/// A request's prefill work ([`KeyMemory::work`]), in prompt tokens.
#[derive(Debug, Clone, Default)]
pub struct Work {
    /// At a backend whose cache holds nothing of it.
    pub tokens: u64,
    /// The backend its key's previous request went to, and its work there.
    pub warm_at: Option<(Arc<Backend>, u64)>,
}

impl Work {
    /// Work that no cache holds a part of.
    pub fn cold(tokens: u64) -> Work {
        Work {
            tokens,
            warm_at: None,
        }
    }

    /// Its work at `backend`.
    pub fn at(&self, backend: &Backend) -> u64 {
        match &self.warm_at {
            Some((warm, tokens)) if warm.name == backend.name => *tokens,
            _ => self.tokens,
        }
    }
}

/// A request's usage as the engine reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    pub prompt: u64,
    pub cached: u64,
}

/// What routing did with each key, bounded, and the counts of its decisions.
pub struct KeyMemory {
    shards: Vec<Mutex<LruCache<u64, Record>>>,
    spill_ttl_ms: AtomicU64,
    routed: [AtomicU64; How::COUNT],
    misses: [AtomicU64; MissCause::COUNT],
}

impl std::fmt::Debug for KeyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyMemory").finish_non_exhaustive()
    }
}

impl KeyMemory {
    /// A memory of at most `max` keys (at least one per shard) in which a
    /// spill lasts `spill_ttl` unused.
    pub fn new(max: usize, spill_ttl: Duration) -> KeyMemory {
        let memory = KeyMemory {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(LruCache::new(NonZeroUsize::MIN)))
                .collect(),
            spill_ttl_ms: AtomicU64::new(0),
            routed: Default::default(),
            misses: Default::default(),
        };
        memory.configure(max, spill_ttl);
        memory
    }

    /// Resizes the map and sets the spill TTL (on reload); what it holds and
    /// what it counted stay.
    pub fn configure(&self, max: usize, spill_ttl: Duration) {
        let per_shard = NonZeroUsize::new(max.div_ceil(SHARDS).max(1)).unwrap_or(NonZeroUsize::MIN);
        for shard in &self.shards {
            lock(shard).resize(per_shard);
        }
        let ms = u64::try_from(spill_ttl.as_millis()).unwrap_or(u64::MAX);
        self.spill_ttl_ms.store(ms, Ordering::Relaxed);
    }

    fn shard(&self, key: u64) -> MutexGuard<'_, LruCache<u64, Record>> {
        lock(&self.shards[(key >> 60) as usize % SHARDS])
    }

    fn spill_ttl(&self) -> Duration {
        Duration::from_millis(self.spill_ttl_ms.load(Ordering::Relaxed))
    }

    /// The backend `key` spilled to, while it is used within the spill TTL.
    pub fn spilled_to(&self, key: u64) -> Option<String> {
        let ttl = self.spill_ttl();
        let mut shard = self.shard(key);
        let record = shard.peek_mut(&key)?;
        if !record.spilled {
            return None;
        }
        if record.at.elapsed() >= ttl {
            record.spilled = false;
            return None;
        }
        Some(record.backend.name.clone())
    }

    /// `key`'s request went to `backend` as `decision` says: counts it,
    /// remembers it, and says why the key moved, if it left the backend of
    /// its previous request.
    pub fn routed(
        &self,
        key: u64,
        backend: &Arc<Backend>,
        decision: Decision,
    ) -> Option<MissCause> {
        self.routed[decision.how.index()].fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut shard = self.shard(key);
        let Some(record) = shard.get_mut(&key) else {
            shard.push(
                key,
                Record {
                    backend: Arc::clone(backend),
                    how: decision.how,
                    at: now,
                    spilled: decision.how.is_load_spill(),
                    served: None,
                    group: decision.group,
                    prompt_bytes: decision.prompt_bytes,
                },
            );
            return None;
        };
        let stayed = record.backend.name == backend.name;
        let moved = (!stayed).then(|| moved_cause(record, decision));
        record.spilled = if stayed {
            decision.how.is_load_spill() || (record.spilled && decision.how == How::Pinned)
        } else {
            decision.how.is_load_spill()
        };
        if !stayed {
            record.backend = Arc::clone(backend);
        }
        record.how = decision.how;
        record.at = now;
        record.group = decision.group;
        record.prompt_bytes = decision.prompt_bytes;
        moved
    }

    /// A request whose conversation opens as `opening` (its conversation
    /// key) went to `backend` with a body of `prompt_bytes`: the opening's
    /// record ([`opening_record`]) says so, for the next conversation that
    /// opens alike ([`KeyMemory::opened_at`], [`KeyMemory::work`]). Nothing is
    /// counted.
    pub fn opened(&self, opening: u64, backend: &Arc<Backend>, prompt_bytes: u64) {
        let key = opening_record(opening);
        let mut shard = self.shard(key);
        let record = Record {
            backend: Arc::clone(backend),
            how: How::Primary,
            at: Instant::now(),
            spilled: false,
            served: None,
            group: None,
            prompt_bytes,
        };
        shard.put(key, record);
    }

    /// Where the latest request that opened as `opening` went
    /// ([`KeyMemory::opened`]).
    pub fn opened_at(&self, opening: u64) -> Option<Arc<Backend>> {
        let key = opening_record(opening);
        self.shard(key).get(&key).map(|r| Arc::clone(&r.backend))
    }

    /// `key`'s request was answered by `backend` with `tokens`: a cache miss
    /// (fewer cached tokens than the key's previous prompt) is counted and
    /// returned, with `moved` (from [`KeyMemory::routed`]) as its cause when the
    /// key changed backends, else [`MissCause::Evicted`].
    pub fn served(
        &self,
        key: u64,
        backend: &str,
        tokens: Tokens,
        moved: Option<MissCause>,
    ) -> Option<MissCause> {
        let mut shard = self.shard(key);
        let record = shard.peek_mut(&key)?;
        let previous = record.served.take();
        let same = previous.as_ref().is_some_and(|(b, _)| &**b == backend);
        let name = match &previous {
            Some((b, _)) if same => Arc::clone(b),
            _ => Arc::from(backend),
        };
        record.served = Some((name, tokens.prompt));
        drop(shard);
        let (_, prompt) = previous?;
        if tokens.cached.saturating_add(MISS_SLACK_TOKENS) >= prompt {
            return None;
        }
        let cause = if same {
            MissCause::Evicted
        } else {
            moved.unwrap_or(MissCause::TableChanged)
        };
        self.misses[cause.index()].fetch_add(1, Ordering::Relaxed);
        Some(cause)
    }

    /// The work a request of `key` with a body of `bytes` brings: its
    /// prompt tokens anywhere, less, at the backend its key's previous
    /// request went to, the prefix that request left in the cache. Tokens
    /// are told from bytes by the previous request's own ratio when its
    /// usage was read, else at [`BYTES_PER_TOKEN`].
    pub fn work(&self, key: u64, bytes: u64) -> Work {
        let shard = self.shard(key);
        let Some(r) = shard.peek(&key).filter(|r| r.prompt_bytes > 0) else {
            return Work::cold(bytes / BYTES_PER_TOKEN);
        };
        let tokens = |bytes: u64| match &r.served {
            Some((_, served)) => {
                let scaled = u128::from(bytes) * u128::from(*served) / u128::from(r.prompt_bytes);
                u64::try_from(scaled).unwrap_or(u64::MAX)
            }
            None => bytes / BYTES_PER_TOKEN,
        };
        Work {
            tokens: tokens(bytes),
            warm_at: Some((
                Arc::clone(&r.backend),
                tokens(bytes.saturating_sub(r.prompt_bytes)),
            )),
        }
    }

    /// `key`'s last decision, without touching its recency.
    pub fn last(&self, key: u64) -> Option<Last> {
        let shard = self.shard(key);
        let r = shard.peek(&key)?;
        Some(Last {
            backend: r.backend.name.clone(),
            how: r.how,
            age: r.at.elapsed(),
            spilled: r.spilled && r.at.elapsed() < self.spill_ttl(),
            prompt_tokens: r.served.as_ref().map(|(_, p)| *p),
            group: r.group,
        })
    }

    /// Requests (or connections) routed so far for `how`.
    pub fn routed_total(&self, how: How) -> u64 {
        self.routed[how.index()].load(Ordering::Relaxed)
    }

    /// Cache misses counted so far for `cause`.
    pub fn misses_total(&self, cause: MissCause) -> u64 {
        self.misses[cause.index()].load(Ordering::Relaxed)
    }
}

/// Why a key left the backend of its previous request for the one
/// `decision` chose.
fn moved_cause(previous: &Record, decision: Decision) -> MissCause {
    // Away from a down primary, going (or staying) away, or coming back.
    let down = !previous.backend.live.health.is_up()
        || decision.how == How::SpilledDown
        || previous.how == How::SpilledDown;
    if down {
        MissCause::BackendDown
    } else if decision.how.is_load_spill() || previous.spilled {
        MissCause::Spill
    } else if decision.pin_lost {
        MissCause::PinExpired
    } else {
        MissCause::TableChanged
    }
}

/// A poisoned lock only means another thread panicked while holding it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
