//! Which backend a request goes to when `sessions` is on: its pin, if alive
//! and usable, else the table's choice, which becomes the pin; and what
//! serving it does to the pin ([`Pinned::served`]: bound, or used again).
//!
//! With `store: local` pins live in this process: a miss is routed by the
//! table and the backend that served it is pinned. With `store: redis` the
//! local map is a cache of the shared bindings: a hit never touches the store
//! (its TTL there is extended in the background, at most once per `ttl / 4`);
//! a miss, or a cached pin whose backend is down or gone, asks the store in
//! one round trip, where the first binding of a key wins for every instance
//! and a stale binding is replaced by compare-and-set. When the store does
//! not answer within its timeout the request goes by the table, which every
//! instance agrees on, and nothing is pinned.
//!
//! A key that spilled off a loaded backend stays where it spilled: with
//! `store: local` its pin says so; without `sessions` the key's
//! [`crate::recent`] record does. Either way it goes back to its primary
//! once that one is below its mean share. A shared pin stays where it is
//! bound (moving it back would need every instance to agree on loads).

use std::sync::Arc;

use crate::backend::Backend;
use crate::recent::{How, Recent};
use crate::route::Route;
use crate::sessions::Sessions;
use crate::snapshot::Snapshot;

/// A request's route, and what serving it does to the key's pin.
pub struct Pinned {
    pub route: Route,
    key: u64,
    /// `None` without `sessions`: routing stays stateless.
    sessions: Option<Arc<Sessions>>,
    /// Whether the backend that serves the request becomes the key's pin
    /// (else the pin, already bound, is only used again).
    bind_served: bool,
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
    /// bound while routing is used again.
    pub fn served(&self, backend: &Backend) {
        let Some(sessions) = &self.sessions else {
            return;
        };
        if self.bind_served {
            sessions.pins.bind(self.key, &backend.name);
        } else {
            sessions.pins.touch(self.key);
        }
    }
}

/// The route for `key`: by the table (and where the key spilled) without
/// `sessions`, else by its pin.
pub async fn route(
    sessions: Option<Arc<Sessions>>,
    snapshot: &Snapshot,
    recent: &Recent,
    key: u64,
) -> Pinned {
    let spilled_to = recent.spilled_to(key);
    let spilled_to = spilled_to.as_deref();
    let (route, bind_served) = match &sessions {
        None => (Route::plan_remembered(snapshot, key, spilled_to), false),
        Some(s) => by_pin(s, snapshot, key, spilled_to).await,
    };
    Pinned {
        route,
        key,
        sessions,
        bind_served,
    }
}

/// The route for `key` under `sessions`, and whether the backend that serves
/// it becomes the pin.
async fn by_pin(
    sessions: &Sessions,
    snapshot: &Snapshot,
    key: u64,
    spilled_to: Option<&str>,
) -> (Route, bool) {
    let usable = |name: &str| -> Option<&Arc<Backend>> {
        snapshot.backend(name).filter(|b| b.live.health.is_up())
    };
    let Some(store) = &sessions.store else {
        let pin = sessions.pins.get(key);
        let pin = pin.as_deref().and_then(|name| snapshot.backend(name));
        let goes_home = |pin: &Backend| {
            spilled_to == Some(pin.name.as_str()) && Route::home_has_room(snapshot, key)
        };
        let route = match pin {
            Some(pin) if !goes_home(pin) => Route::plan_pinned(snapshot, key, pin),
            _ => Route::plan(snapshot, key),
        };
        return (route, true);
    };
    // Shared pins: the local map first.
    if let Some((name, due)) = sessions.pins.get_and_due(key, sessions.ttl / 4)
        && let Some(pin) = usable(&name)
    {
        if due {
            store.refresh(key);
        }
        return (Route::plan_pinned(snapshot, key, pin), false);
    }
    store.ensure_connecting();
    let table = Route::plan(snapshot, key);
    let Some(choice) = table.first().map(|b| b.name.clone()) else {
        return (table, false);
    };
    let Some(held) = store.bind_or_get(key, &choice).await else {
        return (table, false);
    };
    if let Some(pin) = usable(&held) {
        sessions.pins.bind(key, &held);
        return (table.pin_first(snapshot, pin), false);
    }
    // Bound to a backend that is down or gone: replace it, once for all.
    match store.replace(key, &held, &choice).await {
        Some(now) => match usable(&now) {
            Some(pin) => {
                sessions.pins.bind(key, &now);
                (table.pin_first(snapshot, pin), false)
            }
            None => (table, false),
        },
        None => (table, false),
    }
}
