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
//! store does not answer within its timeout the request goes by the table,
//! which every instance agrees on, and nothing is pinned.
//!
//! A key that spilled off a loaded backend stays where it spilled: with
//! `store: local` its pin says so; without `sessions` the key's
//! [`crate::routing::key_memory`] record does. Either way it goes back to its primary
//! once that one is below its mean share. A shared pin stays where it is
//! bound (moving it back would need every instance to agree on loads).
//!
//! With `key.group` the pin is the session key's and the table is looked
//! up by the group ([`Keys`]): a conversation's first request goes to its
//! group's first candidate that takes it (so a hot group's new
//! conversations fill its second candidate, then its third), that backend
//! becomes the session's pin, and later requests stay on the pin whatever
//! the group's load does since. The pin itself gives the stickiness a
//! spilled key's memory gives without groups, so a grouped conversation
//! never "goes home".
//!
//! With `key.group_choices` above 1 a group has a pin of its own, its home
//! ([`group_pin`]): a group without one takes the least busy of its first
//! candidates ([`Route::least_awaiting`]), and its
//! new conversations go to its home first, then along the table's order
//! when the home is full. With a shared store the first binding of a group
//! wins for every instance, as a session's does.

use std::sync::Arc;

use super::request_key::RequestKey;
use super::request_log::RequestLog;
use crate::routing::backend::groups::Rank;
use crate::routing::backend::{Awaiting, Backend};
use crate::routing::instance::Instance;
use crate::routing::key_memory::KeyMemory;
use crate::routing::route::How;
use crate::routing::route::{Keys, Route};
use crate::routing::sessions::homes::{AwaitingMark, Candidate};
use crate::routing::sessions::store::Store;
use crate::routing::sessions::{Sessions, group_pin};
use crate::routing::snapshot::Snapshot;

/// A request's route, and what serving it does to the key's pin.
pub struct Pinned {
    pub route: Route,
    keys: Keys,
    /// `None` without `sessions`: routing stays stateless.
    sessions: Option<Arc<Sessions>>,
    /// Whether the backend that serves the request becomes the key's pin
    /// (else the pin, already bound, is only used again).
    bind_served: bool,
    /// Set when this request places its conversation by its group (its pin
    /// is bound here, from this request): the group's first candidates, to
    /// rank the backend that serves it.
    placing: Option<Vec<Arc<Backend>>>,
    /// Set when this request opens a conversation (`key.group_choices`).
    pub opening: Option<Opening>,
    /// Groups have homes (`key.group_choices` above 1) to keep alive.
    group_homes: bool,
}

/// A conversation's first request, with `key.group_choices` above 1: where
/// it was placed (its group's home when it placed a new group, else its
/// session pin), and with a shared store its mark there
/// ([`crate::routing::sessions::homes`]). It counts among the requests awaiting their
/// first byte as an opening, and a new group's at its home as one too,
/// until the byte arrives ([`Opening::claimed_at`]).
#[derive(Debug)]
pub struct Opening {
    pub at: String,
    pub new_group: bool,
    pub mark: Option<AwaitingMark>,
}

impl Opening {
    fn new_group(home: &Backend, mark: Option<AwaitingMark>) -> Opening {
        Opening {
            at: home.name.clone(),
            new_group: true,
            mark,
        }
    }

    fn conversation(at: &Backend, mark: Option<AwaitingMark>) -> Opening {
        Opening {
            at: at.name.clone(),
            new_group: false,
            mark,
        }
    }

    /// What the request counts as at `backend`, the one that takes it, and
    /// its mark if it was placed there (a mark elsewhere is dropped).
    pub fn claimed_at(self, backend: &str) -> (Awaiting, Option<AwaitingMark>) {
        match self {
            Opening {
                at,
                new_group,
                mark,
            } if at == backend => {
                let kind = if new_group {
                    Awaiting::NewGroup
                } else {
                    Awaiting::Opening
                };
                (kind, mark)
            }
            _ => (Awaiting::Opening, None),
        }
    }
}

impl Pinned {
    /// This route, counted as one for a fallback key (no key was found).
    pub fn for_fallback(self, fallback: bool) -> Pinned {
        Pinned {
            route: self.route.for_fallback(fallback),
            ..self
        }
    }

    /// Sessions are on and the key was not routed by its pin: the pin was
    /// lost (expired, evicted, or never bound).
    pub fn pin_lost(&self) -> bool {
        self.sessions.is_some() && self.route.how != How::Pinned
    }

    /// The request was served by `backend`: with `store: local`, it becomes
    /// the key's pin (or the pin is renewed); with a shared store, the pin
    /// bound while routing is used again. A group's request is counted among
    /// the backend's groups, and a placement by the candidate's rank.
    pub fn served(&self, backend: &Backend) {
        if let Some(group) = self.keys.group {
            backend.live.groups.served(group);
            if let Some(sessions) = self.sessions.as_ref().filter(|_| self.group_homes) {
                // A group's pin lives while its conversations do, in the
                // shared store too.
                let at = group_pin(group);
                sessions.pins.touch(at);
                if let Some((home, true)) = sessions.cached_group(group) {
                    sessions.refresh(at, home);
                }
            }
        }
        if let Some(candidates) = &self.placing {
            let index = candidates.iter().position(|c| c.name == backend.name);
            let rank = Rank::of_index(index.unwrap_or(usize::MAX));
            backend.live.groups.count_placement(rank);
        }
        let Some(sessions) = &self.sessions else {
            return;
        };
        if self.bind_served {
            sessions.pins.bind(self.keys.session, &backend.name);
        } else {
            sessions.pins.touch(self.keys.session);
        }
    }
}

/// A request's keys as found, counted (a fallback key's reason, a missing
/// group's) and routed: what both HTTP/1.1 paths do between finding a
/// request's keys and forwarding it.
pub async fn route_found(
    found: &RequestKey,
    instance: &Instance,
    snapshot: &Snapshot,
    log: &mut Option<RequestLog>,
) -> (Keys, Pinned) {
    if let Some(why) = found.fallback {
        instance.stats.count_fallback(why);
    }
    let group = match found.group {
        Some(Ok(group)) => Some(group),
        Some(Err(why)) => {
            instance.stats.count_group_miss(why);
            None
        }
        None => None,
    };
    let keys = Keys {
        session: found.key,
        group,
        opening: found.opening,
    };
    if let Some(log) = log.as_mut() {
        log.keyed(keys.session);
    }
    let pinned = route(instance.sessions(), snapshot, &instance.key_memory, keys)
        .await
        .for_fallback(found.fallback.is_some());
    (keys, pinned)
}

/// The route for `keys`: by the table (and where the key spilled) without
/// `sessions`, else by the session key's pin, the table looked up by the
/// group when there is one.
pub async fn route(
    sessions: Option<Arc<Sessions>>,
    snapshot: &Snapshot,
    memory: &KeyMemory,
    keys: Keys,
) -> Pinned {
    // Only a cap or a full engine makes a key spill: without either
    // there is nothing to remember.
    let config = &snapshot.config;
    let spills = config.placement.bounded_load.is_some() || config.load_limits().is_some();
    let spilled_to = spills.then(|| memory.spilled_to(keys.session)).flatten();
    let spilled_to = spilled_to.as_deref();
    let (route, bound) = match &sessions {
        None => (
            Route::plan_remembered(snapshot, keys.table(), spilled_to),
            Bound::default(),
        ),
        Some(s) => by_pin(s, snapshot, keys, spilled_to).await,
    };
    let placing = (bound.placed && keys.group.is_some()).then(|| {
        let first = snapshot.candidates(keys.table()).take(Rank::COUNT - 1);
        first.cloned().collect()
    });
    Pinned {
        route,
        keys,
        sessions,
        bind_served: bound.bind_served,
        placing,
        opening: bound.opening,
        group_homes: snapshot.config.group_choices > 1,
    }
}

/// The route of a conversation without a pin (`store: local`): the table's,
/// and with a group and `key.group_choices` above 1 its home first. The
/// home is the group's pin; a group without one (new, or its pin expired,
/// or its backend gone) takes the least busy of its first
/// `key.group_choices` candidates that take it, which becomes the group's
/// pin at once, so the conversations of one head that arrive before its
/// first answer go where it went. With one choice there is no group pin:
/// the table's order is the home, as every instance computes it.
fn place_locally(sessions: &Sessions, snapshot: &Snapshot, keys: Keys) -> (Route, Option<Opening>) {
    let route = Route::plan(snapshot, keys.table());
    let Some(group) = keys.group.filter(|_| snapshot.config.group_choices > 1) else {
        return (route, None);
    };
    let at = group_pin(group);
    let pinned = sessions.pins.peek(at);
    if let Some(home) = pinned.as_deref().and_then(|name| snapshot.backend(name)) {
        sessions.pins.touch(at);
        let route = route.home_first(snapshot, home);
        let opening = route.first().map(|b| Opening::conversation(b, None));
        return (route, opening);
    }
    let choices = snapshot.config.group_choices;
    let Some(home) = route.least_awaiting(choices).map(Arc::clone) else {
        return (route, None);
    };
    sessions.pins.bind(at, &home.name);
    let placed = Opening::new_group(&home, None);
    (route.home_first(snapshot, &home), Some(placed))
}

/// With a shared store: `route` with the group's home first, and the mark
/// of a new group's request ([`crate::routing::sessions::homes`]). The home is the
/// group's cached pin; else the store's binding of the group, which the
/// least busy of its first `key.group_choices` candidates becomes if the
/// group has none, counting every instance's new groups and homes (the
/// first binding wins for every instance, so they all send the group's new
/// conversations to one home). A binding to a backend the table no longer
/// has is replaced; one to a backend that is down is kept (health moves no
/// group). No answer from the store: the table's route, which every
/// instance agrees on.
async fn home_shared(
    sessions: &Arc<Sessions>,
    store: &Arc<Store>,
    snapshot: &Snapshot,
    group: u64,
    route: Route,
) -> (Route, Option<Opening>) {
    let at = group_pin(group);
    if let Some((name, due)) = sessions.cached_group(group)
        && let Some(home) = snapshot.backend(&name)
    {
        if due {
            sessions.refresh(at, name);
        }
        return (route.home_first(snapshot, home), None);
    }
    let choices = snapshot.config.group_choices;
    let candidates: Vec<Candidate> = (route.targets.iter().take(choices))
        .map(|b| Candidate {
            name: &b.name,
            awaiting: b.live.load.awaiting(),
        })
        .collect();
    let Some(placed) = store.place_home(at, &candidates).await else {
        return (route, None);
    };
    let home = match snapshot.backend(&placed.backend) {
        Some(home) => Arc::clone(home),
        None => {
            // Bound to a backend the table no longer has: replace it.
            let Some(choice) = route.least_awaiting(choices).map(|b| b.name.clone()) else {
                return (route, None);
            };
            let held = store.pin(at, &choice, |name| snapshot.backend(name).is_some());
            match held.await.and_then(|name| snapshot.backend(&name).cloned()) {
                Some(home) => home,
                None => return (route, None),
            }
        }
    };
    sessions.pins.bind(at, &home.name);
    let placed = (placed.mark).map(|mark| Opening::new_group(&home, Some(mark)));
    (route.home_first(snapshot, &home), placed)
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
}

/// The route for `keys` under `sessions`, and what it does to the pin.
async fn by_pin(
    sessions: &Arc<Sessions>,
    snapshot: &Snapshot,
    keys: Keys,
    spilled_to: Option<&str>,
) -> (Route, Bound) {
    let (session, table_key) = (keys.session, keys.table());
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
            _ => place_locally(sessions, snapshot, keys),
        };
        let placed = route.how != How::Pinned;
        return (
            route,
            Bound {
                bind_served: true,
                placed,
                opening,
            },
        );
    };
    // Instance pins: the local map first.
    if let Some((name, due)) = sessions.cached(session)
        && let Some(pin) = usable(snapshot, &name)
    {
        if due {
            sessions.refresh(session, name);
        }
        return (
            Route::plan_pinned(snapshot, table_key, pin),
            Bound::default(),
        );
    }
    store.ensure_connecting();
    by_shared_pin(sessions, store, snapshot, keys).await
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
        Some(group) => home_shared(sessions, store, snapshot, group, table).await,
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
    let takes = |name: &str| usable(snapshot, name).is_some();
    let pinned = match marks {
        true => store.pin_opening(keys.session, &choice, takes).await,
        false => (store.pin(keys.session, &choice, takes).await).map(|held| (held, None)),
    };
    let Some((pin, mark)) = pinned.and_then(|(held, mark)| Some((usable(snapshot, &held)?, mark)))
    else {
        return (table, unbound(opening));
    };
    sessions.pins.bind(keys.session, &pin.name);
    let opening = opening.or_else(|| mark.map(|m| Opening::conversation(pin, Some(m))));
    let placed = Bound {
        bind_served: false,
        placed: pin.name == choice,
        opening,
    };
    (table.pin_first(snapshot, pin), placed)
}

/// `name`'s backend if the table has it and it is up: a pin that holds.
fn usable<'a>(snapshot: &'a Snapshot, name: &str) -> Option<&'a Arc<Backend>> {
    snapshot.backend(name).filter(|b| b.live.health.is_up())
}
