//! When a request's first token would come at each of its targets: the
//! work each holds (this magpie's and, with a shared store, the fleet's),
//! plus what it would still have to compute of the request, weighed by the
//! backend's learned prefill rate. A conversation's first request goes
//! where it is soonest; a waiting request spills where it is no later.

use std::sync::Arc;

use super::Ask;
use crate::routing::backend::Backend;
use crate::routing::llm::work::Work;

/// A request's targets in the order it takes them, and which it may take
/// now.
pub(super) struct Order {
    pub(super) targets: Vec<Arc<Backend>>,
    /// Placing: when its first token would come at each.
    soon: Vec<f64>,
    waits_for_home: bool,
    places: bool,
}

impl Order {
    /// `ask`'s order: a conversation's first request (not waiting for a
    /// home) soonest first ([`soonest_first`]), else the targets' own.
    pub(super) fn of(ask: &Ask<'_>, waits_for_home: bool) -> Order {
        let places = ask.places && !waits_for_home;
        let (targets, soon) = match places {
            true => soonest_first(ask.targets, &ask.work).into_iter().unzip(),
            false => (ask.targets.to_vec(), Vec::new()),
        };
        Order {
            targets,
            soon,
            waits_for_home,
            places,
        }
    }

    /// Whether it may take `targets[i]` now: its home; placing, any target
    /// as soon as the soonest; else any (the first with room).
    pub(super) fn may(&self, i: usize) -> bool {
        match (self.waits_for_home, self.places) {
            (true, _) => i == 0,
            (_, true) => self.soon[i] <= self.soon[0],
            _ => true,
        }
    }

    /// Whether, waiting, it takes another target only where that is no
    /// later than its first.
    pub(super) fn sticky(&self) -> bool {
        self.waits_for_home || self.places
    }
}

/// When a request of `work` would have its first token at `backend`: the
/// work it holds awaiting a first byte plus what it would still have to
/// compute of the request ([`Work::at`]), over its prefill rate as learned
/// from its answers ([`crate::routing::backend::rate`]; `unknown` while it
/// is not learned).
pub(super) fn ahead(backend: &Backend, work: &Work, unknown: f64) -> f64 {
    let held = backend.live.load.held_tokens();
    let tokens = held.saturating_add(work.at(backend)) as f64;
    tokens / backend.live.prefill_rate.per_second().unwrap_or(unknown)
}

/// The rate a backend whose rate is not learned yet counts at: the mean of
/// those of `targets` that are (all alike while none is).
pub(super) fn unlearned_rate(targets: &[Arc<Backend>]) -> f64 {
    let learned: Vec<f64> = (targets.iter())
        .filter_map(|b| b.live.prefill_rate.per_second())
        .collect();
    match learned.len() {
        0 => 1.0,
        n => learned.iter().sum::<f64>() / n as f64,
    }
}

/// `targets` by when a request of `work` would have its first token there,
/// soonest first, and when ([`ahead`]; ties keep the table's order, the
/// group's home first). A conversation's first request goes to the first.
fn soonest_first(targets: &[Arc<Backend>], work: &Work) -> Vec<(Arc<Backend>, f64)> {
    let unknown = unlearned_rate(targets);
    let mut order: Vec<(Arc<Backend>, f64)> = (targets.iter())
        .map(|b| (Arc::clone(b), ahead(b, work, unknown)))
        .collect();
    order.sort_by(|(_, x), (_, y)| x.total_cmp(y));
    order
}
