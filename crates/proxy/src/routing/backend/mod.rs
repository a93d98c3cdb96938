//! A backend: its identity (name, address, weight, zone) and its live state.
//!
//! Identity comes from the config and never changes within a snapshot. Live
//! state is atomics (and, for groups, a small lock) shared by the data paths
//! (which count and take slots), health (which marks up and down) and
//! metrics/admin (which read), in six named parts:
//!
//! | part | owns |
//! |---|---|
//! | [`load`] | connections or requests in flight (what bounded load counts), open upstream connections, requests awaiting their first byte of body |
//! | [`traffic`] | connections, bytes, requests by status, spills, resets, latency histograms |
//! | [`crate::routing::health::Health`] | up or down, the streaks that move it, transitions |
//! | [`crate::routing::health::EngineLoad`] | the inference engine's queue and KV cache, as last scraped |
//! | [`drain`] | when a removed backend's connections must close |
//! | [`groups`] | `key.group`: distinct groups served lately, placements by candidate rank |
//!
//! Live state lives behind its own `Arc`, so a reload can hand the same live
//! state to the next snapshot when a backend's name and address are
//! unchanged: its counters, health and open connections carry over.

pub mod drain;
pub mod groups;
pub mod load;
pub mod traffic;

use crate::net::tls_client::BackendTls;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

pub use traffic::{CodeClass, Discard, Side, Spill, TimeoutKind};

use self::drain::Drain;
use self::groups::Groups;
pub use self::load::Awaiting;
use self::load::Load;
use self::traffic::Traffic;
use crate::config::BackendConfig;
use crate::routing::health::{self, EngineLoad, Health};

#[derive(Debug)]
pub struct Backend {
    pub name: String,
    pub addr: SocketAddr,
    pub weight: u32,
    pub zone: Option<String>,
    /// Reached over TLS (`tls: true`, mode http).
    pub tls: Option<BackendTls>,
    /// Its own `max_inflight` (with `queue`), else the queue's.
    pub max_inflight: Option<u64>,
    pub live: Arc<Live>,
}

impl Backend {
    pub fn new(config: &BackendConfig, live: Arc<Live>) -> Self {
        Backend {
            name: config.name.clone(),
            addr: config.addr,
            weight: config.weight,
            zone: config.zone.clone(),
            tls: config.tls.clone(),
            max_inflight: config.max_inflight,
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
pub struct Live {
    pub load: Load,
    pub traffic: Traffic,
    pub health: Health,
    /// The engine's queue and KV cache as last scraped (`health.load`).
    pub engine: EngineLoad,
    pub drain: Drain,
    /// The groups it served (`key.group`).
    pub groups: Groups,
    /// Told whenever a slot is given back, so a request waiting for this
    /// backend can take it (`queue`); set once by the instance.
    pub waiters: OnceLock<Arc<dyn SlotFreed>>,
}

/// Whoever waits for a backend's slots: told each time one is given back.
pub trait SlotFreed: Send + Sync + std::fmt::Debug {
    fn slot_freed(&self, live: &Arc<Live>);
}

impl Live {
    /// Takes one active slot unconditionally.
    pub fn reserve(self: &Arc<Self>) -> ActiveGuard {
        self.load.take();
        ActiveGuard {
            live: Arc::clone(self),
        }
    }

    /// Takes one active slot if fewer than `cap` are taken. The check and the
    /// increment are one atomic step, so concurrent accepts never push a
    /// backend past its bounded-load cap.
    pub fn try_reserve(self: &Arc<Self>, cap: u64) -> Option<ActiveGuard> {
        self.load.try_take(cap).then(|| ActiveGuard {
            live: Arc::clone(self),
        })
    }

    /// A request of `kind` with `tokens` of prompt to prefill is on its way
    /// to the backend; it counts as awaiting its first byte of body (and
    /// its tokens as work to do) until the guard drops.
    pub fn await_first_byte(self: &Arc<Self>, kind: Awaiting, tokens: u64) -> AwaitingGuard {
        self.load.start_awaiting(kind, tokens);
        AwaitingGuard {
            live: Arc::clone(self),
            kind,
            tokens,
        }
    }

    /// An upstream connection opened; it is counted until the guard drops.
    pub fn open_upstream(self: &Arc<Self>) -> UpstreamGuard {
        self.load.open_upstream();
        UpstreamGuard {
            live: Arc::clone(self),
        }
    }
}

/// One active connection (or connection attempt, or request in flight) to a
/// backend; dropping it gives the slot back.
#[derive(Debug)]
pub struct ActiveGuard {
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
/// Its prefill done, its work is too: a request waiting for that backend's
/// work to fall (`queue.max_prefill_tokens`) is told.
#[derive(Debug)]
pub struct AwaitingGuard {
    live: Arc<Live>,
    kind: Awaiting,
    tokens: u64,
}

impl Drop for AwaitingGuard {
    fn drop(&mut self) {
        self.live.load.stop_awaiting(self.kind, self.tokens);
        if self.tokens > 0
            && let Some(waiters) = self.live.waiters.get()
        {
            waiters.slot_freed(&self.live);
        }
    }
}

/// One open upstream connection (`mode: http`); dropping it uncounts it.
#[derive(Debug)]
pub struct UpstreamGuard {
    live: Arc<Live>,
}

impl UpstreamGuard {
    /// The connection it counts was closed instead of pooled, for `why`.
    pub fn count_discard(&self, why: Discard) {
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
        let a = live.await_first_byte(Awaiting::Turn, 100);
        let b = live.await_first_byte(Awaiting::NewGroup, 20);
        let c = live.await_first_byte(Awaiting::Opening, 3);
        let counts = |l: &Live| {
            let load = &l.load;
            (
                load.awaiting(),
                load.awaiting_openings(),
                load.awaiting_cold(),
                load.prefill_tokens(),
            )
        };
        assert_eq!(counts(&live), (3, 2, 1, 123));
        drop(a);
        assert_eq!(counts(&live), (2, 2, 1, 23));
        drop(b);
        assert_eq!(counts(&live), (1, 1, 0, 3));
        drop(c);
        assert_eq!(counts(&live), (0, 0, 0, 0));
    }
}
