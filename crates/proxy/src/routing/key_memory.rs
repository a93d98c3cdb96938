//! The key memory: what routing last did with each key (the session key,
//! with `key.group`): the backend its last request went to and why
//! ([`How`]), and where it spilled to, so that it stays there.
//!
//! `routed ─▶ (what it sent, what its engine reported)`.
//! [`KeyMemory::routed`] records the decision, counts it by [`How`] and
//! says why the key moved ([`MissCause`]), if it left the backend of its
//! previous request. Beside the decision, each record keeps a [`Note`] for
//! the LLM policy ([`crate::routing::llm`]: what the request sent, what its
//! engine last reported), which reads and writes it through
//! [`KeyMemory::note`] and [`KeyMemory::note_mut`], and which keeps records
//! of its own under other keys ([`KeyMemory::keep`], [`MemoryKey`]).
//! Everything here is counted in the process; every magpie keeps its own
//! memory, and the routing that reads it (a spilled key stays put) depends
//! only on loads every instance sees.
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
use crate::routing::keys::{GroupKey, MemoryKey, SessionKey};
use crate::routing::llm::note::{Note, Sent};
use crate::routing::route::How;
use magpie_core::labels;

/// Shards of the map; a power of two.
const SHARDS: usize = 16;
/// Keys remembered without `sessions`.
pub(crate) const DEFAULT_MAX: usize = 100_000;
/// How long a key that spilled stays where it spilled without `sessions`.
pub(crate) const SPILL_TTL: Duration = Duration::from_secs(5 * 60);

labels! {
    /// Why a key left the backend of its previous request, and so why its
    /// engine may have served fewer cached prompt tokens than that request
    /// had (a cache miss, [`crate::routing::llm::usage`]).
    pub(crate) enum MissCause {
        /// The key left a loaded backend (or came back to its primary).
        Spill => "spill",
        /// The key's backend was down.
        BackendDown => "backend_down",
        /// The table gave the key another backend (a reload or a change of
        /// the pool).
        TableChanged => "table_changed",
        /// The key's session pin had expired or been evicted.
        PinExpired => "pin_expired",
        /// The engine evicted the cache on its own (the key stayed, or
        /// left it for that: `how="evicted"`).
        Evicted => "evicted",
    }
}

/// One key's memory.
struct Record {
    /// Where its last request went, and why.
    backend: Arc<Backend>,
    how: How,
    at: Instant,
    /// Set while the key stays on the backend it spilled to.
    spilled: bool,
    /// What the LLM policy keeps with it.
    note: Note,
}

/// The key's last routing decision, for admin `/route`.
#[derive(Debug, Clone)]
pub(crate) struct Last {
    pub(crate) backend: String,
    pub(crate) how: How,
    pub(crate) age: Duration,
    pub(crate) spilled: bool,
    pub(crate) prompt_tokens: Option<u64>,
    /// The group of the key's last request (`key.group`).
    pub(crate) group: Option<GroupKey>,
}

/// What one request's route means for the key's memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decision {
    pub(crate) how: How,
    /// Sessions are on and the key was not routed by its pin.
    pub(crate) pin_lost: bool,
    /// What the request sent, for the LLM policy's note.
    pub(crate) sent: Sent,
}

/// What routing did with each key, bounded, and the counts of its decisions.
pub(crate) struct KeyMemory {
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
    pub(crate) fn new(max: usize, spill_ttl: Duration) -> KeyMemory {
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
    pub(crate) fn configure(&self, max: usize, spill_ttl: Duration) {
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
    pub(crate) fn spilled_to(&self, key: SessionKey) -> Option<String> {
        let ttl = self.spill_ttl();
        let key = key.memory().hash();
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
    pub(crate) fn routed(
        &self,
        key: SessionKey,
        backend: &Arc<Backend>,
        decision: Decision,
    ) -> Option<MissCause> {
        self.routed[decision.how.index()].fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let key = key.memory().hash();
        let mut shard = self.shard(key);
        let Some(record) = shard.get_mut(&key) else {
            shard.push(
                key,
                Record {
                    backend: Arc::clone(backend),
                    how: decision.how,
                    at: now,
                    spilled: decision.how.is_load_spill(),
                    note: Note::of(decision.sent),
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
        record.note.sent = decision.sent;
        moved
    }

    /// `key`'s latest request went to `backend` having sent `sent`, as the
    /// fleet's shared store says (through another magpie, maybe): noted
    /// unless this memory's own note is as recent (it sent as many bytes
    /// or more). Its bytes-to-tokens ratio, if known, is kept. Nothing is
    /// counted.
    pub(crate) fn sent_elsewhere(&self, key: SessionKey, backend: &Arc<Backend>, sent: Sent) {
        let key = key.memory().hash();
        let mut shard = self.shard(key);
        let ratio = match shard.peek(&key) {
            Some(r) if r.note.sent.prompt_bytes >= sent.prompt_bytes => return,
            Some(r) if r.note.sent.prompt_bytes > 0 => {
                (r.note.served.clone()).map(|served| (served, r.note.sent.prompt_bytes))
            }
            _ => None,
        };
        let mut note = Note::of(sent);
        note.served = ratio.map(|((name, tokens), bytes)| {
            let scaled = u128::from(tokens) * u128::from(sent.prompt_bytes) / u128::from(bytes);
            (name, u64::try_from(scaled).unwrap_or(u64::MAX))
        });
        let record = Record {
            backend: Arc::clone(backend),
            how: How::Pinned,
            at: Instant::now(),
            spilled: false,
            note,
        };
        shard.put(key, record);
    }

    /// Keeps a record under `key` (not a session key's: see [`MemoryKey`])
    /// that says a request went to `backend` having sent `sent`, in place
    /// of any before it. Nothing is counted.
    pub(crate) fn keep(&self, key: MemoryKey, backend: &Arc<Backend>, sent: Sent) {
        let key = key.hash();
        let record = Record {
            backend: Arc::clone(backend),
            how: How::Primary,
            at: Instant::now(),
            spilled: false,
            note: Note::of(sent),
        };
        self.shard(key).put(key, record);
    }

    /// Where the request `key`'s record was last kept for went
    /// ([`KeyMemory::keep`]); the record counts as used now.
    pub(crate) fn kept_at(&self, key: MemoryKey) -> Option<Arc<Backend>> {
        let key = key.hash();
        self.shard(key).get(&key).map(|r| Arc::clone(&r.backend))
    }

    /// The backend of `key`'s record and its note, without touching its
    /// recency.
    pub(crate) fn note(&self, key: MemoryKey) -> Option<(Arc<Backend>, Note)> {
        let key = key.hash();
        let shard = self.shard(key);
        let r = shard.peek(&key)?;
        Some((Arc::clone(&r.backend), r.note.clone()))
    }

    /// `f` applied to `key`'s note, if it has a record, without touching
    /// its recency.
    pub(crate) fn note_mut<R>(&self, key: SessionKey, f: impl FnOnce(&mut Note) -> R) -> Option<R> {
        let key = key.memory().hash();
        let mut shard = self.shard(key);
        shard.peek_mut(&key).map(|r| f(&mut r.note))
    }

    /// `key`'s last decision, without touching its recency.
    pub(crate) fn last(&self, key: SessionKey) -> Option<Last> {
        let key = key.memory().hash();
        let shard = self.shard(key);
        let r = shard.peek(&key)?;
        Some(Last {
            backend: r.backend.name.clone(),
            how: r.how,
            age: r.at.elapsed(),
            spilled: r.spilled && r.at.elapsed() < self.spill_ttl(),
            prompt_tokens: r.note.served.as_ref().map(|(_, p)| *p),
            group: r.note.sent.group,
        })
    }

    /// Requests (or connections) routed so far for `how`.
    pub(crate) fn routed_total(&self, how: How) -> u64 {
        self.routed[how.index()].load(Ordering::Relaxed)
    }

    /// Counts a cache miss for `cause`.
    pub(crate) fn count_miss(&self, cause: MissCause) {
        self.misses[cause.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Cache misses counted so far for `cause`.
    pub(crate) fn misses_total(&self, cause: MissCause) -> u64 {
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
    } else if decision.how == How::Evicted {
        MissCause::Evicted
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
pub(crate) mod tests;
