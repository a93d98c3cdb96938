//! One running magpie's state: the published snapshot and what lives beside
//! it. The data paths, accept, reload, health, metrics and admin all hold
//! one `Arc<Instance>`; it is built once at start and lives until exit.
//!
//! | field | who writes | who reads |
//! |---|---|---|
//! | `snapshot` | reload ([`Instance::publish`]) | every connection and request (`load()` once) |
//! | `stats` | the data paths, intake, health | metrics, admin |
//! | retired backends | publish | metrics (draining backends), drain |
//! | `limit` | publish (resized) | accept |
//! | `discovery` | discovery's resolve loop | reload, metrics |
//! | sessions | publish (kept or replaced) | mode http's routing |
//! | `key_memory` | the data paths | routing, admin `/route`, metrics |
//! | `access_log` | publish (settings), the data paths (lines) | its writer task |
//! | `queue` | the data paths (wait, admit), publish (rebind) | metrics, admin |

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use tokio::sync::{Semaphore, watch};

use crate::config::Config;
use crate::routing::backend::{Backend, Live, SlotFreed};
use crate::routing::discovery::Discovery;
use crate::routing::health;
use crate::routing::key_memory::{self, KeyMemory};
use crate::routing::queue::Queue;
use crate::routing::sessions::{Member, Sessions};
use crate::routing::snapshot::Snapshot;
use crate::telemetry::access_log::AccessLog;
use crate::telemetry::stats::Stats;

/// The one published snapshot and what lives beside it: global counters, the
/// backends that left the pool but still have connections (draining), and the
/// connection limit. Instance by accept, reload, health, metrics and admin.
#[derive(Debug)]
pub(crate) struct Instance {
    pub(crate) snapshot: ArcSwap<Snapshot>,
    pub(crate) stats: Stats,
    /// Removed backends, kept while they have connections open.
    retired: Mutex<Vec<Arc<Backend>>>,
    /// `max_connections` permits, resized on reload.
    pub(crate) limit: Arc<Semaphore>,
    /// The published version, for whoever waits for a reload to land.
    version: watch::Sender<u64>,
    /// DNS discovery's resolvers and last good answers.
    pub(crate) discovery: Arc<Discovery>,
    /// Session pins (`sessions`), kept across reloads that keep their settings.
    sessions: ArcSwapOption<Sessions>,
    /// What routing last did with each key (spills, misses, `/route`).
    pub(crate) key_memory: KeyMemory,
    /// Set at the first SIGTERM: `/readyz` answers 503 from then on.
    draining: std::sync::atomic::AtomicBool,
    /// `access_log`: its settings, queue and counters.
    pub(crate) access_log: AccessLog,
    /// `queue`: the requests (or connections) waiting for a backend's room.
    pub(crate) queue: Arc<Queue>,
    /// This magpie in a fleet sharing a store, the same across reloads.
    fleet: Member,
}

impl Instance {
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn new(snapshot: Snapshot) -> Self {
        Instance::with_discovery(snapshot, Arc::default())
    }

    /// Instance state whose first snapshot was built with `discovery`'s
    /// answers (so they are the last good ones).
    pub(crate) fn with_discovery(snapshot: Snapshot, discovery: Arc<Discovery>) -> Self {
        let limit = Arc::new(Semaphore::new(snapshot.config.max_connections));
        let (version, _) = watch::channel(snapshot.version);
        let fleet = Member::default();
        let sessions = ArcSwapOption::from(sessions_for(&snapshot.config, &fleet));
        let (max, ttl) = recent_size(&snapshot.config);
        let key_memory = KeyMemory::new(max, ttl);
        let access_log = AccessLog::new(snapshot.config.access_log.as_ref());
        let queue = Arc::new(Queue::default());
        wait_on(&snapshot, &queue);
        Instance {
            snapshot: ArcSwap::from_pointee(snapshot),
            stats: Stats::default(),
            retired: Mutex::new(Vec::new()),
            discovery,
            limit,
            version,
            sessions,
            key_memory,
            draining: std::sync::atomic::AtomicBool::new(false),
            access_log,
            queue,
            fleet,
        }
    }

    /// The process is shutting down: no longer ready for new traffic.
    pub(crate) fn start_draining(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The session pins (and their store), when `sessions` is configured.
    pub(crate) fn sessions(&self) -> Option<Arc<Sessions>> {
        self.sessions.load_full()
    }

    /// Follows the published version: `changed()` resolves on every publish.
    pub(crate) fn versions(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Live state to carry into the next build: the current backends' and the
    /// draining ones' (a backend put back before it drained keeps its state).
    pub(crate) fn carry(&self) -> HashMap<(String, SocketAddr), Arc<Live>> {
        let mut carry = self.snapshot.load().live_states();
        for b in self.retired() {
            carry
                .entry((b.name.clone(), b.addr))
                .or_insert_with(|| Arc::clone(&b.live));
        }
        carry
    }

    /// Publishes `next` atomically. Backends of the old snapshot whose identity
    /// (name and address) is not in `next` are retired and returned, so the
    /// caller can apply `drain_timeout` to them.
    pub(crate) fn publish(&self, next: Snapshot) -> Vec<Arc<Backend>> {
        let old_limit = self.snapshot.load().config.max_connections;
        let new_limit = next.config.max_connections;
        if next.config.sessions != self.snapshot.load().config.sessions {
            self.sessions.store(sessions_for(&next.config, &self.fleet));
            let (max, ttl) = recent_size(&next.config);
            self.key_memory.configure(max, ttl);
        }
        if next.config.access_log != self.snapshot.load().config.access_log {
            self.access_log.configure(next.config.access_log.as_ref());
        }
        wait_on(&next, &self.queue);
        let next = Arc::new(next);
        let old = self.snapshot.swap(Arc::clone(&next));
        // Waiting requests leave the queue by the new table.
        self.queue.rebind(&next);
        self.resize_limit(old_limit, new_limit);
        let stays = |b: &Backend| next.every_backend().any(|n| Arc::ptr_eq(&n.live, &b.live));
        let removed: Vec<Arc<Backend>> =
            old.every_backend().filter(|b| !stays(b)).cloned().collect();
        let mut retired = lock(&self.retired);
        // A backend that came back is no longer retired, and its drain is off.
        retired.retain(|r| {
            let back = stays(r);
            if back {
                r.live.drain.put_back();
            }
            !back
        });
        for b in &removed {
            b.live.drain.removed();
        }
        retired.extend(removed.iter().cloned());
        drop(retired);
        self.version.send_replace(next.version);
        removed
    }

    /// Removed backends that still have open connections (the drained ones
    /// are forgotten here, which is what makes their metric series go away).
    pub(crate) fn retired(&self) -> Vec<Arc<Backend>> {
        let mut retired = lock(&self.retired);
        retired.retain(|b| b.live.load.active() > 0);
        retired.clone()
    }

    fn resize_limit(&self, old: usize, new: usize) {
        if new > old {
            self.limit.add_permits(new - old);
        } else if new < old {
            // Permits in use cannot be taken back now: wait for them, then
            // forget them, so the limit shrinks as connections close.
            let limit = Arc::clone(&self.limit);
            let excess = u32::try_from(old - new).unwrap_or(u32::MAX);
            tokio::spawn(async move {
                if let Ok(permits) = limit.acquire_many(excess).await {
                    permits.forget();
                }
            });
        }
    }
}

/// Tells `queue` whenever a backend of `snapshot` gives a slot back
/// (a backend kept from an earlier snapshot tells it already).
fn wait_on(snapshot: &Snapshot, queue: &Arc<Queue>) {
    for b in snapshot.every_backend() {
        b.live.waiters.get_or_init(|| {
            let hook: Arc<dyn SlotFreed> = Arc::clone(queue) as Arc<dyn SlotFreed>;
            hook
        });
    }
}

/// Health checks probe the backends of the snapshot in force.
impl health::Targets for Instance {
    type Target = Backend;

    fn round(&self) -> health::Round<Backend> {
        let snapshot = self.snapshot.load();
        health::Round {
            health: snapshot.config.health.clone(),
            targets: snapshot.every_backend().cloned().collect(),
        }
    }

    fn stats(&self) -> &Stats {
        &self.stats
    }
}

/// Fresh session pins for `config`'s `sessions`, if any.
fn sessions_for(config: &Config, fleet: &Member) -> Option<Arc<Sessions>> {
    (config.sessions.as_ref()).map(|s| Arc::new(Sessions::new(s, fleet.clone())))
}

/// How many keys [`KeyMemory`] remembers and how long a spill lasts: as
/// `sessions` says, else the built-in bounds.
fn recent_size(config: &Config) -> (usize, Duration) {
    config
        .sessions
        .as_ref()
        .map_or((key_memory::DEFAULT_MAX, key_memory::SPILL_TTL), |s| {
            (s.max, s.ttl)
        })
}

/// A poisoned lock only means another thread panicked while holding it; the
/// list itself is still valid.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(text: &str) -> Arc<Config> {
        Arc::new(Config::parse(Path::new("t.yaml"), text).unwrap())
    }

    #[tokio::test]
    async fn publish_retires_removed_backends_until_drained() {
        let two = "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8002}\n";
        let one = "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n";
        let instance = Instance::new(Snapshot::build(config(two), 1, &HashMap::new()).unwrap());
        let mut versions = instance.versions();
        let open = instance
            .snapshot
            .load()
            .backend("b")
            .unwrap()
            .live
            .reserve();
        let next = Snapshot::build(config(one), 2, &instance.carry()).unwrap();
        let removed = instance.publish(next);
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].name, "b");
        versions.changed().await.unwrap();
        assert_eq!(*versions.borrow(), 2);
        assert_eq!(instance.retired().len(), 1);
        drop(open);
        assert!(instance.retired().is_empty());
        // Putting it back before it drained would have reused its live state.
        let back = Snapshot::build(config(two), 3, &instance.carry()).unwrap();
        assert_eq!(back.backend("a").unwrap().live.traffic.connections(), 0);
        assert!(Arc::ptr_eq(
            &back.backend("a").unwrap().live,
            &instance.snapshot.load().backend("a").unwrap().live
        ));
    }
}
