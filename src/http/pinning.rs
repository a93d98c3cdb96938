//! Which backend a request goes to when `sessions` is on: its pin, if alive
//! and usable, else the table's choice, which becomes the pin.
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

use std::sync::Arc;

use crate::backend::Backend;
use crate::route::Route;
use crate::sessions::Sessions;
use crate::snapshot::Snapshot;

/// A route, and whether the backend that serves it becomes the key's pin.
pub struct Pinned {
    pub route: Route,
    pub pin_served: bool,
}

/// The route for `key` under `sessions`.
pub async fn route(sessions: &Sessions, snapshot: &Snapshot, key: u64) -> Pinned {
    let usable = |name: &str| -> Option<&Arc<Backend>> {
        snapshot.backend(name).filter(|b| b.live.health.is_up())
    };
    let Some(store) = &sessions.store else {
        let pin = sessions.pins.get(key);
        let route = match pin.as_deref().and_then(|name| snapshot.backend(name)) {
            Some(pin) => Route::plan_pinned(snapshot, key, pin),
            None => Route::plan(snapshot, key),
        };
        return Pinned {
            route,
            pin_served: true,
        };
    };
    // Shared pins: the local map first.
    if let Some((name, due)) = sessions.pins.get_and_due(key, sessions.ttl / 4)
        && let Some(pin) = usable(&name)
    {
        if due {
            store.refresh(key);
        }
        return by_table(Route::plan_pinned(snapshot, key, pin));
    }
    store.ensure_connecting();
    let table = Route::plan(snapshot, key);
    let Some(choice) = table.first().map(|b| b.name.clone()) else {
        return by_table(table);
    };
    let Some(held) = store.bind_or_get(key, &choice).await else {
        return by_table(table);
    };
    if let Some(pin) = usable(&held) {
        sessions.pins.bind(key, &held);
        return with_pin(table, snapshot, pin);
    }
    // Bound to a backend that is down or gone: replace it, once for all.
    match store.replace(key, &held, &choice).await {
        Some(now) => match usable(&now) {
            Some(pin) => {
                sessions.pins.bind(key, &now);
                with_pin(table, snapshot, pin)
            }
            None => by_table(table),
        },
        None => by_table(table),
    }
}

fn by_table(route: Route) -> Pinned {
    Pinned {
        route,
        pin_served: false,
    }
}

fn with_pin(table: Route, snapshot: &Snapshot, pin: &Arc<Backend>) -> Pinned {
    by_table(table.pin_first(snapshot, pin))
}
