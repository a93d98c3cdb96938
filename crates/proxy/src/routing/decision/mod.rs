//! One routing decision, the same for every data path: a request (mode
//! http), a connection (mode tcp) or a new flow (mode udp) asks here where
//! it goes, and tells here where it went. No data path reads or writes pins,
//! the key memory or the LLM policy's records itself.
//!
//! ```text
//! Request ──plan──▶ Plan: targets in order, why the first (How), what to wait for
//!    (keys, standing,        │ take: a slot at the next target (its cap, or the queue)
//!     what it sent)          ▼
//!                          Slot ──(the data path connects and sends; a target that
//!                            │     takes nothing: passed_over, then take again)
//!                            ▼ commit
//!                      Committed: the key memory, pins, openings, groups; why it moved
//!                            │ (mode http) the answer's usage
//!                            ▼
//!                          Tally: token counters, cache misses
//! ```
//!
//! A plan is the table's route ([`crate::routing::route`]): by the key's
//! pin under `sessions` ([`pins`]), else by the table and where the key
//! spilled (the key memory), the fallback key's reason, and for a QUIC
//! client that moved its connection's backend first. Under a `queue`, a
//! slot is what the queue gives ([`crate::routing::queue`]), and the plan
//! says what the request waits for: its home (its cache is there) or, for a
//! conversation's first request (and a later turn whose engine likely
//! evicted its cache), where its cache is likeliest (the LLM policy,
//! [`crate::routing::llm`]: groups, openings, prefill work). A
//! commit writes what the decision means once the backend took it: the key
//! memory's record, the pin, the opening's record, the group's counts.
//!
//! | module | owns |
//! |---|---|
//! | [`pins`] | session pins: the route by a key's pin, and binding or using it once served |

pub(crate) mod pins;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use self::pins::Pinned;
use crate::config::{Config, QueueConfig, TenantBy};
use crate::routing::backend::{ActiveGuard, Awaiting, AwaitingGuard, Backend, Spill, WorkGuard};
use crate::routing::instance::Instance;
use crate::routing::key_memory::{Decision, KeyMemory, MissCause};
use crate::routing::keys::{Keys, MemoryKey, SessionKey, TenantKey};
use crate::routing::llm::disaggregation as split;
use crate::routing::llm::groups::Grouped;
use crate::routing::llm::note::Sent;
use crate::routing::llm::openings;
use crate::routing::llm::usage::Tally;
use crate::routing::llm::work::{self, Heads};
use crate::routing::queue::{Admit, Admitted, Ask, Refusal, SlotLimits, Standing};
use crate::routing::route::{How, Route};
use crate::routing::sessions::homes::AwaitingMark;
use crate::routing::snapshot::Snapshot;

/// What a data path knows of one request, connection or new flow.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) keys: Keys,
    /// No key was found: `keys.session` is the fallback key.
    pub(crate) fallback: bool,
    /// Its class and tenant (`queue`).
    pub(crate) standing: Standing,
    /// Its body's length (mode http; what was read of it when no length was
    /// given): its work is estimated from it.
    pub(crate) prompt_bytes: u64,
    /// The backend of the connection it belongs to (mode udp: a QUIC client
    /// that moved), tried first.
    pub(crate) follows: Option<Arc<Backend>>,
    /// It counts among its backend's requests awaiting their first byte of
    /// body until that byte comes (mode http).
    pub(crate) awaits_first_byte: bool,
    /// What of its body other requests share (mode http): its group's
    /// head and its system head, which a backend that served them lately
    /// still has to prefill less of.
    pub(crate) heads: Heads,
}

impl Request {
    /// A request known by its `keys` alone.
    pub(crate) fn new(keys: Keys) -> Request {
        Request {
            keys,
            fallback: false,
            standing: Standing::default(),
            prompt_bytes: 0,
            follows: None,
            awaits_first_byte: false,
            heads: Heads::default(),
        }
    }

    /// A connection (mode tcp) keyed by `key`, of the queue's default class.
    pub(crate) fn connection(key: SessionKey, fallback: bool, config: &Config) -> Request {
        Request {
            fallback,
            standing: Standing::of(config.queue.as_ref(), |_| None),
            ..Request::new(Keys::single(key))
        }
    }

    /// A new flow (mode udp) keyed by `key`; `follows` when its client moved.
    pub(crate) fn flow(key: SessionKey, fallback: bool, follows: Option<Arc<Backend>>) -> Request {
        Request {
            fallback,
            follows,
            ..Request::new(Keys::single(key))
        }
    }
}

/// Where a request goes: its targets in order, why the next is next, and
/// what it waits for; what it did once a target took it.
#[derive(Debug)]
pub(crate) struct Plan {
    request: Request,
    /// The route as planned.
    route: Route,
    /// The targets not taken yet, the next first.
    rest: Vec<Arc<Backend>>,
    /// Why the next target taken is that one.
    how: How,
    /// Under `sessions`: what serving the request does to its pin, and
    /// what rides on it (boxed: a plan without one stays small, as a
    /// connection's task carries it).
    pinned: Option<Box<Pinned>>,
    /// Sessions are on and the key was not routed by its pin.
    pin_lost: bool,
    /// Under a `queue`, a later turn whose pin's engine has likely evicted
    /// its conversation ([`crate::routing::llm::work::evicted`]): it is
    /// placed as a first request is, its pin following.
    evicted: bool,
    /// It waits for its first target (its cache is there) before it spills.
    sticky: bool,
    /// Whose record tells its work (`queue`).
    work_key: MemoryKey,
    /// A `queue` was configured: openings are remembered.
    queued: bool,
    /// Connects left (`connect.attempts`): a route under a queue keeps
    /// more targets than that, to choose among.
    attempts_left: usize,
}

/// A backend's room, taken for a request.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) backend: Arc<Backend>,
    /// The backend's in-flight slot (what bounded load counts).
    pub(crate) active: ActiveGuard,
    /// Its count among the requests awaiting a first byte (mode http).
    pub(crate) first_byte: Option<FirstByte>,
    /// With `queue`: how long it waited and how it was admitted.
    pub(crate) queued: Option<(Duration, Admit)>,
}

/// What a request awaiting its answer's first byte of body holds, each
/// given back when it drops (at that byte): its count at the backend
/// ([`crate::routing::backend::load`]), when it opened a conversation or
/// placed a new group with a shared store its mark there
/// ([`crate::routing::sessions::homes`]), and its prefill work (`queue`).
#[derive(Debug)]
pub(crate) struct FirstByte {
    _count: AwaitingGuard,
    _mark: Option<AwaitingMark>,
    work: Option<WorkGuard>,
}

impl FirstByte {
    /// The first byte of body came (dropping it without this: the request
    /// ended first): its work there teaches the backend's prefill rate.
    pub(crate) fn arrived(self) {
        if let Some(work) = self.work {
            work.answered();
        }
    }
}

/// What taking a slot came to.
#[derive(Debug)]
pub(crate) enum Taken {
    Slot(Slot),
    /// The queue refused it, or its client went away while it waited.
    Refused(Refusal),
    /// No target is left.
    None,
}

/// What a decision came to once its backend took the request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Committed {
    /// Why it was that backend.
    pub(crate) how: How,
    key: SessionKey,
    /// Why the key moved there, if it did.
    moved: Option<MissCause>,
}

impl Committed {
    /// Where the answer's usage is counted.
    pub(crate) fn tally(&self, instance: &Arc<Instance>) -> Tally {
        Tally {
            instance: Arc::clone(instance),
            key: self.key,
            moved: self.moved,
        }
    }
}

/// The plan for `request`, under the snapshot it was keyed with: by its pin
/// when `sessions` is on (which may ask the shared store), else as
/// [`plan_now`].
pub(crate) async fn plan(instance: &Instance, snapshot: &Snapshot, request: Request) -> Plan {
    let Some(sessions) = instance.sessions() else {
        return plan_now(instance, snapshot, request);
    };
    let spilled_to = spilled_to(instance, snapshot, request.keys.session);
    let keys = request.keys;
    let asked = (keys, request.prompt_bytes);
    let (route, pinned) = pins::route(sessions, snapshot, asked, spilled_to.as_deref()).await;
    Plan::new(instance, snapshot, request, route, Some(pinned))
}

/// The plan for `request` without pins (`sessions` is mode http's): by the
/// table and where its key spilled. It never waits.
pub(crate) fn plan_now(instance: &Instance, snapshot: &Snapshot, request: Request) -> Plan {
    let spilled_to = spilled_to(instance, snapshot, request.keys.session);
    let route = Route::plan_remembered(snapshot, request.keys.table(), spilled_to.as_deref());
    Plan::new(instance, snapshot, request, route, None)
}

/// Where `key` spilled and stays, when anything can make a key spill (a
/// bounded-load cap or engine load limits).
fn spilled_to(instance: &Instance, snapshot: &Snapshot, key: SessionKey) -> Option<String> {
    let config = &snapshot.config;
    let spills = config.placement.bounded_load.is_some() || config.load_limits().is_some();
    spills
        .then(|| instance.key_memory.spilled_to(key))
        .flatten()
}

impl Plan {
    fn new(
        instance: &Instance,
        snapshot: &Snapshot,
        request: Request,
        route: Route,
        mut pinned: Option<Pinned>,
    ) -> Plan {
        let mut route = route.for_fallback(request.fallback);
        if let Some(backend) = &request.follows {
            route = route.pin_first(snapshot, backend);
        }
        let keys = request.keys;
        let pin_lost = pinned.is_some() && route.how != How::Pinned;
        if let Some(pinned) = &mut pinned {
            pinned.grouped = (keys.group).map(|g| Grouped::new(snapshot, g, pinned.placed));
        }
        let opening = pinned.as_ref().is_some_and(|p| p.opening.is_some());
        let queued = snapshot.config.queue.is_some();
        let memory = &instance.key_memory;
        let evicted = queued
            && pinned.is_some()
            && route.how == How::Pinned
            && (route.first()).is_some_and(|pin| work::evicted(memory, keys.session.memory(), pin));
        let mut plan = Plan {
            rest: route.targets.clone(),
            how: route.how,
            sticky: !pin_lost && !opening && !evicted,
            work_key: keys.session.memory(),
            route,
            request,
            pinned: pinned.map(Box::new),
            pin_lost,
            evicted,
            queued,
            attempts_left: snapshot.config.connect.attempts as usize,
        };
        // A conversation's first request that opens like one served lately
        // (through any magpie of a fleet) waits where that one went, its
        // work there told by its record.
        let alike = keys.opening.filter(|_| queued && pin_lost);
        plan.note_sent_elsewhere(memory);
        if let Some(opening) = alike
            && let Some(opened) = plan.pinned.as_ref().and_then(|p| p.opened.as_ref())
            && let Some(at) = snapshot.backend(&opened.at)
        {
            openings::opened(memory, opening, at, opened.prompt_bytes);
        }
        if let Some(opening) = alike
            && let Some(moved) = openings::alike(memory, opening, &mut plan.rest)
        {
            plan.sticky = true;
            plan.work_key = opening.memory();
            if moved {
                plan.how = How::Opening;
            }
        }
        plan
    }

    /// A pinned turn whose previous request another magpie may have
    /// served: its work is told from the bytes the store says that one
    /// sent.
    fn note_sent_elsewhere(&self, memory: &KeyMemory) {
        if let Some(bytes) = self.pinned.as_ref().and_then(|p| p.sent)
            && self.how == How::Pinned
            && let Some(at) = self.route.first()
        {
            let keys = self.request.keys;
            let sent = Sent {
                group: keys.group,
                prompt_bytes: bytes,
            };
            memory.sent_elsewhere(keys.session, at, sent);
        }
    }

    /// Why the next target taken is that one.
    pub(crate) fn how(&self) -> How {
        self.how
    }

    /// With `disaggregation`: the prefill pool's route for its prefill
    /// half, or why it is not split
    /// ([`crate::routing::llm::disaggregation`]).
    pub(crate) fn prefill_route(
        &self,
        instance: &Instance,
        snapshot: &Snapshot,
    ) -> Result<split::PrefillPlan, split::Decision> {
        let request = &self.request;
        let asked = split::Asked {
            keys: request.keys,
            bytes: request.prompt_bytes,
            heads: request.heads,
            standing: request.standing,
        };
        let decode = self.route.first();
        split::prefill_route(snapshot, &instance.key_memory, asked, decode)
    }

    /// The targets as planned, in order.
    pub(crate) fn targets(&self) -> &[Arc<Backend>] {
        &self.route.targets
    }

    /// A slot at the next target that takes the request, which leaves the
    /// plan: without `config.queue`, the next under its bounded-load cap
    /// ([`Plan::take_now`]); with it, the one the queue gives (the first,
    /// or after `queue.affinity_wait` the next with room where a spill
    /// pays), waiting if need be while it holds `held` bytes of its body;
    /// `gone` resolves if its client goes away meanwhile. A conversation's
    /// first request placed while other magpies share the store is placed
    /// again if one of them placed work at its backend since its lookup
    /// (at the same instant, in a burst; [`Pinned::crowded`]).
    pub(crate) async fn take(
        &mut self,
        instance: &Instance,
        config: &Config,
        held: u64,
        gone: impl Future<Output = ()>,
    ) -> Taken {
        let Some(queue) = &config.queue else {
            return match self.take_now() {
                Some(slot) => Taken::Slot(slot),
                None => Taken::None,
            };
        };
        if self.rest.is_empty() || self.attempts_left == 0 {
            return Taken::None;
        }
        let mut gone = std::pin::pin!(gone);
        let limits = SlotLimits::of(queue, config.load_limits());
        let ask = self.ask(instance, (queue, limits), held, false);
        let admitted = match instance.queue.admit(ask, gone.as_mut()).await {
            Ok(admitted) => admitted,
            Err(why) => return Taken::Refused(why),
        };
        let admitted = match self.crowded(instance, &admitted).await {
            false => admitted,
            true => {
                let ask = self.ask(instance, (queue, limits), held, true);
                match self.place_again(instance, ask, admitted, gone).await {
                    Ok(admitted) => admitted,
                    Err(why) => return Taken::Refused(why),
                }
            }
        };
        if admitted.how == Admit::Spilled {
            self.how = self.how.passed_over(Spill::AtCap);
        } else if self.evicted
            && self
                .route
                .first()
                .is_some_and(|pin| pin.name != admitted.backend.name)
        {
            self.how = How::Evicted;
        }
        self.rest.retain(|b| !Arc::ptr_eq(b, &admitted.backend));
        let queued = Some((admitted.waited, admitted.how));
        let slot = self.slot(admitted.backend, admitted.slot, Some(admitted.work));
        Taken::Slot(Slot { queued, ..slot })
    }

    /// Whether it was placed by cost at once at `admitted`'s backend (not
    /// waiting for a home, nor in the queue) while other magpies share the
    /// store, and one of them placed work there since ([`Pinned::crowded`]).
    async fn crowded(&self, instance: &Instance, admitted: &Admitted) -> bool {
        let by_cost = self.places() && !self.sticky && !admitted.queued;
        match self.pinned.as_ref().filter(|_| by_cost) {
            Some(pinned) => {
                let snapshot = instance.snapshot.load_full();
                pinned.crowded(&snapshot.backends, &admitted.backend).await
            }
            None => false,
        }
    }

    /// `admitted` given back and `ask` admitted in its place, on the fresh
    /// view of the fleet's work; counted if it went elsewhere.
    async fn place_again(
        &self,
        instance: &Instance,
        ask: Ask<'_>,
        admitted: Admitted,
        gone: impl Future<Output = ()>,
    ) -> Result<Admitted, Refusal> {
        let was = Arc::clone(&admitted.backend);
        drop(admitted);
        let again = instance.queue.admit(ask, gone).await?;
        if let Some(pinned) = &self.pinned
            && !Arc::ptr_eq(&was, &again.backend)
        {
            pinned.count_moved_placement();
        }
        Ok(again)
    }

    /// Whether it is a conversation's first request, or a later turn whose
    /// cache was likely evicted, placed where it costs least (a header's
    /// group, whose head's size is not known, keeps its home first while
    /// it has room).
    fn places(&self) -> bool {
        let keys = self.request.keys;
        let known_head = keys.group.is_none() || self.request.heads.group_bytes > 0;
        (self.pin_lost && known_head) || self.evicted
    }

    /// What it asks `queue` for, under its slot `limits`, holding `held`
    /// bytes of its body; `again` once it was admitted and is placed again.
    fn ask<'a>(
        &'a self,
        instance: &Instance,
        (queue, limits): (&'a QueueConfig, SlotLimits),
        held: u64,
        again: bool,
    ) -> Ask<'a> {
        let keys = self.request.keys;
        let class = (queue.priority.engine.is_some()).then_some(self.request.standing.class);
        let work = work::work(
            &instance.key_memory,
            self.work_key,
            self.request.prompt_bytes,
        );
        Ask {
            targets: &self.rest,
            sticky: self.sticky,
            pinned: self.route.how == How::Pinned && !self.evicted,
            places: self.places(),
            class: self.request.standing.class,
            tenant: match queue.tenant {
                Some(TenantBy::Group) => TenantKey::of_group(keys.group),
                _ => self.request.standing.tenant,
            },
            bytes: held,
            work: work
                .of_group(keys.group, self.request.heads)
                .in_class(class),
            key: keys.table(),
            queue,
            limits,
            prefill: false,
            again,
        }
    }

    /// A slot at the next target under its bounded-load cap, without
    /// waiting; a target that filled up since the plan was made is passed
    /// over (counted as a spill). `None` when no target is left.
    pub(crate) fn take_now(&mut self) -> Option<Slot> {
        while !self.rest.is_empty() && self.attempts_left > 0 {
            let backend = self.rest.remove(0);
            match self.route.reserve(&backend) {
                Some(active) => return Some(self.slot(backend, active, None)),
                None => self.how = self.how.passed_over(Spill::AtCap),
            }
        }
        None
    }

    /// The slot `active` at `backend`, its work there held until the first
    /// byte; the first slot taken is the last to wait for its home.
    fn slot(
        &mut self,
        backend: Arc<Backend>,
        active: ActiveGuard,
        work: Option<WorkGuard>,
    ) -> Slot {
        self.sticky = false;
        self.attempts_left = self.attempts_left.saturating_sub(1);
        let first_byte = self.request.awaits_first_byte.then(|| {
            // A conversation's opening counts at the first backend that
            // takes it, a new group's at its home only.
            let opening = self.pinned.as_mut().and_then(|p| p.opening.take());
            let (kind, mark) = match opening {
                Some(opening) => opening.claimed_at(&backend.name),
                None => (Awaiting::Turn, None),
            };
            FirstByte {
                _count: backend.live.await_first_byte(kind),
                _mark: mark,
                work,
            }
        });
        Slot {
            backend,
            active,
            first_byte,
            queued: None,
        }
    }

    /// The target last taken took nothing (`why`: it refused the connection
    /// or closed it before a byte went): the next one taken is a spill.
    pub(crate) fn passed_over(&mut self, why: Spill) {
        self.how = self.how.passed_over(why);
    }

    /// `backend` took the request: the key memory records the decision (and
    /// under a `queue` how the conversation opens), the pin is bound or
    /// used again, and the request's group is counted.
    pub(crate) fn commit(&self, instance: &Instance, backend: &Arc<Backend>) -> Committed {
        let keys = self.request.keys;
        let prompt_bytes = self.request.prompt_bytes;
        let decision = Decision {
            how: self.how,
            pin_lost: self.pin_lost,
            sent: Sent {
                group: keys.group,
                prompt_bytes,
            },
        };
        let memory = &instance.key_memory;
        let moved = memory.routed(keys.session, backend, decision);
        if let Some(opening) = keys.opening.filter(|_| self.queued) {
            openings::opened(memory, opening, backend, prompt_bytes);
        }
        if let Some(pinned) = &self.pinned {
            pinned.served(
                keys,
                prompt_bytes,
                backend,
                &instance.snapshot.load().backends,
            );
        }
        Committed {
            how: self.how,
            key: keys.session,
            moved,
        }
    }
}
