//! Which backend a request goes to when `sessions` is on: its pin, if alive
//! and usable, else the table's choice, which becomes the pin; and what
//! serving it does to the pin ([`Pinned::served`]: bound, or used again).
//!
//! With `store: local` pins live in this process: a miss is routed by the
//! table and the backend that served it is pinned. With `store: redis` the
//! local map is a cache of the shared bindings: a hit never waits on the
//! store (in the background, at most once per `ttl / 4`, its binding there
//! is extended, or bound again if the store lost it, and the cache follows
//! whatever binding holds); a miss, or a cached pin whose backend is down or
//! gone, asks the store, where the first binding of a key wins for every
//! instance and a stale binding is replaced by compare-and-set. When the
//! store does not answer within its timeout (longer for a later turn:
//! [`Store::deadline_for`]) the request goes by the table, which every
//! instance agrees on, and nothing is pinned.
//!
//! A key that spilled off a loaded backend stays where it spilled: with
//! `store: local` its pin says so; without `sessions` the key's
//! [`crate::routing::key_memory`] record does. Either way it goes back to its primary
//! once that one is below its mean share. A shared pin stays where it is
//! bound (moving it back would need every instance to agree on loads).
//!
//! Under a `queue` with a shared store, a key without a binding is placed by
//! the queue and bound where it went, and a turn that spilled off its pin,
//! or was placed anew because its engine likely evicted its cache, moves
//! the binding ([`crate::routing::sessions::placed`]).
//!
//! With `key.group` the pin is the session key's and the table is looked
//! up by the group ([`Keys`]): a conversation without a pin is placed by
//! its group ([`crate::routing::llm::groups`]), that backend becomes the
//! session's pin, and later requests stay on the pin whatever the group's
//! load does since. The pin itself gives the stickiness a spilled key's
//! memory gives without groups, so a grouped conversation never "goes
//! home".

use std::sync::Arc;

use crate::routing::backend::Backend;
use crate::routing::keys::Keys;
use crate::routing::llm::groups::{self, Grouped};
use crate::routing::llm::openings::Opening;
use crate::routing::route::{How, Route};
use crate::routing::sessions::placed::{Beside, Opened, SharedPin, Told};
use crate::routing::sessions::store::Store;
use crate::routing::sessions::{Sessions, fleet};
use crate::routing::snapshot::Snapshot;

/// What serving a request routed under `sessions` does to the key's pin.
#[derive(Debug)]
pub(crate) struct Pinned {
    sessions: Arc<Sessions>,
    /// Whether the backend that serves the request becomes the key's pin
    /// (else the pin, already bound, is only used again).
    bind_served: bool,
    /// Whether the pin is (or will be) bound by this request, not found.
    pub(crate) placed: bool,
    /// Set when this request opens a conversation (`key.group_choices`),
    /// until the backend it counts at is taken.
    pub(crate) opening: Option<Opening>,
    /// Its group (`key.group`, which needs sessions).
    pub(crate) grouped: Option<Grouped>,
    /// Under a queue with a shared store: what serving it does to the
    /// binding there.
    shared: Option<SharedPin>,
    /// Without a binding, under a queue with a shared store: where the
    /// fleet's latest conversation that opens alike went.
    pub(crate) opened: Option<Opened>,
    /// Pinned, under a queue with a shared store: the bytes the key's
    /// latest request sent, through any magpie.
    pub(crate) sent: Option<u64>,
    /// Without a binding, under a queue with a shared store: other magpies
    /// share it, so where the request is placed is checked against theirs
    /// ([`Pinned::crowded`]).
    others_live: bool,
}

impl Pinned {
    /// A conversation's first request placed at `at` while other magpies
    /// share the store: whether one of them placed work there since its
    /// lookup read theirs, so it is placed again
    /// ([`fleet::crowded`]: one round trip); never for a magpie alone.
    pub(crate) async fn crowded(&self, backends: &[Arc<Backend>], at: &Backend) -> bool {
        let Some(store) = self.sessions.store.as_ref().filter(|_| self.others_live) else {
            return false;
        };
        fleet::crowded(store, &self.sessions.fleet, backends, at).await
    }

    /// Placed again after [`Pinned::crowded`], it went to another backend
    /// (`magpie_fleet_moved_placements_total`).
    pub(crate) fn count_moved_placement(&self) {
        if let Some(store) = &self.sessions.store {
            store.stats.count_moved_placement();
        }
    }

    /// The request was served by `backend`: with `store: local`, it becomes
    /// the key's pin (or the pin is renewed); with a shared store, the pin
    /// bound while routing is used again (a new binding shares this
    /// magpie's work at the snapshot's `backends` and how the conversation
    /// opened, its body `prompt_bytes` long). Its group is counted first.
    pub(crate) fn served(
        &self,
        keys: Keys,
        prompt_bytes: u64,
        backend: &Backend,
        backends: &[Arc<Backend>],
    ) {
        if let Some(grouped) = &self.grouped {
            grouped.served(backend, &self.sessions);
        }
        if let Some(shared) = &self.shared {
            let key = keys.session.hash();
            let opening = keys.opening.map(|o| (o, prompt_bytes));
            let beside = Beside {
                backends,
                opening,
                head: keys.head,
            };
            (self.sessions).bind_shared(key, &backend.name, shared, beside);
        } else if self.bind_served {
            self.sessions.pins.bind(keys.session.hash(), &backend.name);
        } else {
            self.sessions.pins.touch(keys.session.hash());
        }
    }
}

/// The route for `keys` under `sessions`: by the session key's pin, the
/// table looked up by the group when there is one; and what serving it
/// will do to the pin. `spilled_to` is where the key spilled, from the key
/// memory; `prompt_bytes` the request's body's bytes.
pub(crate) async fn route(
    sessions: Arc<Sessions>,
    snapshot: &Snapshot,
    asked: (Keys, u64),
    spilled_to: Option<&str>,
) -> (Route, Pinned) {
    let (route, bound) = by_pin(&sessions, snapshot, asked, spilled_to).await;
    let pinned = Pinned {
        sessions,
        bind_served: bound.bind_served,
        placed: bound.placed,
        opening: bound.opening,
        grouped: None,
        shared: bound.shared,
        opened: bound.opened,
        sent: bound.sent,
        others_live: bound.others_live,
    };
    (route, pinned)
}

/// What routing under `sessions` did to the pin.
#[derive(Debug, Default)]
struct Bound {
    /// The backend that serves the request becomes the pin.
    bind_served: bool,
    /// The pin is (or will be) bound by this request, not found.
    placed: bool,
    /// The request opens a conversation (`key.group_choices`).
    opening: Option<Opening>,
    /// Under a queue with a shared store: what serving it does there.
    shared: Option<SharedPin>,
    /// The fleet's record of how conversations that open alike went.
    opened: Option<Opened>,
    /// The bytes the key's latest request sent, through any magpie.
    sent: Option<u64>,
    /// Other magpies share the store: where it is placed is checked.
    others_live: bool,
}

/// The route for `keys` under `sessions`, and what it does to the pin.
async fn by_pin(
    sessions: &Arc<Sessions>,
    snapshot: &Snapshot,
    asked: (Keys, u64),
    spilled_to: Option<&str>,
) -> (Route, Bound) {
    let keys = asked.0;
    let (session, table_key) = (keys.session.hash(), keys.table());
    let Some(store) = &sessions.store else {
        let pin = sessions.pins.get(session);
        let pin = pin.as_deref().and_then(|name| snapshot.backend(name));
        // A spilled key goes home; a grouped conversation stays on its pin
        // (its group may have grown past its primary meanwhile).
        let goes_home = |pin: &Backend| {
            keys.group.is_none()
                && spilled_to == Some(pin.name.as_str())
                && Route::home_has_room(snapshot, table_key)
        };
        let (route, opening) = match pin {
            Some(pin) if !goes_home(pin) => (Route::plan_pinned(snapshot, table_key, pin), None),
            _ => groups::place_locally(sessions, snapshot, keys),
        };
        let placed = route.how != How::Pinned;
        return (
            route,
            Bound {
                bind_served: true,
                placed,
                opening,
                shared: None,
                opened: None,
                sent: None,
                others_live: false,
            },
        );
    };
    // Under a queue the store is read first: another magpie may have
    // moved the pin.
    let queued = snapshot.config.queue.is_some();
    if queued && store.is_usable() {
        return placed_then_bound(sessions, store, snapshot, asked).await;
    }
    // Instance pins: the local map first.
    if let Some((name, due)) = sessions.cached(session)
        && let Some(pin) = usable(snapshot, &name)
    {
        if due {
            sessions.refresh(session, Arc::clone(&name));
        }
        return (
            Route::plan_pinned(snapshot, table_key, pin),
            Bound::default(),
        );
    }
    store.ensure_connecting();
    by_shared_pin(sessions, store, snapshot, keys).await
}

/// [`by_pin`] with a shared store under a queue: the store's binding if it
/// has a usable one (a turn that spills off it moves it); else the table's
/// route (its group's home first), for the queue to place the request, and
/// the backend that takes it is bound (replacing a binding to a backend
/// down or gone). No answer from the store: the cached pin, else the
/// table's route, nothing bound.
async fn placed_then_bound(
    sessions: &Arc<Sessions>,
    store: &Arc<Store>,
    snapshot: &Snapshot,
    (keys, prompt_bytes): (Keys, u64),
) -> (Route, Bound) {
    let session = keys.session.hash();
    let deadline = store.deadline_for(keys.later_turn);
    let work = fleet::own_work(&snapshot.backends);
    let told = Told {
        opening: keys.opening,
        head: keys.head,
        prompt_bytes,
    };
    let found = store.lookup(session, told, (&sessions.fleet, work), deadline);
    let Some(found) = found.await else {
        let table = Route::plan(snapshot, keys.table());
        let cached = sessions.cached(session);
        return match cached.and_then(|(name, _)| usable(snapshot, &name).cloned()) {
            Some(pin) => (table.pin_first(snapshot, &pin), Bound::default()),
            None => (table, Bound::default()),
        };
    };
    if let Some(others) = &found.fleet {
        fleet::apply(&snapshot.backends, others);
    }
    // Where the fleet last placed a conversation sharing its head holds it.
    if let Some(head) = keys.head
        && let Some(at) = found.head_at.as_deref().and_then(|at| snapshot.backend(at))
    {
        at.live.served_elsewhere(head);
    }
    let held = found.held;
    let pin = held.as_deref().and_then(|name| usable(snapshot, name));
    sessions.pins.count(pin.is_some());
    if let Some(pin) = pin {
        sessions.pins.bind(session, &pin.name);
        let bound = Bound {
            shared: Some(SharedPin::Move {
                was: pin.name.clone(),
            }),
            sent: found.sent,
            ..Bound::default()
        };
        return (Route::plan_pinned(snapshot, keys.table(), pin), bound);
    }
    let table = Route::plan(snapshot, keys.table());
    let grouped = keys.group.filter(|_| snapshot.config.group_choices > 1);
    let (table, opening) = match grouped {
        Some(group) => groups::home_shared(sessions, store, snapshot, group, table).await,
        None => (table, None),
    };
    let bound = Bound {
        placed: true,
        opening,
        shared: Some(SharedPin::Place { stale: held }),
        opened: found.opened,
        others_live: found.others_live,
        ..Bound::default()
    };
    (table, bound)
}

/// [`by_pin`] with a shared store, for a key without a usable cached pin:
/// the store's binding, or the table's choice (after its group's home)
/// bound now. With `key.group_choices` above 1 a conversation's first
/// request is marked at its pin as it binds it, unless it placed a new
/// group and so is marked already.
async fn by_shared_pin(
    sessions: &Arc<Sessions>,
    store: &Arc<Store>,
    snapshot: &Snapshot,
    keys: Keys,
) -> (Route, Bound) {
    let grouped = keys.group.filter(|_| snapshot.config.group_choices > 1);
    let table = Route::plan(snapshot, keys.table());
    let (table, opening) = match grouped {
        Some(group) => groups::home_shared(sessions, store, snapshot, group, table).await,
        None => (table, None),
    };
    let marks = grouped.is_some() && opening.is_none();
    let unbound = |opening| Bound {
        opening,
        ..Bound::default()
    };
    let Some(choice) = table.first().map(|b| b.name.clone()) else {
        return (table, unbound(opening));
    };
    let session = keys.session.hash();
    let takes = |name: &str| usable(snapshot, name).is_some();
    let deadline = store.deadline_for(keys.later_turn);
    let pinned = match marks {
        true => store.pin_opening(session, &choice, takes, deadline).await,
        false => (store.pin(session, &choice, takes, deadline).await).map(|held| (held, None)),
    };
    let Some((pin, mark)) = pinned.and_then(|(held, mark)| Some((usable(snapshot, &held)?, mark)))
    else {
        return (table, unbound(opening));
    };
    sessions.pins.bind(session, &pin.name);
    let opening = opening.or_else(|| mark.map(|m| Opening::conversation(pin, Some(m))));
    let placed = Bound {
        bind_served: false,
        placed: pin.name == choice,
        opening,
        ..Bound::default()
    };
    (table.pin_first(snapshot, pin), placed)
}

/// `name`'s backend if the table has it and it is up: a pin that holds.
fn usable<'a>(snapshot: &'a Snapshot, name: &str) -> Option<&'a Arc<Backend>> {
    snapshot.backend(name).filter(|b| b.live.health.is_up())
}
