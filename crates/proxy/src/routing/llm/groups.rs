//! Groups (`key.group`): conversations that share a head (a system prompt,
//! a prefix, a header's value) share a group key, and the table is looked
//! up by it, so their heads' cache is in one place.
//!
//! With sessions, a conversation's first request goes to its group's first
//! candidate that takes it (a hot group's new conversations fill its second
//! candidate, then its third) and that backend becomes the session's pin.
//! With `key.group_choices` above 1 a group has a pin of its own, its home:
//! a group without one takes the least busy of its first candidates
//! ([`least_awaiting`]), and its new conversations go to its home first,
//! then along the table's order when the home is full ([`place_locally`]).
//! With a shared store the first binding of a group wins for every instance,
//! as a session's does ([`home_shared`]).
//!
//! Serving a group's request counts it among the backend's groups, keeps
//! the group's home alive, and counts where a conversation was placed by
//! its rank among the group's candidates ([`Grouped::served`]).

use std::sync::Arc;

use crate::routing::backend::Backend;
use crate::routing::backend::groups::Rank;
use crate::routing::keys::{GroupKey, Keys};
use crate::routing::llm::openings::Opening;
use crate::routing::route::Route;
use crate::routing::sessions::homes::Candidate;
use crate::routing::sessions::store::Store;
use crate::routing::sessions::{Sessions, group_pin};
use crate::routing::snapshot::Snapshot;

/// The least busy of `targets`' first `n`: the one with the fewest new
/// groups' requests awaiting their first byte of body, then the fewest
/// groups served lately (the heads its cache holds), then the fewest
/// conversations' first requests awaiting (a new prompt may bring its head
/// to prefill again), then the fewest requests awaiting, then the earlier.
/// Where a group without a home goes (`key.group_choices`).
pub(crate) fn least_awaiting(targets: &[Arc<Backend>], n: usize) -> Option<&Arc<Backend>> {
    let busy = |b: &&Arc<Backend>| {
        let live = &b.live;
        (
            live.load.awaiting_cold(),
            live.groups.seen(),
            live.load.awaiting_openings(),
            live.load.awaiting(),
        )
    };
    targets.iter().take(n).min_by_key(busy)
}

/// The route of a conversation without a pin (`store: local`): the table's,
/// and with a group and `key.group_choices` above 1 its home first. The
/// home is the group's pin; a group without one (new, or its pin expired,
/// or its backend gone) takes the least busy of its first
/// `key.group_choices` candidates that take it, which becomes the group's
/// pin at once, so the conversations of one head that arrive before its
/// first answer go where it went. With one choice there is no group pin:
/// the table's order is the home, as every instance computes it.
pub(crate) fn place_locally(
    sessions: &Sessions,
    snapshot: &Snapshot,
    keys: Keys,
) -> (Route, Option<Opening>) {
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
    let Some(home) = least_awaiting(&route.targets, choices).map(Arc::clone) else {
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
pub(crate) async fn home_shared(
    sessions: &Arc<Sessions>,
    store: &Arc<Store>,
    snapshot: &Snapshot,
    group: GroupKey,
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
            let least = least_awaiting(&route.targets, choices);
            let Some(choice) = least.map(|b| b.name.clone()) else {
                return (route, None);
            };
            let takes = |name: &str| snapshot.backend(name).is_some();
            let held = store.pin(at, &choice, takes, store.deadline());
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

/// A request's group, as serving it counts it.
#[derive(Debug)]
pub(crate) struct Grouped {
    group: GroupKey,
    /// Groups have homes (`key.group_choices` above 1) to keep alive.
    homes: bool,
    /// Set when this request places its conversation by its group (its
    /// pin is bound here, from this request): the group's first
    /// candidates, to rank the backend that serves it.
    placing: Option<Vec<Arc<Backend>>>,
}

impl Grouped {
    /// The group of a request routed by `snapshot`; `places` when the
    /// request places its conversation (its session pin is bound by it).
    pub(crate) fn new(snapshot: &Snapshot, group: GroupKey, places: bool) -> Grouped {
        let placing = places.then(|| {
            let first = snapshot.candidates(group.hash()).take(Rank::COUNT - 1);
            first.cloned().collect()
        });
        Grouped {
            group,
            homes: snapshot.config.group_choices > 1,
            placing,
        }
    }

    /// The request was served by `backend`: the group is counted among the
    /// backend's, its home (a pin, in the shared store too) lives while its
    /// conversations do, and a placement is counted by the candidate's rank.
    pub(crate) fn served(&self, backend: &Backend, sessions: &Arc<Sessions>) {
        backend.live.served_group(self.group);
        if self.homes {
            let at = group_pin(self.group);
            sessions.pins.touch(at);
            if let Some((home, true)) = sessions.cached_group(self.group) {
                sessions.refresh(at, home);
            }
        }
        if let Some(candidates) = &self.placing {
            let index = candidates.iter().position(|c| c.name == backend.name);
            let rank = Rank::of_index(index.unwrap_or(usize::MAX));
            backend.live.groups.count_placement(rank);
        }
    }
}
