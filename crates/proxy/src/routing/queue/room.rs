//! Room at a backend: a slot under its `max_inflight`, its work under
//! `queue.max_prefill_tokens`, its engine (with `health.load`) not full; and
//! of a request's targets, which has room first.

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
        self.max_prefill_tokens.is_none_or(|m| held < m)
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
/// `max_prefill_tokens` of work awaiting its first byte (any, if it has
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
    if limits.engine_full(backend, kept, Instant::now()) {
        return None;
    }
    let tokens = work.at(backend);
    let max = limits.max_prefill_tokens;
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
