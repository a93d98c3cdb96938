//! Which backends one connection or request will try, in order: the key's
//! candidates from the table, filtered by an accept policy.
//!
//! `key ─▶ snapshot.candidates(key) ─▶ accept? ─▶ Route { targets }`. The
//! selector (the table's candidate walk) knows nothing of health or load; the
//! policy here decides, for each candidate in turn, whether it may take the
//! key: a backend marked down is skipped, and so is one at its bounded-load
//! cap. At most `connect.attempts` targets are kept. When health leaves
//! nobody, `health.when_all_down` decides: try the candidates anyway, primary
//! first (fail open), or refuse.
//!
//! Both data paths and the admin endpoint's `/route` ask this module, so a
//! question about a key gets the answer traffic gets. Only the data paths
//! count skipped candidates as spills ([`Route::plan`]); a question does not
//! ([`Route::preview`]).
//!
//! A backend's load can change between planning and connecting, so taking a
//! slot re-checks the cap atomically ([`Route::reserve`]): concurrent
//! connections never push a backend past it.

use std::sync::Arc;

use crate::backend::{ActiveGuard, Backend, Spill};
use crate::config::AllDown;
use crate::placement::{MAX_CANDIDATES, bounded};
use crate::snapshot::Snapshot;

/// The bounded-load caps in force when a route was planned.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Caps {
    factor: f64,
    /// Active connections (or requests) across the pool, before this one.
    total_load: u64,
    total_weight: u64,
}

impl Caps {
    fn of(backend: &Backend, caps: Option<Caps>) -> u64 {
        match caps {
            Some(c) => bounded::cap(c.factor, c.total_load, backend.weight, c.total_weight),
            None => u64::MAX,
        }
    }
}

/// The backends one connection or request will try, in order.
#[derive(Debug)]
pub struct Route {
    pub targets: Vec<Arc<Backend>>,
    /// `None` when no cap applies (no bounded load, or a fail-open route).
    caps: Option<Caps>,
}

impl Route {
    /// The route for traffic: skipped candidates are counted as spills.
    pub fn plan(snapshot: &Snapshot, key: u64) -> Route {
        select(snapshot, key, |backend, why| {
            backend.live.traffic.count_spill(why)
        })
    }

    /// The route for traffic whose key is pinned to `pin` (session pins):
    /// the pinned backend first while it is up and under its cap, then the
    /// key's other candidates. A pin that cannot take the request is passed
    /// over like any candidate, and the route is the table's.
    pub fn plan_pinned(snapshot: &Snapshot, key: u64, pin: &Arc<Backend>) -> Route {
        Route::plan(snapshot, key).pin_first(snapshot, pin)
    }

    /// This route with `pin` tried first, if it is up, under its cap and
    /// its engine not far over its load limits.
    pub fn pin_first(mut self, snapshot: &Snapshot, pin: &Arc<Backend>) -> Route {
        let far_over = (snapshot.config.load_limits())
            .is_some_and(|l| pin.live.engine.far_over(l, tokio::time::Instant::now()));
        let takes = pin.live.health.is_up()
            && pin.live.load.active() < Caps::of(pin, self.caps)
            && !far_over;
        if takes {
            self.targets.retain(|b| !Arc::ptr_eq(b, pin));
            self.targets.insert(0, Arc::clone(pin));
            self.targets
                .truncate(snapshot.config.connect.attempts as usize);
        }
        self
    }

    /// The route a key would take now, counting nothing (admin `/route`).
    pub fn preview(snapshot: &Snapshot, key: u64) -> Route {
        select(snapshot, key, |_, _| {})
    }

    /// The backend traffic would go to first, if any.
    pub fn first(&self) -> Option<&Arc<Backend>> {
        self.targets.first()
    }

    /// Takes one active slot on `backend` if it is still under its cap (the
    /// check and the increment are one atomic step). A backend that filled up
    /// since the route was planned is counted as a spill and gives `None`.
    pub fn reserve(&self, backend: &Arc<Backend>) -> Option<ActiveGuard> {
        if self.caps.is_none() {
            return Some(backend.live.reserve());
        }
        let guard = backend.live.try_reserve(Caps::of(backend, self.caps));
        if guard.is_none() {
            backend.live.traffic.count_spill(Spill::AtCap);
        }
        guard
    }
}

/// Walks `key`'s candidates and keeps those the policy accepts, calling
/// `on_skip` for each one passed over.
fn select(snapshot: &Snapshot, key: u64, mut on_skip: impl FnMut(&Backend, Spill)) -> Route {
    let config = &snapshot.config;
    let attempts = config.connect.attempts as usize;
    let caps = config.placement.bounded_load.map(|factor| Caps {
        factor,
        total_load: snapshot.total_active(),
        total_weight: snapshot.total_weight,
    });
    let engine = config
        .load_limits()
        .map(|l| (l, tokio::time::Instant::now()));
    let mut targets = Vec::with_capacity(attempts);
    let mut skipped_down = false;
    for backend in snapshot.candidates(key) {
        let skip = if !backend.live.health.is_up() {
            Some(Spill::Down)
        } else if backend.live.load.active() >= Caps::of(backend, caps) {
            Some(Spill::AtCap)
        } else if engine.is_some_and(|(l, now)| backend.live.engine.full_for_new_keys(l, now)) {
            Some(Spill::EngineFull)
        } else {
            None
        };
        match skip {
            Some(why) => {
                skipped_down |= why == Spill::Down;
                on_skip(backend, why);
            }
            None => {
                targets.push(Arc::clone(backend));
                if targets.len() == attempts {
                    break;
                }
            }
        }
    }
    if targets.is_empty() {
        let when_all_down = config
            .health
            .as_ref()
            .map(|h| h.when_all_down)
            .unwrap_or(AllDown::TryAnyway);
        // Everyone was down (or full, which a factor >= 1 only allows in a
        // pool larger than MAX_CANDIDATES): fail open, primary first, unless
        // told to refuse.
        if !(skipped_down && when_all_down == AllDown::Refuse) {
            targets.extend(snapshot.candidates(key).take(attempts).cloned());
            return Route {
                targets,
                caps: None,
            };
        }
    }
    debug_assert!(targets.len() <= MAX_CANDIDATES);
    Route { targets, caps }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn snapshot(extra: &str) -> Snapshot {
        let text = format!(
            "listen: 127.0.0.1:7000\n{extra}backends:\n  - {{name: a, addr: 127.0.0.1:8001}}\n  - {{name: b, addr: 127.0.0.1:8002}}\n  - {{name: c, addr: 127.0.0.1:8003}}\n"
        );
        let config = Config::parse(std::path::Path::new("t.yaml"), &text).unwrap();
        Snapshot::build(Arc::new(config), 1, &Default::default()).unwrap()
    }

    fn names(route: &Route) -> Vec<&str> {
        route.targets.iter().map(|b| b.name.as_str()).collect()
    }

    #[test]
    fn down_backends_are_skipped_and_counted_only_for_traffic() {
        let s = snapshot("");
        let order: Vec<String> = s.candidates(42).map(|b| b.name.clone()).collect();
        let primary = s.backend(&order[0]).unwrap();
        primary.live.health.set_up(false);
        assert_eq!(names(&Route::preview(&s, 42)), [&order[1], &order[2]]);
        assert_eq!(primary.live.traffic.spills_total(), 0);
        assert_eq!(names(&Route::plan(&s, 42)), [&order[1], &order[2]]);
        assert_eq!(primary.live.traffic.spills_total(), 1);
    }

    #[test]
    fn all_down_fails_open_or_refuses() {
        let s = snapshot("");
        for b in &s.backends {
            b.live.health.set_up(false);
        }
        let order: Vec<String> = s.candidates(7).map(|b| b.name.clone()).collect();
        assert_eq!(names(&Route::preview(&s, 7)), order);
        let s = snapshot("health: {when_all_down: refuse}\n");
        for b in &s.backends {
            b.live.health.set_up(false);
        }
        assert!(Route::preview(&s, 7).targets.is_empty());
    }

    #[test]
    fn attempts_bound_the_targets() {
        let s = snapshot("connect: {attempts: 2}\n");
        assert_eq!(Route::plan(&s, 9).targets.len(), 2);
    }

    #[test]
    fn a_backend_at_its_cap_is_skipped_and_reserve_rechecks() {
        let s = snapshot("placement: {bounded_load: 1.0}\n");
        let order: Vec<String> = s.candidates(5).map(|b| b.name.clone()).collect();
        let primary = Arc::clone(s.backend(&order[0]).unwrap());
        // One active connection in a pool of three: cap = ceil(1 · 2 / 3) = 1.
        let _held = primary.live.reserve();
        let route = Route::plan(&s, 5);
        assert_eq!(route.first().unwrap().name, order[1]);
        assert_eq!(primary.live.traffic.spills_total(), 1);
        // Reserving on a full backend fails and counts another spill.
        assert!(route.reserve(&primary).is_none());
        assert_eq!(primary.live.traffic.spills_total(), 2);
        assert!(route.reserve(route.first().unwrap()).is_some());
    }
}
