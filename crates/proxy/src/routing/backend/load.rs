//! A backend's load: what bounded load counts and what the `active` gauges
//! show.
//!
//! `active` is the number of connections (mode tcp) or requests in flight
//! (mode http) a backend carries, taken through an `ActiveGuard` and given
//! back when it drops; `upstream` is the number of open upstream
//! connections in mode http, pooled and busy; `awaiting` is the number of
//! requests sent to it (mode http) whose answer has not yet brought a byte
//! of body: for an inference engine, the requests queued or in prefill,
//! which is what a new group's first conversation would wait behind; of
//! those, `awaiting_openings` opened a conversation (with
//! `key.group_choices` above 1: a new prompt, whose head the engine may
//! have to prefill again), and of these `awaiting_cold` placed a new group,
//! the long prefills of heads the engine has not seen. `prefill_tokens`
//! is their work (with `queue`): the prompt tokens they are estimated to
//! still have to prefill, each request's size less the prefix its key's
//! previous request left in that backend's cache
//! ([`crate::routing::llm::work`]), reserved with the slot at
//! admission and given back at the answer's first byte. `fleet_tokens` is
//! the work the other magpies sharing a store hold there
//! ([`crate::routing::sessions::fleet`]); the queue weighs and bounds
//! both together ([`Load::held_tokens`]). Where engines take the class
//! (`queue.priority.engine`), the work is counted by class too
//! (`by_class`), since a request waits inside the engine only behind its
//! own class and the higher ones ([`Load::held_ahead`]). `computed` counts the work whose
//! answer began: the tokens this magpie had the backend prefill, which is
//! what pushes older prefixes out of its cache ([`super::Live::holds_head`]).
//! Taking a slot under a cap is
//! one atomic step, so concurrent accepts never push a backend past its
//! bounded-load cap.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::MAX_CLASSES;

#[derive(Debug, Default)]
pub(crate) struct Load {
    active: AtomicU64,
    upstream: AtomicU64,
    awaiting: AtomicU64,
    awaiting_openings: AtomicU64,
    awaiting_cold: AtomicU64,
    prefill_tokens: AtomicU64,
    fleet_tokens: AtomicU64,
    computed: AtomicU64,
    /// Of `prefill_tokens`, the work of each class, for requests counted
    /// by class.
    by_class: [AtomicU64; MAX_CLASSES],
}

/// What a request awaiting its first byte of body is, for the counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Awaiting {
    /// A later turn of a conversation, or a request without sessions.
    Turn,
    /// A conversation's first request (its session pin bound by it).
    Opening,
    /// A conversation's first request that also placed a new group.
    NewGroup,
}

impl Load {
    /// Connections (mode http: requests) in flight.
    pub(crate) fn active(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    /// Open upstream connections (mode http).
    pub(crate) fn upstream_connections(&self) -> u64 {
        self.upstream.load(Ordering::Relaxed)
    }

    /// Requests (mode http) sent and not yet answered with a byte of body.
    pub(crate) fn awaiting(&self) -> u64 {
        self.awaiting.load(Ordering::Relaxed)
    }

    /// Of those, the requests that opened a conversation (new groups' too).
    pub(crate) fn awaiting_openings(&self) -> u64 {
        self.awaiting_openings.load(Ordering::Relaxed)
    }

    /// Of those, the requests that placed a new group.
    pub(crate) fn awaiting_cold(&self) -> u64 {
        self.awaiting_cold.load(Ordering::Relaxed)
    }

    /// The prompt tokens the requests awaiting their first byte are
    /// estimated to still have to prefill (with `queue`).
    pub(crate) fn prefill_tokens(&self) -> u64 {
        self.prefill_tokens.load(Ordering::Relaxed)
    }

    /// The work the other magpies sharing a store hold here, as last read.
    pub(crate) fn fleet_tokens(&self) -> u64 {
        self.fleet_tokens.load(Ordering::Relaxed)
    }

    /// Sets the other magpies' work here; returns what it was.
    pub(crate) fn set_fleet_work(&self, tokens: u64) -> u64 {
        self.fleet_tokens.swap(tokens, Ordering::Relaxed)
    }

    /// All the work held here: this magpie's and the others'.
    pub(crate) fn held_tokens(&self) -> u64 {
        self.prefill_tokens().saturating_add(self.fleet_tokens())
    }

    /// The work a request of `class` waits behind inside an engine that
    /// takes the class: that of its class and the higher ones, the
    /// fleet's counted; all of it for a request not counted by class.
    pub(crate) fn held_ahead(&self, class: Option<usize>) -> u64 {
        match class.filter(|c| *c < MAX_CLASSES) {
            Some(class) => self.with_fleet(&self.by_class[..=class]),
            None => self.held_tokens(),
        }
    }

    /// The work `counters` hold, and the fleet's.
    fn with_fleet(&self, counters: &[AtomicU64]) -> u64 {
        (counters.iter())
            .map(|w| w.load(Ordering::Relaxed))
            .fold(self.fleet_tokens(), u64::saturating_add)
    }

    /// The prompt tokens this magpie had the backend prefill, all told.
    pub(crate) fn computed(&self) -> u64 {
        self.computed.load(Ordering::Relaxed)
    }

    pub(super) fn count_computed(&self, tokens: u64) {
        self.computed.fetch_add(tokens, Ordering::Relaxed);
    }

    /// The counters a request of `kind` counts in.
    fn counters(&self, kind: Awaiting) -> impl Iterator<Item = &AtomicU64> {
        let depth = match kind {
            Awaiting::Turn => 1,
            Awaiting::Opening => 2,
            Awaiting::NewGroup => 3,
        };
        [&self.awaiting, &self.awaiting_openings, &self.awaiting_cold]
            .into_iter()
            .take(depth)
    }

    pub(super) fn start_awaiting(&self, kind: Awaiting) {
        for counter in self.counters(kind) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) fn stop_awaiting(&self, kind: Awaiting) {
        for counter in self.counters(kind) {
            counter.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Adds `tokens` of work if less than `max` is held (for a request of
    /// a `class`, less than [`Load::held_ahead`] it), the fleet's counted
    /// (any, without a maximum or when none is held): the check and the
    /// addition are one atomic step, so concurrent admissions (of one
    /// class) never both pass a full one.
    pub(super) fn try_add_work(&self, tokens: u64, max: Option<u64>, class: Option<usize>) -> bool {
        let (counter, ahead) = match class.filter(|c| *c < MAX_CLASSES) {
            None => (&self.prefill_tokens, self.fleet_tokens()),
            // The higher classes' work, and the fleet's.
            Some(c) => (&self.by_class[c], self.with_fleet(&self.by_class[..c])),
        };
        let added = counter
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
                let held = w.saturating_add(ahead);
                (max.is_none_or(|m| held < m)).then_some(w.saturating_add(tokens))
            })
            .is_ok();
        if added && class.is_some_and(|c| c < MAX_CLASSES) {
            self.prefill_tokens.fetch_add(tokens, Ordering::Relaxed);
        }
        added
    }

    pub(super) fn add_work(&self, tokens: u64, class: Option<usize>) {
        self.prefill_tokens.fetch_add(tokens, Ordering::Relaxed);
        if let Some(c) = class.and_then(|c| self.by_class.get(c)) {
            c.fetch_add(tokens, Ordering::Relaxed);
        }
    }

    pub(super) fn remove_work(&self, tokens: u64, class: Option<usize>) {
        self.prefill_tokens.fetch_sub(tokens, Ordering::Relaxed);
        if let Some(c) = class.and_then(|c| self.by_class.get(c)) {
            c.fetch_sub(tokens, Ordering::Relaxed);
        }
    }

    /// Takes one slot unconditionally.
    pub(super) fn take(&self) {
        self.active.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one slot if fewer than `cap` are taken: the check and the
    /// increment are one atomic step.
    pub(super) fn try_take(&self, cap: u64) -> bool {
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < cap).then_some(n + 1)
            })
            .is_ok()
    }

    pub(super) fn give_back(&self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
    }

    pub(super) fn open_upstream(&self) {
        self.upstream.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn close_upstream(&self) {
        self.upstream.fetch_sub(1, Ordering::Relaxed);
    }
}
