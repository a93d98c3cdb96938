//! Which backends one connection or request will try, in order: the key's
//! candidates from the table, filtered by an accept policy.
//!
//! `key ─▶ snapshot.candidates(key) ─▶ accept? ─▶ Route { targets }`. The
//! selector (the table's candidate walk) knows nothing of health or load; the
//! policy here decides, for each candidate in turn, whether it may take the
//! key: a backend marked down is skipped, and so is one at its bounded-load
//! cap, or whose engine reports itself full (`health.load`: its queue or KV
//! cache over the limits; a pinned key stays unless it is far over). At most
//! `connect.attempts` targets are kept; under a `queue`, every candidate that
//! takes the key, for the queue to choose among (where a first request
//! costs least, where a spill pays), and the plan still connects at most
//! `connect.attempts` times ([`kept`]). When health leaves nobody, `health.when_all_down` decides: try the candidates anyway, primary
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
//!
//! The cap is two thresholds ([`bounded::spill_cap`]): a candidate is full
//! only when it is at `bounded_load` times its share *and* at least
//! `placement.spill_min_excess` above its mean, so an ordinary burst spills
//! nothing. A key that did spill stays where it spilled while it keeps being
//! used, and goes back to its primary only once that one is below its mean
//! ([`Route::plan_remembered`], with the key's [`crate::routing::key_memory`] record).
//!
//! Every route says why its first target was chosen ([`How`]), which traffic
//! counts in `magpie_requests_routed_total{how}`.

use std::sync::Arc;

use crate::config::{AllDown, Config};
use crate::routing::backend::{ActiveGuard, Backend, Spill, WorkGuard};
use crate::routing::snapshot::Snapshot;
use magpie_core::labels;
use std::time::Duration;

use tokio::time::Instant;

use magpie_core::placement::{MAX_CANDIDATES, bounded, slow_start};

labels! {
    /// Why a request (or connection) went to the backend it went to.
    pub(crate) enum How {
        /// The key's first candidate in the table.
        Primary => "primary",
        /// Its pin: a session pin, or where it spilled before.
        Pinned => "pinned",
        /// Its group's home (`key.group_choices`), which is not the table's
        /// first that takes it.
        GroupHome => "group_home",
        /// A conversation's first request, to where the latest one that
        /// opened alike went (`queue`), which is not the table's first.
        Opening => "opening",
        /// A later turn whose pin's engine had likely evicted its
        /// conversation's cache, placed where its first token comes
        /// soonest (`queue`), which is not its pin.
        Evicted => "evicted",
        /// Its first candidate was at its bounded-load cap.
        SpilledAtCap => "spilled_at_cap",
        /// Its first candidate was down (or refused the connection).
        SpilledDown => "spilled_down",
        /// Its first candidate's engine reported itself full.
        SpilledEngineFull => "spilled_engine_full",
        /// Its first candidate is warming up (`placement.slow_start`) and
        /// has not taken this key over yet.
        SlowStart => "slow_start",
        /// No key was found: the configured fallback key was routed.
        FallbackKey => "fallback_key",
    }
}

impl How {
    /// The reason a route passed over its first candidate.
    pub(crate) fn of_spill(why: Spill) -> How {
        match why {
            Spill::Down => How::SpilledDown,
            Spill::AtCap => How::SpilledAtCap,
            Spill::EngineFull => How::SpilledEngineFull,
            Spill::SlowStart => How::SlowStart,
        }
    }

    /// The reason once the target this one named was passed over for `why`
    /// while connecting: a primary or pinned choice becomes that spill; a
    /// spill or a fallback key keeps its reason.
    pub(crate) fn passed_over(self, why: Spill) -> How {
        match self {
            How::Primary | How::Pinned | How::GroupHome | How::Opening | How::Evicted => {
                How::of_spill(why)
            }
            other => other,
        }
    }

    /// Whether the key left its first candidate because that one was loaded
    /// (not down): such a key stays where it spilled.
    pub(crate) fn is_load_spill(self) -> bool {
        matches!(self, How::SpilledAtCap | How::SpilledEngineFull)
    }
}

/// The bounded-load caps in force when a route was planned.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Caps {
    factor: f64,
    min_excess: u64,
    /// Active connections (or requests) across the pool, before this one.
    total_load: u64,
    total_weight: u64,
}

/// A key pinned by `sessions` keeps its backend until that one holds this
/// many times its bounded-load cap: a pin's backend at its cap is loaded,
/// not failing, and moving the key would throw its cache away for a share
/// of load that new keys rebalance. (A key that spilled and stays, without
/// sessions, stays only while its backend is under the cap itself.)
pub(crate) const PIN_CAP_FACTOR: u64 = 2;

impl Caps {
    /// The bound a pinned key's backend keeps it under.
    fn pinned(backend: &Backend, caps: Option<Caps>) -> u64 {
        Caps::of(backend, caps).saturating_mul(PIN_CAP_FACTOR)
    }

    fn of(backend: &Backend, caps: Option<Caps>) -> u64 {
        match caps {
            Some(c) => bounded::spill_cap(
                c.factor,
                c.min_excess,
                c.total_load,
                backend.weight,
                c.total_weight,
            ),
            None => u64::MAX,
        }
    }
}

/// The backends one connection or request will try, in order.
#[derive(Debug)]
pub(crate) struct Route {
    pub(crate) targets: Vec<Arc<Backend>>,
    /// Why the first target is first.
    pub(crate) how: How,
    /// `None` when no cap applies (no bounded load, or a fail-open route).
    caps: Option<Caps>,
    /// The first target is the session's pin, which keeps its key up to
    /// [`PIN_CAP_FACTOR`] times its cap.
    session_pin: bool,
}

impl Route {
    /// The route for traffic: skipped candidates are counted as spills.
    pub(crate) fn plan(snapshot: &Snapshot, key: u64) -> Route {
        select(snapshot, key, |backend, why| {
            backend.live.traffic.count_spill(why)
        })
    }

    /// The route for traffic, with the key's memory: a key that spilled
    /// because its primary was loaded stays on the backend it spilled to
    /// (while that one is up and has room) until the primary is below its
    /// mean share again; then it goes home.
    /// `spilled_to` is where the key spilled, from [`crate::routing::key_memory`].
    pub(crate) fn plan_remembered(
        snapshot: &Snapshot,
        key: u64,
        spilled_to: Option<&str>,
    ) -> Route {
        let route = Route::plan(snapshot, key);
        let Some(spilled_to) = spilled_to else {
            return route;
        };
        if route.how == How::Primary && Route::home_has_room(snapshot, key) {
            return route;
        }
        match snapshot.backend(spilled_to) {
            Some(pin) => route.stay_first(snapshot, pin),
            None => route,
        }
    }

    /// Whether the key's first candidate is up, below its mean share and
    /// its engine not full: a key that spilled from it may go back.
    pub(crate) fn home_has_room(snapshot: &Snapshot, key: u64) -> bool {
        let Some(home) = snapshot.candidates(key).next() else {
            return false;
        };
        let mean = bounded::mean(snapshot.total_active(), home.weight, snapshot.total_weight);
        let engine_full = (snapshot.config.load_limits()).is_some_and(|l| {
            home.live
                .engine
                .full_for_new_keys(l, tokio::time::Instant::now())
        });
        home.live.health.is_up() && (home.live.load.active() as f64) < mean && !engine_full
    }

    /// The route for traffic whose key is pinned to `pin` (session pins):
    /// the pinned backend first while it is up and under its cap, then the
    /// key's other candidates. A pin that cannot take the request is passed
    /// over like any candidate, and the route is the table's.
    pub(crate) fn plan_pinned(snapshot: &Snapshot, key: u64, pin: &Arc<Backend>) -> Route {
        // A pin at its cap or with its engine full, but not far over either,
        // keeps its key: passing it over in the table's walk is then no spill.
        let kept = |caps: Option<Caps>| {
            !far_over(snapshot, pin) && pin.live.load.active() < Caps::pinned(pin, caps)
        };
        let mut keeps = None;
        let route = select(snapshot, key, |backend, why| {
            let is_pin = std::ptr::eq(backend, &**pin);
            let pin_keeps = is_pin
                && matches!(why, Spill::EngineFull | Spill::AtCap)
                && *keeps.get_or_insert_with(|| kept(caps_of(snapshot)));
            if !pin_keeps {
                backend.live.traffic.count_spill(why)
            }
        });
        route.pin_first(snapshot, pin)
    }

    /// This route with the session's `pin` tried first, if it is up, under
    /// [`PIN_CAP_FACTOR`] times its cap and its engine not far over its
    /// load limits.
    pub(crate) fn pin_first(self, snapshot: &Snapshot, pin: &Arc<Backend>) -> Route {
        let limit = Caps::pinned(pin, self.caps);
        self.put_first(snapshot, pin, limit, true)
    }

    /// This route with `home`, its group's home (`key.group`), tried first
    /// if it is up, under its cap and its engine not far over; unchanged
    /// when `home` is first already.
    pub(crate) fn home_first(self, snapshot: &Snapshot, home: &Arc<Backend>) -> Route {
        if self.first().is_some_and(|b| Arc::ptr_eq(b, home)) {
            return self;
        }
        let mut route = self.stay_first(snapshot, home);
        // A route planned by the table is never `Pinned` before.
        if route.how == How::Pinned {
            route.how = How::GroupHome;
        }
        route
    }

    /// This route with `to`, where the key spilled and stays, tried first
    /// if it is up, under its cap and its engine not far over: a key's
    /// memory of a spill never takes a backend past its bound.
    fn stay_first(self, snapshot: &Snapshot, to: &Arc<Backend>) -> Route {
        let limit = Caps::of(to, self.caps);
        self.put_first(snapshot, to, limit, false)
    }

    fn put_first(
        mut self,
        snapshot: &Snapshot,
        pin: &Arc<Backend>,
        limit: u64,
        session: bool,
    ) -> Route {
        let takes =
            pin.live.health.is_up() && pin.live.load.active() < limit && !far_over(snapshot, pin);
        if takes {
            self.targets.retain(|b| !Arc::ptr_eq(b, pin));
            self.targets.insert(0, Arc::clone(pin));
            self.targets.truncate(kept(&snapshot.config));
            self.how = How::Pinned;
            self.session_pin = session;
        }
        self
    }

    /// This route, counted as one for a fallback key (no key was found).
    pub(crate) fn for_fallback(mut self, fallback: bool) -> Route {
        if fallback {
            self.how = How::FallbackKey;
        }
        self
    }

    /// The route a key would take now, counting nothing (admin `/route`).
    pub(crate) fn preview(snapshot: &Snapshot, key: u64) -> Route {
        select(snapshot, key, |_, _| {})
    }

    /// The backend traffic would go to first, if any.
    pub(crate) fn first(&self) -> Option<&Arc<Backend>> {
        self.targets.first()
    }

    /// Takes one active slot on `backend` if it is still under its cap (the
    /// check and the increment are one atomic step). A backend that filled up
    /// since the route was planned is counted as a spill and gives `None`.
    pub(crate) fn reserve(&self, backend: &Arc<Backend>) -> Option<ActiveGuard> {
        if self.caps.is_none() {
            return Some(backend.live.reserve());
        }
        let pinned = self.session_pin && self.first().is_some_and(|b| Arc::ptr_eq(b, backend));
        let cap = if pinned {
            Caps::pinned(backend, self.caps)
        } else {
            Caps::of(backend, self.caps)
        };
        let guard = backend.live.try_reserve(cap);
        if guard.is_none() {
            backend.live.traffic.count_spill(Spill::AtCap);
        }
        guard
    }
}

impl Route {
    /// [`Route::reserve`], holding `tokens` of prefill work at `backend`
    /// besides (counted in its prefill work until the guard drops, at its
    /// answer's first byte).
    pub(crate) fn reserve_work(
        &self,
        backend: &Arc<Backend>,
        tokens: u64,
    ) -> Option<(ActiveGuard, WorkGuard)> {
        let cap = match self.caps {
            None => u64::MAX,
            Some(_) => Caps::of(backend, self.caps),
        };
        let room = backend.live.try_reserve_work(cap, tokens, None, None);
        if room.is_none() {
            backend.live.traffic.count_spill(Spill::AtCap);
        }
        room
    }
}

/// Whether `backend`'s engine is far over its load limits (`health.load`):
/// then even the keys pinned to it move.
fn far_over(snapshot: &Snapshot, backend: &Backend) -> bool {
    (snapshot.config.load_limits())
        .is_some_and(|l| backend.live.engine.far_over(l, tokio::time::Instant::now()))
}

/// How far `backend` is into its slow-start ramp of `length` at `now` (0 to
/// 1), if it is in one (`placement.slow_start`).
pub(crate) fn slow_start_progress(
    backend: &Backend,
    length: Duration,
    now: Instant,
) -> Option<f64> {
    slow_start::progress(backend.live.health.since_joined(now)?, length)
}

/// Whether `backend` is warming up and `key` has not moved to it yet.
fn held_back(backend: &Backend, key: u64, ramp: Option<(Duration, Instant)>) -> bool {
    ramp.and_then(|(length, now)| slow_start_progress(backend, length, now))
        .is_some_and(|p| !slow_start::moved(key, &backend.name, p))
}

/// The bounded-load caps in force now, if any.
fn caps_of(snapshot: &Snapshot) -> Option<Caps> {
    let placement = &snapshot.config.placement;
    placement.bounded_load.map(|factor| Caps {
        factor,
        min_excess: placement.spill_min_excess,
        total_load: snapshot.total_active(),
        total_weight: snapshot.total_weight,
    })
}

/// How many targets a route keeps: `connect.attempts`, or under a `queue`
/// every candidate (it chooses among them; connects stay at most
/// `connect.attempts`, [`crate::routing::decision`]).
pub(crate) fn kept(config: &Config) -> usize {
    match config.queue {
        Some(_) => MAX_CANDIDATES,
        None => config.connect.attempts as usize,
    }
}

/// Walks `key`'s candidates and keeps those the policy accepts, calling
/// `on_skip` for each one passed over.
fn select(snapshot: &Snapshot, key: u64, mut on_skip: impl FnMut(&Backend, Spill)) -> Route {
    let config = &snapshot.config;
    let attempts = config.connect.attempts as usize;
    let keep = kept(config);
    let caps = caps_of(snapshot);
    // With `queue`, a full engine counts as at its limit: the request
    // waits for it (crate::routing::queue) rather than passing it over.
    let engine = (config.load_limits())
        .filter(|_| config.queue.is_none())
        .map(|l| (l, Instant::now()));
    let ramp = (config.placement.slow_start).map(|length| (length, Instant::now()));
    let mut targets = Vec::with_capacity(attempts.min(keep));
    let mut skipped_down = false;
    let mut how = How::Primary;
    for backend in snapshot.candidates(key) {
        let skip = if !backend.live.health.is_up() {
            Some(Spill::Down)
        } else if held_back(backend, key, ramp) {
            Some(Spill::SlowStart)
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
                if targets.is_empty() && how == How::Primary {
                    how = How::of_spill(why);
                }
                on_skip(backend, why);
            }
            None => {
                targets.push(Arc::clone(backend));
                if targets.len() == keep {
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
                how: How::Primary,
                caps: None,
                session_pin: false,
            };
        }
    }
    debug_assert!(targets.len() <= MAX_CANDIDATES);
    Route {
        targets,
        how,
        caps,
        session_pin: false,
    }
}

#[cfg(test)]
mod tests;
