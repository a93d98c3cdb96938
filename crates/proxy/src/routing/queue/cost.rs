//! What a request costs at each of its targets, in seconds of waiting: its
//! own wait for its first token (the work each holds, this magpie's and,
//! with a shared store, the fleet's, plus what it would still have to
//! compute of the request, over the backend's learned prefill rate), plus
//! what the conversations in flight there will put ahead of its next turn,
//! and the wait a cache elsewhere would have spared them. A conversation's
//! first request goes where it costs least; a waiting request spills where
//! it costs no more.
//!
//! Behind a request come, in a steady state, as many requests as it found
//! in flight: each such conversation's next turn. At an idle engine none,
//! and the cost is its own wait (the soonest first token); at a loaded one
//! each of those turns (the engine's mean request) comes ahead of this
//! conversation's next, and the work a cache saves is saved for each of
//! them, so under load a cache counts more than a short queue. Work no
//! cache saves counts once: a long prompt that no target caches more of
//! than another goes where its first token comes soonest, not where fewest
//! answers stream. A hot group's home fills first, and then its own queue
//! weighs against it.
//!
//! An engine that runs a fixed number of requests at once (`llama-server`'s
//! slots, learned from the engine) makes one more wait for a running one
//! to end, however long its answer: a first request goes where a slot is
//! free while any target has one, cheapest among those.

use std::sync::Arc;

use super::Ask;
use crate::routing::backend::Backend;
use crate::routing::llm::work::Work;

/// A request's targets in the order it takes them, and which it may take
/// now.
pub(super) struct Order {
    pub(super) targets: Vec<Arc<Backend>>,
    /// Placing: what it would cost at each: whether every slot there is
    /// taken ([`slots_taken`]), then [`cost`].
    costs: Vec<(bool, f64)>,
    waits_for_home: bool,
    places: bool,
}

impl Order {
    /// `ask`'s order: a conversation's first request (not waiting for a
    /// home) cheapest first ([`cheapest_first`]; an engine full for new
    /// keys last, as it takes none), else the targets' own.
    pub(super) fn of(ask: &Ask<'_>, waits_for_home: bool) -> Order {
        let places = ask.places && !waits_for_home;
        let now = tokio::time::Instant::now();
        let full = |b: &Backend| ask.limits.engine_full(b, false, now);
        let (targets, costs) = match places {
            true => cheapest_first(ask.targets, &ask.work, full)
                .into_iter()
                .unzip(),
            false => (ask.targets.to_vec(), Vec::new()),
        };
        Order {
            targets,
            costs,
            waits_for_home,
            places,
        }
    }

    /// Whether it may take `targets[i]` now: its home; placing, any target
    /// that costs no more than the cheapest; else any (the first with room).
    pub(super) fn may(&self, i: usize) -> bool {
        match (self.waits_for_home, self.places) {
            (true, _) => i == 0,
            (_, true) => self.costs[i] <= self.costs[0],
            _ => true,
        }
    }

    /// Whether, waiting, it takes another target only where that costs no
    /// more than its first.
    pub(super) fn sticky(&self) -> bool {
        self.waits_for_home || self.places
    }
}

/// What a request of `work` costs at `backend`, in seconds: its own wait
/// for a first token (the work the backend holds plus what it would still
/// have to compute of the request, [`Work::at`]), plus, for each request in
/// flight there now (awaiting its first byte, or streaming its answer: a
/// conversation whose next turn comes back there), the work of one request
/// of the backend's mean (that turn, ahead of this conversation's next) and
/// what computing this one there costs beyond the least it costs at any
/// target (what a cache elsewhere would have spared that turn); over the
/// prefill rate learned from its answers ([`crate::routing::backend::rate`];
/// `base`'s while it is not learned).
pub(super) fn cost(backend: &Backend, work: &Work, base: &Base) -> f64 {
    let live = &backend.live;
    let rate = &live.prefill_rate;
    let own = work.at(backend);
    let turn = rate.mean_tokens().unwrap_or(base.mean_tokens);
    let unsaved = own.saturating_sub(base.least) as f64;
    let behind = live.load.active() as f64;
    let tokens = live.load.held_ahead(work.class) as f64 + own as f64 + (turn + unsaved) * behind;
    tokens / rate.per_second().unwrap_or(base.rate)
}

/// What a request's targets are weighed against.
pub(super) struct Base {
    /// The least work the request would be at any target (what the cache
    /// that holds most of it leaves).
    least: u64,
    /// A backend not learned yet counts at the mean prefill rate and mean
    /// request work of those of the targets that are (all alike while none
    /// is).
    rate: f64,
    mean_tokens: f64,
}

impl Base {
    pub(super) fn of(targets: &[Arc<Backend>], work: &Work) -> Base {
        let rates = targets.iter().map(|b| &b.live.prefill_rate);
        Base {
            least: (targets.iter()).map(|b| work.at(b)).min().unwrap_or(0),
            rate: mean(rates.clone().filter_map(|r| r.per_second())).unwrap_or(1.0),
            mean_tokens: mean(rates.filter_map(|r| r.mean_tokens())).unwrap_or(0.0),
        }
    }
}

/// The mean of `values`, if any.
fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0u32), |(sum, n), v| (sum + v, n + 1));
    (n > 0).then(|| sum / f64::from(n))
}

/// Whether every slot of `backend`'s engine is taken by this magpie's
/// requests in flight (its slots learned from the engine,
/// [`crate::routing::health::EngineLoad::slots`]; never, where they are
/// not known).
fn slots_taken(backend: &Backend) -> bool {
    let live = &backend.live;
    (live.engine.slots()).is_some_and(|slots| live.load.active() >= slots)
}

/// `targets` by what a request of `work` would cost there, those with a
/// free slot first ([`slots_taken`]), cheapest first, and the cost
/// ([`cost`]; infinite where `full` says the engine takes no new key). Of
/// two that cost alike, for a request with a prompt to prefill, the one
/// with fewer requests in flight first (fewer turns come back there); then
/// the table's order, the group's home first. A conversation's first
/// request goes to the first.
fn cheapest_first(
    targets: &[Arc<Backend>],
    work: &Work,
    full: impl Fn(&Backend) -> bool,
) -> Vec<(Arc<Backend>, (bool, f64))> {
    let base = Base::of(targets, work);
    let at = |b: &Backend| match full(b) {
        true => (true, f64::INFINITY),
        false => (slots_taken(b), cost(b, work, &base)),
    };
    let mut order: Vec<(Arc<Backend>, (bool, f64))> =
        (targets.iter()).map(|b| (Arc::clone(b), at(b))).collect();
    // Of two alike (before a mean request is learned), fewer in flight
    // first; a request without a prompt keeps the table's order.
    let in_flight = |b: &Backend| (work.tokens > 0).then(|| b.live.load.active());
    order.sort_by(|(p, (a, x)), (q, (b, y))| {
        (a.cmp(b).then(x.total_cmp(y))).then(in_flight(p).cmp(&in_flight(q)))
    });
    order
}
