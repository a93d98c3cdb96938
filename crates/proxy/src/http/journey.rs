//! One request's journey to a backend and back, written once for both wire
//! formats: the transport of a routing decision. `take a slot (the plan's
//! next target with room) ─▶ connect (pooled, or new) ─▶ send ─▶ the
//! answer's head ─▶ account (status, latency, passive health, the log line)
//! ─▶ commit the decision ─▶ respond ─▶ finish (usage, log, the connection
//! pooled or closed)`.
//!
//! Before the journey, the request was keyed and its decision planned
//! ([`crate::routing::decision`]: where it goes, and what it waits for);
//! the journey only takes the plan's slots in turn, says which target took
//! nothing, and commits the one that answered. After it, the wire format
//! relays the answer and ends it through [`InFlight::finish`]. Only what differs between the wire formats sits
//! behind [`Wire`]: how a connection is started, whether a pooled one is
//! ready, and how a request is written and its answer's head read (the
//! pass-through's own HTTP/1.1 in [`super::h1::send`], hyper's client in
//! [`super::hyper_wire`]). So every rule below holds for both:
//!
//! * A target at its cap is passed over; each one taken holds a slot (what
//!   bounded load counts) and counts as awaiting its first byte. With
//!   `queue`, the slot is the one [`crate::routing::queue`] gives: the
//!   key's home, or after `queue.affinity_wait` the next target with room,
//!   waiting in the queue if need be (`429` when it is full, `503` past
//!   `queue.timeout`, both with `Retry-After`).
//! * A failed connect counts against its backend (unless magpie itself ran
//!   out of file descriptors or memory: `503`) and moves on to the next
//!   target. A pooled connection found closed before a byte of the request
//!   went is dropped and the next pooled one (or a new one) tried; a new one
//!   that fails so moves on to the next target.
//! * Once any byte of the request was written it is never sent again: LLM
//!   requests are not idempotent. A failure then is the backend's (`502`),
//!   unless the client's own body broke (`400`).
//! * A backend that sends no response head within `http.response_timeout`
//!   of the request's latest byte gets its connection closed and the client
//!   `504` (counted against it as a timeout; a failed answer for passive
//!   health only with `health.passive_status`, like a 504 of its own).
//! * A `101 Switching Protocols` nobody asked for (magpie passes no
//!   `Upgrade` on) is a failed answer: `502`.
//! * When no target takes the request, the client gets `502` with a
//!   one-line reason.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::backend_deadlines::Progress;
pub(crate) use super::failure::{BODY_UNREADABLE, Failure, LocalAnswer, Source};
use super::pool::{Lease, Limits, Pool, Pooled};
use super::request_log::{Answer, RequestLog};
use super::response_body::InFlight;
use super::reuse::{Claim, reusable_after};
use super::upstream::{self, UpstreamIo};
use crate::config::Config;
use crate::routing::backend::{Backend, CodeClass, Spill, TimeoutKind};
use crate::routing::decision::{Plan, Slot, Taken};
use crate::routing::health::passive::{self, Blame};
use crate::routing::instance::Instance;
use crate::routing::queue::Refusal;

/// A wire format: what differs in sending a request to a backend and
/// reading its answer's head.
pub(crate) trait Wire {
    /// An upstream connection, as the pool keeps it.
    type Conn: Pooled;
    /// An answer's head, as this wire format reads it.
    type Head;

    /// The pool of this wire format's connections.
    fn pool(&self) -> &Arc<Pool<Self::Conn>>;

    /// Starts this wire format on a new connection to `backend`.
    fn start(
        io: UpstreamIo,
        backend: &Arc<Backend>,
    ) -> impl Future<Output = io::Result<Self::Conn>> + Send;

    /// Whether a connection taken from the pool can carry a request now.
    fn ready(conn: &mut Self::Conn) -> impl Future<Output = bool> + Send;

    /// Writes the request on `lease` and reads its answer's head, within
    /// `http.response_timeout` of the request's latest byte.
    fn exchange(
        &mut self,
        backend: &Arc<Backend>,
        lease: Lease<Self::Conn>,
        config: &Config,
    ) -> impl Future<Output = Exchange<Self>>;

    /// The answer's status code.
    fn status(head: &Self::Head) -> u16;

    /// Resolves if the client goes away while the request waits for a
    /// backend's room (`queue`); never where the format cannot tell.
    fn client_gone(&mut self) -> impl Future<Output = ()> + Send;
}

/// What sending a request over one connection came to.
pub(crate) enum Exchange<W: Wire + ?Sized> {
    /// An answer's head, the connection it came over, when the request was
    /// sent, and how far its body got.
    Answered {
        head: W::Head,
        lease: Lease<W::Conn>,
        sent: Instant,
        progress: Arc<Progress>,
    },
    /// Not a byte of it went out; `fresh` when the connection was new (a
    /// pooled one is followed by the next pooled one, a new one by the next
    /// target).
    NotSent { fresh: bool },
    /// It must go nowhere else.
    Failed(Failure),
    /// The client went away first.
    ClientGone,
}

/// What a journey came to.
pub(crate) enum Forwarded<W: Wire> {
    Answered(Box<Answered<W>>),
    /// Counted, and noted in the log line; the client gets
    /// [`Failure::answer`].
    Failed(Failure),
    ClientGone,
}

/// A backend's answer, its head read and accounted: the wire format relays
/// it and ends the request through `in_flight`, which carries the log line.
pub(crate) struct Answered<W: Wire> {
    pub(crate) head: W::Head,
    pub(crate) in_flight: InFlight<W::Conn>,
    pub(crate) progress: Arc<Progress>,
}

/// A request on its way: its plan, the config it was routed with and its
/// log line.
pub(crate) struct Journey<'a> {
    pub(crate) plan: Plan,
    /// Which idle connections it may take (`http.reuse`).
    pub(crate) claim: Claim,
    /// It carries a body: after an error answer its connection is not kept
    /// ([`super::reuse::reusable_after`]).
    pub(crate) with_body: bool,
    /// Body bytes it holds, read for its key: counted while it waits.
    pub(crate) held: u64,
    pub(crate) config: &'a Config,
    pub(crate) instance: &'a Arc<Instance>,
    /// The request's access-log line, if it is sampled: it moves into the
    /// answer's [`InFlight`], or stays for magpie's own answer.
    pub(crate) log: &'a mut Option<RequestLog>,
}

impl Journey<'_> {
    /// Sends the request to the first target of its plan that takes it
    /// (with `queue`, the first that has room, after waiting for it).
    pub(crate) async fn forward<W: Wire>(&mut self, wire: &mut W) -> Forwarded<W> {
        let mut tried = Vec::new();
        loop {
            let gone = wire.client_gone();
            let slot = match self
                .plan
                .take(self.instance, self.config, self.held, gone)
                .await
            {
                Taken::Slot(slot) => slot,
                Taken::None => break,
                Taken::Refused(Refusal::ClientGone) => return Forwarded::ClientGone,
                Taken::Refused(why) => {
                    if let Some(log) = self.log.as_mut() {
                        log.queued(Duration::ZERO, why.as_str());
                    }
                    return Forwarded::Failed(self.failed(Failure::Refused(why)));
                }
            };
            if let (Some(log), Some((waited, how))) = (self.log.as_mut(), slot.queued) {
                log.queued(waited, how.as_str());
            }
            tried.push(slot.backend.name.clone());
            match self.send(&slot.backend, wire).await {
                Exchange::Answered {
                    head,
                    lease,
                    sent,
                    progress,
                } => {
                    let answered = self.answered::<W>(slot, lease, sent, head, progress);
                    return Forwarded::Answered(Box::new(answered));
                }
                Exchange::NotSent { .. } => self.plan.passed_over(Spill::Down),
                Exchange::Failed(failure) => {
                    charge(&slot.backend, &failure, self.config);
                    return Forwarded::Failed(self.failed(failure));
                }
                Exchange::ClientGone => return Forwarded::ClientGone,
            }
        }
        Forwarded::Failed(self.failed(Failure::NoBackend { tried }))
    }

    /// Sends the request to `backend` over a pooled connection, or a new
    /// one: a pooled connection found closed before a byte went is followed
    /// by the next.
    async fn send<W: Wire>(&self, backend: &Arc<Backend>, wire: &mut W) -> Exchange<W> {
        loop {
            let to = Upstream {
                backend,
                pool: wire.pool(),
                claim: self.claim,
            };
            let lease = match connect::<W>(to, self.config, self.instance).await {
                Ok(lease) => lease,
                Err(Blame::Backend) => return Exchange::NotSent { fresh: true },
                Err(Blame::Local) => return Exchange::Failed(Failure::LocalResources),
            };
            match wire.exchange(backend, lease, self.config).await {
                Exchange::NotSent { fresh: false } => {}
                other => return other,
            }
        }
    }

    /// An answer's head came over `lease` to the request sent at `sent` in
    /// `slot`: counted (status, latency, passive health), noted (the log
    /// line), the decision committed, and the request made an [`InFlight`]
    /// for the wire format to finish.
    fn answered<W: Wire>(
        &mut self,
        slot: Slot,
        lease: Lease<W::Conn>,
        sent: Instant,
        head: W::Head,
        progress: Arc<Progress>,
    ) -> Answered<W> {
        let Slot {
            backend,
            active,
            first_byte,
            ..
        } = slot;
        let status = W::status(&head);
        account(&backend, status, sent, self.config);
        let how = self.plan.how();
        let mut log = self.log.take();
        if let Some(log) = &mut log {
            log.answered(Answer {
                backend: &backend,
                how: how.as_str(),
                status,
                progress: &progress,
            });
        }
        let committed = self.plan.commit(self.instance, &backend);
        let in_flight = InFlight {
            backend,
            _slot: active,
            sent,
            lease,
            tally: committed.tally(self.instance),
            reusable: reusable_after(self.with_body, status),
            stream_idle: self.config.http.stream_idle_timeout,
            log,
            awaiting: first_byte,
        };
        Answered {
            head,
            in_flight,
            progress,
        }
    }

    /// No backend answered: counted, and the backend it failed at noted in
    /// the log line.
    fn failed(&mut self, failure: Failure) -> Failure {
        if let (Some(log), Some(name)) = (self.log.as_mut(), failure.backend()) {
            log.tried(name, self.plan.targets());
        }
        (self.instance.stats).count_client_failure(failure.client_failure());
        failure
    }
}

/// Where a request's connection comes from.
struct Upstream<'u, C> {
    backend: &'u Arc<Backend>,
    pool: &'u Arc<Pool<C>>,
    claim: Claim,
}

/// A connection to `backend`: a pooled one the claim allows that is ready,
/// else a new one (counted like a TCP-path connect; a failure counts
/// against the backend unless magpie itself is out of resources).
async fn connect<W: Wire>(
    to: Upstream<'_, W::Conn>,
    config: &Config,
    instance: &Instance,
) -> Result<Lease<W::Conn>, Blame> {
    let Upstream {
        backend,
        pool,
        claim,
    } = to;
    let limits = Limits::of(&config.http);
    while let Some(mut lease) = pool.checkout(backend.addr, limits, claim) {
        if W::ready(&mut lease.conn).await {
            return Ok(lease);
        }
    }
    let started = Instant::now();
    let opened = match upstream::open(backend, config.connect.timeout).await {
        Ok(io) => W::start(io, backend).await,
        Err(e) => Err(e),
    };
    match opened {
        Ok(conn) => {
            let traffic = &backend.live.traffic;
            traffic.connect_time.observe(started.elapsed());
            traffic.count_connection();
            passive::succeeded(&**backend);
            Ok(Lease::fresh(conn, backend.addr, limits, pool, claim.client))
        }
        Err(e) => {
            let health = config.health.as_ref();
            Err(passive::connect_failed(
                &**backend,
                &e,
                health,
                &instance.stats,
            ))
        }
    }
}

/// Counts a failure at `backend` against it when it is the backend's: a
/// failed request (a timeout too, and with `health.passive_status` a failed
/// answer for passive health, as a `504` of its own would be), and a
/// warning.
fn charge(backend: &Backend, failure: &Failure, config: &Config) {
    if failure.source() != Source::Backend {
        return;
    }
    let traffic = &backend.live.traffic;
    traffic.count_request(CodeClass::Error);
    match failure {
        Failure::ResponseTimeout { after, .. } => {
            traffic.count_timeout(TimeoutKind::Response);
            warn!(backend = %backend.name, timeout = ?after, "backend sent no response head within http.response_timeout; the client gets 504");
            if let Some(health) = config.health.as_ref().filter(|h| h.passive_status) {
                passive::answer_failed(backend, 504, health);
            }
        }
        Failure::Switched { .. } => {
            warn!(backend = %backend.name, "backend answered 101 Switching Protocols unasked; the client gets 502")
        }
        Failure::AfterSend { error, .. } => {
            warn!(backend = %backend.name, %error, "backend failed after the request was sent")
        }
        _ => {}
    }
}

/// Counts an answer: its time to first byte and status class, and with
/// `health.passive_status` a 502/503/504 towards passive health (any other
/// answer ends the backend's failure streak).
pub(crate) fn account(backend: &Backend, status: u16, sent: Instant, config: &Config) {
    let traffic = &backend.live.traffic;
    traffic.time_to_first_byte.observe(sent.elapsed());
    traffic.count_request(CodeClass::of(status));
    match &config.health {
        Some(health) if health.passive_status && matches!(status, 502..=504) => {
            passive::answer_failed(backend, status, health);
        }
        _ => passive::succeeded(backend),
    }
}
