//! Room at a backend: a slot under its `max_inflight`, its work under
//! `queue.max_prefill_tokens` and the room its engine's KV cache keeps
//! ([`SlotLimits::max_work`]), its engine (with `health.load`) not full;
//! and of a request's targets, which has room first.

use std::sync::Arc;

use tokio::time::Instant;

use crate::config::{LoadLimits, QueueConfig};
use crate::routing::backend::{ActiveGuard, Backend, WorkGuard};
use crate::routing::llm::work::Work;

/// Room at a backend: its slot and the request's work there.
pub(crate) type Room = (ActiveGuard, WorkGuard);

/// What a backend with room is under: in flight, work, its engine's load.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotLimits {
    /// A backend's own `max_inflight` goes first.
    pub(crate) max_inflight: u64,
    pub(crate) max_prefill_tokens: Option<u64>,
    pub(crate) load: Option<LoadLimits>,
}

impl SlotLimits {
    /// Whether `backend` holds less work than `max_prefill_tokens` ahead of
    /// a request of `class` (a read: [`room`] takes it).
    pub(crate) fn work_room(&self, backend: &Backend, class: Option<usize>) -> bool {
        let held = backend.live.load.held_ahead(class);
        self.max_work(backend, Instant::now())
            .is_none_or(|m| held < m)
    }

    /// The most work `backend` holds ahead of a request before it takes no
    /// more: `max_prefill_tokens`, and with `health.load` the room its
    /// engine's KV cache keeps of what no running request holds
    /// ([`crate::routing::health::EngineLoad::fresh_kv_room`]), whichever is
    /// less. Prefill queued inside an engine beyond that room pushes out,
    /// as it is computed, what the requests queued behind it would have
    /// found cached; held here instead, they wait for the engine that holds
    /// their cache and go in as room comes.
    pub(crate) fn max_work(&self, backend: &Backend, now: Instant) -> Option<u64> {
        let engine = &backend.live.engine;
        let room = (self.load.as_ref())
            .and_then(|l| engine.fresh_kv_room(now, l.max_age))
            .map(|tokens| tokens as u64);
        match (self.max_prefill_tokens, room) {
            (Some(max), Some(room)) => Some(max.min(room)),
            (max, room) => max.or(room),
        }
    }

    pub(crate) fn of(queue: &QueueConfig, load: Option<&LoadLimits>) -> SlotLimits {
        SlotLimits {
            max_inflight: queue.max_inflight,
            max_prefill_tokens: queue.max_prefill_tokens,
            load: load.copied(),
        }
    }

    /// Whether `backend`'s engine (with `health.load`) takes no request
    /// now: none new when it is full for new keys, none at all when it is
    /// far over (for a request `kept` there, its pin).
    pub(crate) fn engine_full(&self, backend: &Backend, kept: bool, now: Instant) -> bool {
        let engine = &backend.live.engine;
        self.load.as_ref().is_some_and(|l| match kept {
            true => engine.far_over(l, now),
            false => engine.full_for_new_keys(l, now),
        })
    }
}

/// A slot at `backend` if it has room: fewer than its limit in flight
/// (its own `max_inflight`, else the queue's), less than
/// [`SlotLimits::max_work`] of work awaiting its first byte (any, if it has
/// none; of the request's class and the higher ones, where engines take the
/// class), and its engine (with `health.load`) not full: for a request
/// `kept` there (its key's pin), not far over, as a route keeps a pin.
pub(crate) fn room(
    backend: &Arc<Backend>,
    limits: &SlotLimits,
    work: &Work,
    kept: bool,
) -> Option<Room> {
    let limit = backend.max_inflight.unwrap_or(limits.max_inflight);
    let now = Instant::now();
    if limits.engine_full(backend, kept, now) {
        return None;
    }
    let tokens = work.at(backend);
    let max = limits.max_work(backend, now);
    let (slot, held) = (backend.live).try_reserve_work(limit, tokens, max, work.class)?;
    Some((
        slot,
        held.with_system_head(work.system_head.map(|(hash, _)| hash)),
    ))
}

/// The first of `targets` that `may` take it and has room, and its slot;
/// `pinned`: the first is the request's pin.
pub(super) fn first_with_room(
    targets: &[Arc<Backend>],
    limits: &SlotLimits,
    work: &Work,
    pinned: bool,
    may: impl Fn(usize) -> bool,
) -> Option<(usize, Room)> {
    (0..targets.len())
        .filter(|&i| may(i))
        .find_map(|i| room(&targets[i], limits, work, pinned && i == 0).map(|r| (i, r)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::BackendConfig;
    use crate::routing::backend::Live;
    use crate::routing::health::exposition::Sample;

    fn backend() -> Arc<Backend> {
        let config = BackendConfig::local("a", 1);
        Arc::new(Backend::new(&config, Arc::new(Live::default())))
    }

    const LOAD: LoadLimits = LoadLimits {
        max_waiting: None,
        max_kv_usage: 0.95,
        max_age: Duration::from_secs(5),
    };

    #[tokio::test(start_paused = true)]
    async fn an_engine_takes_no_more_prefill_than_its_cache_keeps_unheld() {
        let a = backend();
        let limits = SlotLimits {
            max_inflight: 8,
            max_prefill_tokens: None,
            load: Some(LOAD),
        };
        // A cache of 4,000 tokens, half held by running requests.
        let sample = Sample {
            kv_usage: Some(0.5),
            kv_capacity: Some(4000.0),
            ..Sample::default()
        };
        a.live.engine.record(sample, Instant::now());
        assert_eq!(limits.max_work(&a, Instant::now()), Some(2000));
        // None awaiting: any request, however long, goes in.
        let long = room(&a, &limits, &Work::cold(2500), false).expect("room");
        assert!(room(&a, &limits, &Work::cold(10), false).is_none());
        drop(long);
        let first = room(&a, &limits, &Work::cold(1500), false).expect("room");
        let second = room(&a, &limits, &Work::cold(700), false).expect("1,500 < 2,000");
        assert!(room(&a, &limits, &Work::cold(10), true).is_none(), "2,200");
        assert!(!limits.work_room(&a, None));
        drop(second);
        assert!(limits.work_room(&a, None));
        // max_prefill_tokens, where less, bounds it.
        let tighter = SlotLimits {
            max_prefill_tokens: Some(1000),
            ..limits
        };
        assert_eq!(tighter.max_work(&a, Instant::now()), Some(1000));
        assert!(room(&a, &tighter, &Work::cold(10), false).is_none());
        // A usage older than max_age bounds nothing; nor without health.load.
        tokio::time::advance(LOAD.max_age + Duration::from_millis(1)).await;
        assert_eq!(limits.max_work(&a, Instant::now()), None);
        let unloaded = SlotLimits {
            load: None,
            ..limits
        };
        assert_eq!(unloaded.max_work(&a, Instant::now()), None);
        let third = room(&a, &limits, &Work::cold(5000), false).expect("no bound");
        drop((first, third));
    }
}
