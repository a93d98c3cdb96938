//! The end-to-end tests' handle on a running magpie (the `testing` feature,
//! which only the `magpie` package's tests and this crate's benchmarks turn
//! on): what no metric, admin route or signal does. Every count a test
//! checks is read through `/metrics`, rendered in process
//! ([`Probe::metrics`]), as an operator reads it; what is here forces a
//! backend's health, reads the published snapshot and waits for the next,
//! flushes the access log, reloads a file in process and asks the routing
//! decision where a key goes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use crate::app::Running;
use crate::config::Config;
use crate::ops::metrics;
use crate::ops::reload::{self, Reloader};
use crate::routing::backend::Backend;
use crate::routing::decision::{self, Request};
use crate::routing::instance::Instance;
use crate::routing::keys::{Keys, SessionKey};
use crate::routing::route::Route;
use crate::routing::snapshot::{Snapshot, SnapshotError};

/// A running magpie, seen from a test.
#[derive(Clone)]
pub struct Probe {
    instance: Arc<Instance>,
}

impl Running {
    /// This magpie, seen from a test.
    pub fn probe(&self) -> Probe {
        Probe {
            instance: Arc::clone(&self.instance),
        }
    }
}

impl Probe {
    /// The routing state of a magpie that would start with `config`, serving
    /// nothing: its snapshot, sessions (a shared store connecting in the
    /// background) and key memory.
    pub fn of(config: Config) -> Result<Probe, SnapshotError> {
        let snapshot = Snapshot::of(Arc::new(config))?;
        Ok(Probe {
            instance: Arc::new(Instance::new(snapshot)),
        })
    }

    /// `/metrics`, as the admin endpoint serves it.
    pub fn metrics(&self) -> String {
        metrics::render(&metrics::registry(Arc::clone(&self.instance)))
    }

    /// The published snapshot's version.
    pub fn version(&self) -> u64 {
        self.instance.snapshot.load().version
    }

    /// Follows the published version: `changed()` resolves on every publish.
    pub fn versions(&self) -> watch::Receiver<u64> {
        self.instance.versions()
    }

    /// The published snapshot's fingerprint.
    pub fn fingerprint(&self) -> String {
        self.instance.snapshot.load().fingerprint.clone()
    }

    /// Where it listens, as the published config says.
    pub fn listen(&self) -> Vec<SocketAddr> {
        self.instance.snapshot.load().config.listen.clone()
    }

    /// The published backends, in name order.
    pub fn backends(&self) -> Vec<BackendProbe> {
        let snapshot = self.instance.snapshot.load();
        snapshot
            .backends
            .iter()
            .cloned()
            .map(BackendProbe)
            .collect()
    }

    /// The published backend named `name`.
    pub fn backend(&self, name: &str) -> Option<BackendProbe> {
        let snapshot = self.instance.snapshot.load();
        snapshot.backend(name).cloned().map(BackendProbe)
    }

    /// The backends for `key`, primary first, by name.
    pub fn candidates(&self, key: u64) -> Vec<String> {
        let snapshot = self.instance.snapshot.load();
        snapshot.candidates(key).map(|b| b.name.clone()).collect()
    }

    /// Backends that left the pool and still have connections open.
    pub fn retired(&self) -> usize {
        self.instance.retired().len()
    }

    /// Requests (or connections) waiting in the queue now.
    pub fn queued(&self) -> usize {
        self.instance.queue.len()
    }

    /// Waits until every access-log line recorded so far is written.
    pub async fn flush_access_log(&self) {
        self.instance.access_log.flush().await;
    }

    /// Reopens the access log's file, as `SIGUSR1` does.
    pub fn reopen_access_log(&self) {
        self.instance.access_log.reopen();
    }

    /// The backend traffic for `key` would go to first now, counting
    /// nothing (what admin `/route` answers).
    pub fn route(&self, key: u64) -> Option<String> {
        let snapshot = self.instance.snapshot.load();
        let route = Route::preview(&snapshot, key);
        route.first().map(|b| b.name.clone())
    }

    /// Whether its shared session store is connected (`store: redis`).
    pub fn store_connected(&self) -> bool {
        let store = self.instance.sessions().and_then(|s| s.store.clone());
        store.is_some_and(|s| s.is_connected())
    }

    /// A reloader of `path`, the file its config came from, as `SIGHUP`
    /// and the file watch run it.
    pub fn reloader(&self, path: PathBuf) -> Reload {
        Reload(Reloader::new(path, Arc::clone(&self.instance)))
    }

    /// Where a request keyed by the session key `key` goes now (the routing
    /// decision's first target), as a request that got there: its pin
    /// bound or used, its key memory written.
    pub async fn decide(&self, key: u64) -> Option<String> {
        let snapshot = self.instance.snapshot.load_full();
        let keys = Keys::single(SessionKey::new(key));
        let plan = decision::plan(&self.instance, &snapshot, Request::new(keys)).await;
        let first = plan.targets().first()?;
        plan.commit(&self.instance, first);
        Some(first.name.clone())
    }
}

/// One backend, seen from a test.
#[derive(Clone)]
pub struct BackendProbe(Arc<Backend>);

impl BackendProbe {
    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn addr(&self) -> SocketAddr {
        self.0.addr
    }

    pub fn weight(&self) -> u32 {
        self.0.weight
    }

    /// Whether health has it up.
    pub fn is_up(&self) -> bool {
        self.0.live.health.is_up()
    }

    /// Marks it up or down, as health checks would.
    pub fn set_up(&self, up: bool) {
        self.0.live.health.set_up(up);
    }

    /// Connections (mode http: requests; mode udp: flows) it carries now.
    pub fn active(&self) -> u64 {
        self.0.live.load.active()
    }

    /// Requests sent to it not yet answered with a byte of body.
    pub fn awaiting(&self) -> u64 {
        self.0.live.load.awaiting()
    }

    /// Of those, the requests that opened a conversation.
    pub fn awaiting_openings(&self) -> u64 {
        self.0.live.load.awaiting_openings()
    }

    /// Whether `other` carries the same live state (counters, health): the
    /// same backend kept across a reload.
    pub fn same_state(&self, other: &BackendProbe) -> bool {
        Arc::ptr_eq(&self.0.live, &other.0.live)
    }
}

/// A reloader, as `SIGHUP` runs it.
pub struct Reload(Reloader);

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A new snapshot is published.
    Applied { version: u64, removed: Vec<String> },
    /// The content is the one already seen; nothing was rebuilt.
    Unchanged,
}

impl Reload {
    /// Reloads the file (`force`: even if its content is unchanged); the
    /// error as the log says it.
    pub async fn reload(&mut self, force: bool) -> Result<Outcome, String> {
        match self.0.reload(force).await {
            Ok(reload::Outcome::Applied { version, removed }) => {
                Ok(Outcome::Applied { version, removed })
            }
            Ok(reload::Outcome::Unchanged) => Ok(Outcome::Unchanged),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// One metric family as `/metrics` declares it.
#[derive(Debug, Clone)]
pub struct Family {
    pub name: &'static str,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

/// Every family magpie exports, as declared.
pub fn metric_families() -> Vec<Family> {
    use prometheus::proto::MetricType;
    metrics::families::families()
        .map(|f| Family {
            name: f.name,
            kind: match f.kind {
                MetricType::COUNTER => "counter",
                MetricType::GAUGE => "gauge",
                _ => "histogram",
            },
            labels: f.labels,
            help: f.help,
        })
        .collect()
}

/// The most file descriptors mode tcp's splice pipes hold at once (two per
/// pipe, in use and pooled).
pub const SPLICE_PIPE_FDS: u64 =
    2 * (crate::tcp::pipe::MAX_IN_USE + crate::tcp::pipe::POOL_MAX) as u64;
