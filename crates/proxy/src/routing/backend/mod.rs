//! A backend: its identity (name, address, weight, zone) and its live state.
//!
//! Identity comes from the config and never changes within a snapshot. Live
//! state is atomics (and, for groups, a small lock) shared by the data paths
//! (which count and take slots), health (which marks up and down) and
//! metrics/admin (which read), in named parts:
//!
//! | part | owns |
//! |---|---|
//! | [`load`] | connections or requests in flight (what bounded load counts), open upstream connections, requests awaiting their first byte of body |
//! | [`traffic`] | connections, bytes, requests by status, spills, resets, latency histograms |
//! | [`crate::routing::health::Health`] | up or down, the streaks that move it, transitions |
//! | [`crate::routing::health::EngineLoad`] | the inference engine's queue and KV cache, as last scraped |
//! | [`drain`] | when a removed backend's connections must close |
//! | [`groups`] | `key.group`: distinct groups served lately, placements by candidate rank |
//! | [`rate`] | `queue`: the prefill rate learned from its answers (work over busy time) |
//! | [`recent`] | hashes served lately (groups, system heads): heads a cache likely holds |
//!
//! Live state lives behind its own `Arc`, so a reload can hand the same live
//! state to the next snapshot when a backend's name and address are
//! unchanged: its counters, health and open connections carry over.

pub(crate) mod drain;
pub(crate) mod groups;
pub(crate) mod load;
pub(crate) mod rate;
pub(crate) mod recent;
pub(crate) mod traffic;

use crate::net::tls_client::BackendTls;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

pub(crate) use traffic::{CodeClass, Discard, Side, Spill, TimeoutKind};

use self::drain::Drain;
use self::groups::Groups;
pub(crate) use self::load::Awaiting;
use self::load::Load;
use self::rate::PrefillRate;
use self::recent::Recent;
use self::traffic::Traffic;
use crate::config::BackendConfig;
use crate::routing::health::{self, EngineLoad, Health};
use crate::routing::keys::{GroupKey, SharedHead};

#[derive(Debug)]
pub struct Backend {
    pub name: String,
    pub addr: SocketAddr,
    pub weight: u32,
    pub zone: Option<String>,
    /// Reached over TLS (`tls: true`, mode http).
    pub(crate) tls: Option<BackendTls>,
    /// Its own `max_inflight` (with `queue`), else the queue's.
    pub(crate) max_inflight: Option<u64>,
    /// Which halves of a disaggregated request it takes.
    pub role: crate::config::Role,
    /// Its engine's KV bootstrap port (SGLang's protocol).
    pub(crate) bootstrap_port: Option<u16>,
    /// Its live state: load, traffic, health, drain.
    pub(crate) live: Arc<Live>,
}

impl Backend {
    pub(crate) fn new(config: &BackendConfig, live: Arc<Live>) -> Self {
        Backend {
            name: config.name.clone(),
            addr: config.addr,
            weight: config.weight,
            zone: config.zone.clone(),
            tls: config.tls.clone(),
            max_inflight: config.max_inflight,
            role: config.role,
            bootstrap_port: config.bootstrap_port,
            live,
        }
    }
}

impl health::Target for Backend {
    fn name(&self) -> &str {
        &self.name
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn health(&self) -> &Health {
        &self.live.health
    }

    fn engine(&self) -> &EngineLoad {
        &self.live.engine
    }

    fn tls(&self) -> Option<&BackendTls> {
        self.tls.as_ref()
    }
}

/// The live state of one backend.
#[derive(Debug, Default)]
pub(crate) struct Live {
    pub(crate) load: Load,
    pub(crate) traffic: Traffic,
    pub(crate) health: Health,
    /// The engine's queue and KV cache as last scraped (`health.load`).
    pub(crate) engine: EngineLoad,
    pub(crate) drain: Drain,
    /// The groups it served (`key.group`).
    pub(crate) groups: Groups,
    /// Its prefill rate, learned from its answers (`queue`).
    pub(crate) prefill_rate: PrefillRate,
    /// The system heads (model, instructions, tools) of the requests it
    /// answered (`queue`), whatever their group: what its cache may hold of
    /// another group's conversation.
    pub(crate) system_heads: Recent,
    /// Told whenever a slot is given back, so a request waiting for this
    /// backend can take it (`queue`); set once by the instance.
    pub(crate) waiters: OnceLock<Arc<dyn SlotFreed>>,
}

/// Whoever waits for a backend's slots: told each time one is given back.
pub(crate) trait SlotFreed: Send + Sync + std::fmt::Debug {
    fn slot_freed(&self, live: &Arc<Live>);
}

impl Live {
    /// A request of `group` was served here.
    pub(crate) fn served_group(&self, group: GroupKey) {
        self.groups.served(group);
    }

    /// Another magpie of the fleet served `head` here lately: it counts as
    /// this magpie's own serving does ([`Live::holds_head`],
    /// [`Live::holds_system_head`]).
    pub(crate) fn served_elsewhere(&self, head: SharedHead) {
        match head {
            SharedHead::Group(group) => self.groups.served(group),
            SharedHead::System(hash) => self.system_heads.served(hash),
        }
    }

    /// Whether its cache likely still holds `group`'s head: the group was
    /// served here lately ([`recent`]: a shared head is the last of its
    /// chain a cache lets go, however much was computed since).
    pub(crate) fn holds_head(&self, group: GroupKey) -> bool {
        self.groups.holds(group)
    }

    /// Whether its cache likely still holds the system head hashed `hash`,
    /// as [`Live::holds_head`] tells a group's.
    pub(crate) fn holds_system_head(&self, hash: u64) -> bool {
        self.system_heads.holds(hash)
    }

    /// Whether its cache has likely pushed out what was last used when it
    /// had computed `then` tokens: its engine said the size of its cache,
    /// and at least [`Live::kv_room`] tokens were computed here since
    /// ([`recent::pushed_out`]).
    pub(crate) fn pushed_out(&self, then: u64) -> bool {
        recent::pushed_out(then, self.load.computed(), self.kv_room())
    }

    /// The tokens its cache keeps of what no running request holds
    /// ([`EngineLoad::kv_room`]).
    fn kv_room(&self) -> Option<u64> {
        self.engine.kv_room().map(|c| c as u64)
    }

    /// Takes one active slot unconditionally.
    pub(crate) fn reserve(self: &Arc<Self>) -> ActiveGuard {
        self.load.take();
        ActiveGuard {
            live: Arc::clone(self),
        }
    }

    /// Takes one active slot if fewer than `cap` are taken. The check and the
    /// increment are one atomic step, so concurrent accepts never push a
    /// backend past its bounded-load cap.
    pub(crate) fn try_reserve(self: &Arc<Self>, cap: u64) -> Option<ActiveGuard> {
        self.load.try_take(cap).then(|| ActiveGuard {
            live: Arc::clone(self),
        })
    }

    /// A request of `kind` is on its way to the backend; it counts as
    /// awaiting its first byte of body until the guard drops.
    pub(crate) fn await_first_byte(self: &Arc<Self>, kind: Awaiting) -> AwaitingGuard {
        self.load.start_awaiting(kind);
        AwaitingGuard {
            live: Arc::clone(self),
            kind,
        }
    }

    /// Takes one slot under `cap` with `tokens` of prefill work, if the
    /// backend holds less than `max_work` (any work fits a backend that
    /// holds none; for work of a `class`, its class and the higher ones').
    /// The work is held until its guard drops, at the answer's first byte;
    /// the slot until the request ends.
    pub(crate) fn try_reserve_work(
        self: &Arc<Self>,
        cap: u64,
        tokens: u64,
        max_work: Option<u64>,
        class: Option<usize>,
    ) -> Option<(ActiveGuard, WorkGuard)> {
        if !self.load.try_add_work(tokens, max_work, class) {
            return None;
        }
        let Some(slot) = self.try_reserve(cap) else {
            // Taken back without a word: nobody could have used it.
            self.load.remove_work(tokens, class);
            return None;
        };
        let work = WorkGuard {
            live: Arc::clone(self),
            tokens,
            class,
            sent: tokio::time::Instant::now(),
            fleet_ahead: self.load.fleet_tokens(),
            system_head: None,
        };
        Some((slot, work))
    }

    /// An upstream connection opened; it is counted until the guard drops.
    pub(crate) fn open_upstream(self: &Arc<Self>) -> UpstreamGuard {
        self.load.open_upstream();
        UpstreamGuard {
            live: Arc::clone(self),
        }
    }
}

/// One active connection (or connection attempt, or request in flight) to a
/// backend; dropping it gives the slot back.
#[derive(Debug)]
pub(crate) struct ActiveGuard {
    live: Arc<Live>,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.live.load.give_back();
        if let Some(waiters) = self.live.waiters.get() {
            waiters.slot_freed(&self.live);
        }
    }
}

/// One request awaiting the first byte of its answer's body (`mode: http`);
/// dropping it (at that byte, or when the request ends first) uncounts it.
#[derive(Debug)]
pub(crate) struct AwaitingGuard {
    live: Arc<Live>,
    kind: Awaiting,
}

impl Drop for AwaitingGuard {
    fn drop(&mut self) {
        self.live.load.stop_awaiting(self.kind);
    }
}

/// A request's prefill work at a backend (`queue`), held from its
/// admission to the queue to its answer's first byte (or its end, if no byte comes);
/// dropping it takes the work off and tells a request waiting for that
/// backend's work to fall (`queue.max_prefill_tokens`).
#[derive(Debug)]
pub(crate) struct WorkGuard {
    live: Arc<Live>,
    tokens: u64,
    /// The class it counts in, if counted by class.
    class: Option<usize>,
    /// When the request was admitted (and so sent).
    sent: tokio::time::Instant,
    /// The other magpies' work there then (with a shared store).
    fleet_ahead: u64,
    /// The hash of its system head, which its prefill leaves in the cache.
    system_head: Option<u64>,
}

impl WorkGuard {
    /// The answer's first byte came: the backend's prefill rate learns
    /// from it ([`rate`]), its tokens count as computed, its system head as
    /// served, and the work is taken off.
    pub(crate) fn answered(self) {
        let now = tokio::time::Instant::now();
        let live = &self.live;
        (live.prefill_rate).answered(self.tokens, self.fleet_ahead, self.sent, now);
        live.load.count_computed(self.tokens);
        if let Some(hash) = self.system_head {
            live.system_heads.served(hash);
        }
    }

    /// Its request's system head is hashed `hash` (recorded when answered).
    pub(crate) fn with_system_head(mut self, hash: Option<u64>) -> WorkGuard {
        self.system_head = hash;
        self
    }

    /// Adds `tokens` of `class` to the work it holds: room taken before
    /// its request was known, holding none yet, takes that request's class.
    pub(crate) fn grow(&mut self, tokens: u64, class: Option<usize>) {
        if self.tokens == 0 {
            self.class = class;
        }
        self.live.load.add_work(tokens, self.class);
        self.tokens = self.tokens.saturating_add(tokens);
    }
}

impl Drop for WorkGuard {
    fn drop(&mut self) {
        if self.tokens == 0 {
            return;
        }
        self.live.load.remove_work(self.tokens, self.class);
        if let Some(waiters) = self.live.waiters.get() {
            waiters.slot_freed(&self.live);
        }
    }
}

/// One open upstream connection (`mode: http`); dropping it uncounts it.
#[derive(Debug)]
pub(crate) struct UpstreamGuard {
    live: Arc<Live>,
}

impl UpstreamGuard {
    /// The connection it counts was closed instead of pooled, for `why`.
    pub(crate) fn count_discard(&self, why: Discard) {
        self.live.traffic.count_discard(why);
    }
}

impl Drop for UpstreamGuard {
    fn drop(&mut self) {
        self.live.load.close_upstream();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_respect_the_cap() {
        let live = Arc::new(Live::default());
        let a = live.try_reserve(2).unwrap();
        let _b = live.try_reserve(2).unwrap();
        assert!(live.try_reserve(2).is_none());
        assert_eq!(live.load.active(), 2);
        drop(a);
        assert_eq!(live.load.active(), 1);
        let _c = live.reserve();
        assert_eq!(live.load.active(), 2);
        let upstream = live.open_upstream();
        assert_eq!(live.load.upstream_connections(), 1);
        drop(upstream);
        assert_eq!(live.load.upstream_connections(), 0);
    }

    #[test]
    fn awaiting_counts_until_the_guard_drops() {
        let live = Arc::new(Live::default());
        let a = live.await_first_byte(Awaiting::Turn);
        let b = live.await_first_byte(Awaiting::NewGroup);
        let c = live.await_first_byte(Awaiting::Opening);
        let counts = |l: &Live| {
            let load = &l.load;
            (
                load.awaiting(),
                load.awaiting_openings(),
                load.awaiting_cold(),
            )
        };
        assert_eq!(counts(&live), (3, 2, 1));
        drop(a);
        assert_eq!(counts(&live), (2, 2, 1));
        drop(b);
        assert_eq!(counts(&live), (1, 1, 0));
        drop(c);
        assert_eq!(counts(&live), (0, 0, 0));
    }

    #[test]
    fn work_is_taken_with_a_slot_under_its_maximum() {
        let live = Arc::new(Live::default());
        // None held: any amount fits.
        let (a, big) = live.try_reserve_work(4, 5000, Some(1000), None).unwrap();
        assert_eq!(live.load.prefill_tokens(), 5000);
        assert!(live.try_reserve_work(4, 1, Some(1000), None).is_none());
        assert_eq!(live.load.active(), 1, "a refused reservation takes no slot");
        drop(big);
        let (_b, small) = live.try_reserve_work(4, 300, Some(1000), None).unwrap();
        let (_c, _more) = live.try_reserve_work(4, 800, Some(1000), None).unwrap();
        assert_eq!(live.load.prefill_tokens(), 1100);
        drop(small);
        drop(a);
        // At its slot cap, no work is added.
        let _d = live.try_reserve_work(3, 10, None, None).unwrap();
        assert!(live.try_reserve_work(3, 10, None, None).is_none());
        assert_eq!(live.load.prefill_tokens(), 810);
    }
}
