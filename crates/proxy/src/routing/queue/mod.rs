//! Queue (`queue`): each backend takes at most `max_inflight` requests
//! (mode http) or connections (mode tcp) at once; what finds no room waits
//! in one bounded queue, and leaves it by priority, by tenant in turn, and
//! for the backend that holds its cache.
//!
//! ```text
//! admit(targets) ─ room at its home? ──yes──▶ Admitted (at once)
//!        │ no: queue full? ──yes──▶ Refusal::Full (429)
//!        ▼
//!     waiting ◀── a slot given back at a backend (ActiveGuard drops):
//!        │        the next eligible waiter, in order::Waiting's order, takes it
//!        ├─ affinity_wait passed: its next candidate with room where the spill pays
//!        ├─ queue.timeout passed ─▶ Refusal::TimedOut (503)
//!        └─ the client went away ─▶ out of the queue at once
//! ```
//!
//! A request's home is its first target: its session pin, or the table's
//! owner of its key. It waits for its home at least `queue.affinity_wait`,
//! then takes another of its targets only where that pays in work
//! ([`Waiter::spill_pays`]); a conversation's first request (sessions on,
//! no pin yet) goes where it costs least ([`cost`]): its own wait for a
//! first token (the work each target holds plus what it would still have
//! to prefill of this request, less what its cache likely holds of it: its
//! group's head or its system head) plus, under load, the turns that the
//! conversations in flight there will send ahead of its next, and what a
//! cache elsewhere would have spared them; it takes that target at once if
//! it has room, else waits for it, or for any other that comes to cost as
//! little. A tiny shared head never outweighs load; a long agent prompt
//! does, and more so the more requests wait. (One that opens like a
//! conversation served lately comes sticky, its home where that one went,
//! see [`crate::routing::llm::openings`]; one grouped by a header, whose
//! head's size nobody knows, takes the first target with room.) A backend
//! whose engine reports itself full (`health.load`), or whose requests
//! awaiting their first byte hold [`SlotLimits::max_work`] of prefill (the
//! least of `queue.max_prefill_tokens` and its engine's unheld KV cache),
//! counts as at its limit. Work is the prompt tokens a backend still has
//! to prefill, estimated per request ([`crate::routing::backend::load`]).
//! Every magpie with the same config orders the targets the same way, so a
//! spill goes to the same place on each.
//!
//! Nothing waits without three bounds: `queue.size` requests,
//! `queue.max_body_bytes` of their bodies (only what was read for the key
//! is held; the rest waits in the client's socket), and `queue.timeout`.
//! The queue lives as long as the instance: a reload rebinds every waiting
//! request to the new table ([`Queue::rebind`]).

pub(crate) mod cost;
pub(crate) mod order;
pub(crate) mod room;
pub(crate) mod stats;
mod ticket;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use self::cost::{Base, Order, cost};
pub(crate) use self::order::Standing;
use self::order::Waiting;
pub(crate) use self::room::SlotLimits;
use self::room::{Room, first_with_room, room};
pub(crate) use self::stats::{Admit, QueueStats, Refusal};
use self::ticket::Ticket;
use crate::config::DEFAULT_MAX_INFLIGHT;
use crate::config::{Config, DEFAULT_AGING, MAX_CLASSES, QueueConfig};
use crate::routing::backend::{ActiveGuard, Backend, Live, SlotFreed, WorkGuard};
use crate::routing::keys::TenantKey;
use crate::routing::llm::work::Work;
use crate::routing::route::Route;
use crate::routing::snapshot::Snapshot;

/// The queue of one magpie, and the limits it enforces.
#[derive(Debug)]
pub(crate) struct Queue {
    state: Mutex<State>,
    /// Requests waiting, read without the lock when a slot is given back.
    len: AtomicUsize,
    /// Set at shutdown: by then every waiting request is served or refused.
    closing: watch::Sender<Option<Instant>>,
    pub(crate) stats: QueueStats,
}

/// The queue and the settings it hands slots out by (the latest
/// published config's).
#[derive(Debug)]
struct State {
    waiting: Waiting<Waiter>,
    limits: SlotLimits,
    aging: Duration,
}

/// What a request asks to be admitted with.
pub(crate) struct Ask<'a> {
    /// Its targets, its home first.
    pub(crate) targets: &'a [Arc<Backend>],
    /// Whether it waits for its home (its cache is there) before it spills.
    pub(crate) sticky: bool,
    /// Whether its home is its session pin (kept across a reload).
    pub(crate) pinned: bool,
    /// A conversation's first request: it goes where it costs least
    /// ([`cost`]; not sticky only).
    pub(crate) places: bool,
    /// Its class (an index into `queue.priority.classes`) and tenant.
    pub(crate) class: usize,
    pub(crate) tenant: TenantKey,
    /// Body bytes it holds while it waits.
    pub(crate) bytes: u64,
    /// Its prefill work, at each target.
    pub(crate) work: Work,
    /// Its table key, to bind it again after a reload.
    pub(crate) key: u64,
    pub(crate) queue: &'a QueueConfig,
    pub(crate) limits: SlotLimits,
    /// A disaggregated request's prefill half: its targets are the prefill
    /// pool's, and a reload binds it to that pool's table.
    pub(crate) prefill: bool,
    /// Admitted once already and placed again: not counted again.
    pub(crate) again: bool,
}

/// A request admitted: the backend it goes to and the slot it holds there.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) backend: Arc<Backend>,
    pub(crate) slot: ActiveGuard,
    /// Its work there, held until its answer's first byte.
    pub(crate) work: WorkGuard,
    pub(crate) how: Admit,
    pub(crate) waited: Duration,
    /// It found no room at once and waited in the queue.
    pub(crate) queued: bool,
}

/// Room handed to a waiting request: at which of its targets.
type Grant = (Arc<Backend>, Room);

/// One request in the queue.
#[derive(Debug)]
struct Waiter {
    targets: Vec<Arc<Backend>>,
    /// Until then only its home will do.
    home_until: Instant,
    /// It waits for its home (the cache is there); after `home_until` it
    /// spills only where that pays.
    sticky: bool,
    pinned: bool,
    key: u64,
    /// A prefill half: bound to the prefill pool.
    prefill: bool,
    bytes: u64,
    work: Work,
    grant: oneshot::Sender<Grant>,
}

impl Waiter {
    /// The target whose live state is `live`, if the request may take it
    /// now: its home, and once `home_until` passed, another target where
    /// spilling pays ([`Waiter::spill_pays`]), or any when its home's
    /// engine takes it not (full for new keys, and not its pin, or far
    /// over); the backend's own engine must take it (`limits`).
    fn takes(&self, live: &Arc<Live>, now: Instant, limits: &SlotLimits) -> Option<&Arc<Backend>> {
        if self.grant.is_closed() {
            // Its request went away: its ticket takes it off.
            return None;
        }
        let i = (self.targets.iter()).position(|b| Arc::ptr_eq(&b.live, live))?;
        let to = &self.targets[i];
        let home_takes = || !limits.engine_full(&self.targets[0], self.kept(0), now);
        let pays = || !home_takes() || self.spill_pays(to);
        let may = i == 0 || (now >= self.home_until && pays());
        (may && !limits.engine_full(to, self.kept(i), now)).then_some(to)
    }

    /// Its target whose live state is `live`.
    fn target_at(&self, live: &Arc<Live>) -> Option<&Arc<Backend>> {
        (self.targets.iter()).find(|b| Arc::ptr_eq(&b.live, live))
    }

    /// Whether its target `i` is its pin (kept there though the engine is
    /// full for new keys, unless far over).
    fn kept(&self, i: usize) -> bool {
        self.pinned && i == 0
    }

    /// Whether the request would cost no more at `to` than at its home
    /// ([`cost`]): the prefill `to` holds plus all of this request's,
    /// against what its home holds plus only its uncached part there; and
    /// for each request in flight at each, a mean request's work (the turn
    /// it will send) and, at `to`, what its home's cache would spare (work
    /// that is all zero, as in mode tcp, always pays). A request without a
    /// home (not sticky) goes anywhere.
    fn spill_pays(&self, to: &Backend) -> bool {
        let Some(home) = self.targets.first().filter(|_| self.sticky) else {
            return true;
        };
        let base = Base::of(&self.targets, &self.work);
        cost(to, &self.work, &base) <= cost(home, &self.work, &base)
    }
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            state: Mutex::new(State {
                waiting: Waiting::new(MAX_CLASSES),
                limits: SlotLimits {
                    max_inflight: DEFAULT_MAX_INFLIGHT,
                    max_prefill_tokens: None,
                    load: None,
                },
                aging: DEFAULT_AGING,
            }),
            len: AtomicUsize::new(0),
            closing: watch::Sender::new(None),
            stats: QueueStats::default(),
        }
    }
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change to the queue is one step under the lock, so a lock
        // poisoned by a panic elsewhere still guards a consistent queue.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Requests waiting now.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// magpie is shutting down: every request waiting (or that comes to
    /// wait) is served or refused with `503` by `at`.
    pub(crate) fn close_by(&self, at: Instant) {
        self.closing.send_replace(Some(at));
    }

    /// Requests waiting in each class, in the classes' order.
    pub(crate) fn depths(&self, classes: usize) -> Vec<usize> {
        let state = self.lock();
        (0..classes).map(|c| state.waiting.depth(c)).collect()
    }

    /// Takes the settings of a config being published, and hands out the
    /// room a raised limit made.
    pub(crate) fn configure(&self, config: &Config, snapshot: &Snapshot) {
        {
            let mut state = self.lock();
            if let Some(q) = &config.queue {
                state.limits = SlotLimits::of(q, config.load_limits());
                state.aging = q.priority.aging;
                state.waiting.set_across_classes(q.tenant_across_classes);
            }
        }
        for b in snapshot.every_backend() {
            self.hand_out(&b.live);
        }
    }

    /// Binds every waiting request to `snapshot` (a reload published it):
    /// its pin first if it had one and the backend is still there, then its
    /// key's targets in the new table (a prefill half's in the prefill
    /// pool's; none when the pool is gone, and it waits out its time). Then
    /// hands out what has room.
    pub(crate) fn rebind(&self, snapshot: &Snapshot) {
        {
            let mut state = self.lock();
            for w in state.waiting.waiters_mut() {
                let pool = match w.prefill {
                    true => snapshot.prefill.as_deref(),
                    false => Some(snapshot),
                };
                let Some(pool) = pool else {
                    w.targets.clear();
                    continue;
                };
                let route = Route::preview(pool, w.key);
                let pin = (w.targets.first())
                    .filter(|_| w.pinned)
                    .and_then(|home| pool.backend(&home.name))
                    .cloned();
                w.targets = match pin {
                    Some(pin) => route.pin_first(pool, &pin).targets,
                    None => route.targets,
                };
            }
        }
        self.configure(&snapshot.config, snapshot);
    }

    /// Admits the request `ask` describes: at once if its home (or, for a
    /// request that is not sticky, any target) has room, else after
    /// waiting in the queue. `gone` resolves when the client goes away.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        ask: Ask<'_>,
        gone: impl Future<Output = ()>,
    ) -> Result<Admitted, Refusal> {
        let started = Instant::now();
        let q = ask.queue;
        let waits_for_home = ask.sticky && !q.affinity_wait.is_zero() && ask.targets.len() > 1;
        let home_wait = match waits_for_home {
            true => q.affinity_wait,
            false => Duration::ZERO,
        };
        let (rx, id) = {
            let mut state = self.lock();
            // The settings of the config this request was routed with: the
            // latest published, but for a request routed just before a reload.
            state.limits = ask.limits;
            state.aging = q.priority.aging;
            state.waiting.set_across_classes(q.tenant_across_classes);
            let order = Order::of(&ask, waits_for_home);
            let targets = &order.targets;
            let room_now = || {
                first_with_room(targets, &ask.limits, &ask.work, ask.pinned, |i| {
                    order.may(i)
                })
            };
            if let Some(found) = room_now() {
                drop(state);
                return Ok(self.without_waiting(&ask, targets, found, started));
            }
            if let Err(why) = fits(&state.waiting, &ask, self.stats.bytes()) {
                drop(state);
                self.stats.refused(ask.class, why);
                return Err(why);
            }
            let (tx, rx) = oneshot::channel();
            let waiter = Waiter {
                targets: targets.clone(),
                home_until: started + home_wait,
                pinned: ask.pinned,
                sticky: order.sticky(),
                key: ask.key,
                prefill: ask.prefill,
                bytes: ask.bytes,
                work: ask.work.clone(),
                grant: tx,
            };
            let id = state
                .waiting
                .push(ask.class, ask.tenant.hash(), started, waiter);
            self.len.store(state.waiting.len(), Ordering::SeqCst);
            // A slot given back after the look above and before the push
            // found the queue empty and was handed to nobody: look once
            // more. The fences pair with the one in `hand_out`, so one of
            // the two sees the other.
            fence(Ordering::SeqCst);
            if let Some(found) = room_now() {
                state.waiting.remove(id);
                self.len.store(state.waiting.len(), Ordering::Relaxed);
                drop(state);
                return Ok(self.without_waiting(&ask, targets, found, started));
            }
            self.stats.hold_bytes(ask.bytes, true);
            (rx, id)
        };
        let ticket = Ticket {
            queue: self,
            id,
            home_until: started + home_wait,
            deadline: started + q.timeout,
        };
        match ticket.wait(rx, &ask, gone).await {
            Ok((b, room, how)) => Ok(self.admitted(&ask, &b, room, (how, true), started)),
            Err(why) => {
                self.stats.refused(ask.class, why);
                Err(why)
            }
        }
    }

    /// Admitted at once at `targets[i]` (its targets, in the order it
    /// takes them): at its home, or (not sticky) at another target.
    fn without_waiting(
        &self,
        ask: &Ask<'_>,
        targets: &[Arc<Backend>],
        (i, room): (usize, Room),
        started: Instant,
    ) -> Admitted {
        let backend = &targets[i];
        let home = ask.targets.first().is_some_and(|h| Arc::ptr_eq(h, backend));
        let how = match () {
            () if home => Admit::AtOnce,
            () if ask.places && !ask.sticky => Admit::Placed,
            () => Admit::Spilled,
        };
        self.admitted(ask, backend, room, (how, false), started)
    }

    fn admitted(
        &self,
        ask: &Ask<'_>,
        backend: &Arc<Backend>,
        (slot, work): Room,
        (how, queued): (Admit, bool),
        started: Instant,
    ) -> Admitted {
        let waited = started.elapsed();
        if !ask.again {
            self.stats.admitted(ask.class, how, waited);
        }
        Admitted {
            backend: Arc::clone(backend),
            slot,
            work,
            how,
            waited,
            queued,
        }
    }

    /// Takes request `id` off the queue if it is still there; `false` when
    /// a slot was handed to it first.
    fn leave(&self, id: u64) -> bool {
        let mut state = self.lock();
        let left = state.waiting.remove(id);
        self.len.store(state.waiting.len(), Ordering::Relaxed);
        drop(state);
        left.inspect(|w| self.stats.hold_bytes(w.bytes, false))
            .is_some()
    }

    /// Request `id`, whose home wait is over, takes the first of its
    /// targets with room, if any (and leaves the queue).
    fn spill(&self, id: u64) -> Option<Grant> {
        let mut state = self.lock();
        let limits = state.limits;
        let waiter = state.waiting.get(id)?;
        let targets = waiter.targets.clone();
        let (i, room) = (targets.iter().enumerate())
            .filter(|(i, b)| *i == 0 || waiter.spill_pays(b))
            .find_map(|(i, b)| room(b, &limits, &waiter.work, waiter.kept(i)).map(|r| (i, r)))?;
        // Still there: the lock was held since `get`.
        let left = state.waiting.remove(id);
        self.len.store(state.waiting.len(), Ordering::Relaxed);
        drop(state);
        let w = left?;
        self.stats.hold_bytes(w.bytes, false);
        Some((Arc::clone(&targets[i]), room))
    }

    /// Hands slots at `live` to waiting requests while it has room, in the
    /// queue's order.
    fn hand_out(&self, live: &Arc<Live>) {
        // Pairs with the fence in `admit`: a slot given back just before
        // is seen there, or the request pushed just before is seen here.
        fence(Ordering::SeqCst);
        if self.is_empty() {
            return;
        }
        let mut unclaimed = Vec::new();
        let mut state = self.lock();
        let State {
            waiting,
            limits,
            aging,
        } = &mut *state;
        loop {
            let now = Instant::now();
            // The class to take room for (the backend as any eligible
            // waiter knows it, where work is counted by class), and the
            // request that goes next, judged before its room is taken: its
            // own slot counts not against its spill. Judged after, a spill
            // that paid only without it left the slot unclaimed, and its
            // return handed it out again, without end.
            let Some((backend, class)) = waiting.find(|w| {
                w.takes(live, now, limits)
                    .map(|b| (Arc::clone(b), w.work.class))
            }) else {
                break;
            };
            let picks = |w: &Waiter| {
                let to = w.takes(live, now, limits);
                to.is_some_and(|b| w.work.class == class || limits.work_room(b, w.work.class))
            };
            let Some(place) = waiting.next(now, *aging, picks) else {
                break;
            };
            // Room is taken before the request's work is added (the check
            // was that the backend had room); the queue is unchanged between.
            let reserved = Work::default().in_class(class);
            let Some((slot, mut work)) = room(&backend, limits, &reserved, true) else {
                break;
            };
            let Some(picked) = waiting.take(place) else {
                unclaimed.push((slot, work));
                break;
            };
            let w = picked.waiter;
            self.stats.hold_bytes(w.bytes, false);
            let target = w.target_at(live).cloned().unwrap_or(backend);
            work.grow(w.work.at(&target), w.work.class);
            if let Err((_, room)) = w.grant.send((target, (slot, work))) {
                // Its request went away as the slot came.
                unclaimed.push(room);
            }
        }
        self.len.store(waiting.len(), Ordering::Relaxed);
        drop(state);
        // Given back outside the lock: each may wake the next waiter.
        drop(unclaimed);
    }
}

impl SlotFreed for Queue {
    fn slot_freed(&self, live: &Arc<Live>) {
        self.hand_out(live);
    }
}

/// Whether one more request fits the queue's bounds; the refusal if not.
fn fits(waiting: &Waiting<Waiter>, ask: &Ask<'_>, held: u64) -> Result<(), Refusal> {
    let q = ask.queue;
    if waiting.len() >= q.size || held.saturating_add(ask.bytes) > q.max_body_bytes {
        return Err(Refusal::Full);
    }
    if q.tenant_max_queued
        .is_some_and(|m| waiting.of_tenant(ask.tenant.hash()) >= m)
    {
        return Err(Refusal::TenantFull);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
