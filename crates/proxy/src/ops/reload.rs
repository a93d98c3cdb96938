//! Hot reload: SIGHUP, file changes, or a polling interval → parse → build →
//! publish; or keep the running snapshot and say why.
//!
//! The file's *directory* is watched, not the file (and so are the
//! directories of the TLS certificate and key files it names at start; their
//! content counts as the config's, so a renewed certificate reloads): an editor that writes a
//! temporary file and renames it over the original, and a Kubernetes ConfigMap
//! that swaps its `..data` symlink, both replace the inode a file watch would
//! hold. Events are debounced, and a hash of the file's content decides
//! whether anything changed, so a `touch` does not rebuild (SIGHUP always
//! does). Parsing, validation (which resolves host names) and the table build
//! run on a blocking thread, away from the accept path.
//!
//! A failed reload changes nothing: the old snapshot keeps routing, the error
//! (with its line and column) is logged, and `magpie_reloads_total{result="error"}`
//! counts it. Settings that need a restart (`listen`, `admin`) are kept as they
//! are, with a warning; everything else applies to new connections.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::{Config, ConfigErrors, tls};
use crate::routing::backend::Backend;
use crate::routing::instance::Instance;
use crate::routing::snapshot::{Snapshot, SnapshotError};
use crate::telemetry::supervise::{self, Task};

/// Quiet time after a file event before reloading: editors write in bursts.
const DEBOUNCE: Duration = Duration::from_millis(150);

#[derive(Debug, thiserror::Error)]
pub(crate) enum ReloadError {
    #[error("{0}")]
    Config(ConfigErrors),
    #[error("{0}")]
    Build(#[from] SnapshotError),
    #[error("reload task was interrupted")]
    Interrupted,
    #[error(transparent)]
    Discovery(#[from] crate::routing::discovery::DiscoveryError),
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A new snapshot is published.
    Applied { version: u64, removed: Vec<String> },
    /// The content is the one already seen; nothing was rebuilt.
    Unchanged,
}

/// Reloads one config file into `shared`.
pub(crate) struct Reloader {
    path: PathBuf,
    instance: Arc<Instance>,
    /// Hash of the content last tried (applied or not): the same bytes are not
    /// tried again unless forced.
    last_content: Option<u64>,
}

impl Reloader {
    /// A reloader for `path`, whose content the running snapshot was built
    /// from (so only a change of content reloads).
    pub(crate) fn new(path: PathBuf, instance: Arc<Instance>) -> Self {
        let last_content = Some(instance.snapshot.load().config.content_hash);
        Reloader {
            path,
            instance,
            last_content,
        }
    }

    /// Reloads if the content changed (or always, with `force`); logs and
    /// counts the result either way.
    pub(crate) async fn reload(&mut self, force: bool) -> Result<Outcome, ReloadError> {
        let result = self.try_reload(force).await;
        match &result {
            Ok(outcome @ Outcome::Applied { .. }) => {
                self.instance.stats.count_reload(true);
                self.log_applied(outcome, "reloaded");
            }
            Ok(Outcome::Unchanged) => {}
            Err(e) => {
                self.instance.stats.count_reload(false);
                error!("reload failed; the running table stays:\n{e}");
            }
        }
        result
    }

    async fn try_reload(&mut self, force: bool) -> Result<Outcome, ReloadError> {
        let path = self.path.clone();
        let text = tokio::task::spawn_blocking(move || crate::config::file::read(&path))
            .await
            .map_err(|_| ReloadError::Interrupted)?
            .map_err(|e| ReloadError::Config(ConfigErrors::of_file(&self.path, &e)))?;
        let current = self.instance.snapshot.load_full();
        let running = Arc::clone(&current.config);
        let (content, text) = tokio::task::spawn_blocking(move || {
            // The certificate files the running config names are part of
            // its content: a renewed certificate reloads like an edit.
            let certificates = running
                .certificates()
                .map(|c| tls::files_hash(&c.cert_file, &c.key_file));
            (tls::content_hash(&text, certificates), text)
        })
        .await
        .map_err(|_| ReloadError::Interrupted)?;
        if !force && self.last_content == Some(content) {
            return Ok(Outcome::Unchanged);
        }
        self.last_content = Some(content);

        let path = self.path.clone();
        let running = Arc::clone(&current.config);
        let config = tokio::task::spawn_blocking(move || -> Result<Config, ReloadError> {
            let mut config = Config::parse(&path, &text).map_err(ReloadError::Config)?;
            keep_restart_settings(&mut config, &running);
            Ok(config)
        })
        .await
        .map_err(|_| ReloadError::Interrupted)??;
        let config = self.instance.discovery.expand(config).await?;
        self.publish(config, current.version + 1).await
    }

    /// Resolves the running config's `dns`/`srv` entries again and publishes
    /// the result if the backends changed. Logged when it applies.
    pub(crate) async fn rediscover(&mut self) -> Result<Outcome, ReloadError> {
        let current = self.instance.snapshot.load_full();
        if current.config.discovery.is_none() {
            return Ok(Outcome::Unchanged);
        }
        let config = self
            .instance
            .discovery
            .expand((*current.config).clone())
            .await?;
        let identity = |c: &Config| -> Vec<(String, std::net::SocketAddr, u32)> {
            let mut v: Vec<_> = c
                .backends
                .iter()
                .map(|b| (b.name.clone(), b.addr, b.weight))
                .collect();
            v.sort();
            v
        };
        if identity(&config) == identity(&current.config) {
            return Ok(Outcome::Unchanged);
        }
        let outcome = self.publish(config, current.version + 1).await?;
        self.log_applied(&outcome, "backends changed in DNS; published");
        Ok(outcome)
    }

    /// One line for a published snapshot.
    fn log_applied(&self, outcome: &Outcome, what: &str) {
        if let Outcome::Applied { version, removed } = outcome {
            let snapshot = self.instance.snapshot.load();
            info!(
                version,
                fingerprint = %snapshot.fingerprint,
                backends = snapshot.every_backend().count(),
                removed = ?removed,
                build_ms = snapshot.build_time.as_secs_f64() * 1000.0,
                "{what}"
            );
        }
    }

    /// Builds a snapshot of `config` on a blocking thread and publishes it;
    /// removed backends drain.
    async fn publish(&self, config: Config, version: u64) -> Result<Outcome, ReloadError> {
        let carry = self.instance.carry();
        let built =
            tokio::task::spawn_blocking(move || Snapshot::build(Arc::new(config), version, &carry))
                .await
                .map_err(|_| ReloadError::Interrupted)??;
        let drain_timeout = built.config.drain_timeout;
        let removed = self.instance.publish(built);
        for backend in &removed {
            schedule_drain(backend, drain_timeout);
        }
        Ok(Outcome::Applied {
            version,
            removed: removed.iter().map(|b| b.name.clone()).collect(),
        })
    }
}

/// `listen` and `admin` sockets are bound once, and `mode` decides how they
/// are served; a change of any needs a restart.
fn keep_restart_settings(next: &mut Config, running: &Config) {
    if next.mode != running.mode {
        warn!(
            running = running.mode.as_str(),
            file = next.mode.as_str(),
            "mode changed: restart magpie to apply it; keeping the running mode"
        );
        next.mode = running.mode;
    }
    if next.listen != running.listen {
        warn!(running = ?running.listen, file = ?next.listen, "listen changed: restart magpie to apply it; keeping the running listeners");
        next.listen = running.listen.clone();
        next.tls = running.tls.clone();
    }
    let terminates = |c: &Config| c.tls.iter().map(Option::is_some).collect::<Vec<_>>();
    if terminates(next) != terminates(running) {
        warn!(
            "which listeners terminate TLS changed: restart magpie to apply it; keeping the running listeners and their certificates"
        );
        next.tls = running.tls.clone();
    }
    if next.admin != running.admin {
        warn!(running = ?running.admin, file = ?next.admin, "admin changed: restart magpie to apply it; keeping the running admin address");
        next.admin = running.admin;
    }
}

/// Connections to a removed backend drain on their own; with a
/// `drain_timeout`, whatever is still open then is closed.
fn schedule_drain(backend: &Arc<Backend>, drain_timeout: Option<Duration>) {
    let open = backend.live.load.active();
    info!(backend = %backend.name, open, "backend removed; its connections drain");
    if let Some(timeout) = drain_timeout {
        let backend = Arc::clone(backend);
        let removal = backend.live.drain.removals();
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            let open = backend.live.load.active();
            if backend.live.drain.timer_fired(removal) && open > 0 {
                warn!(backend = %backend.name, open, "drain_timeout passed; closing its connections");
            }
        });
    }
}

/// Starts reloading `path` until `shutdown`: on SIGHUP (forced), on changes in
/// the file's directory (if `reload.watch`), and every `reload.poll_interval`
/// (if set); and resolves `dns`/`srv` backends again every
/// `discovery.interval`. The signal handler and the watch are in place when
/// this returns, so no change made after it is missed. Should the loop ever
/// panic, it is set up afresh and started again.
pub(crate) fn spawn(path: PathBuf, instance: Arc<Instance>, shutdown: CancellationToken) {
    let mut first = Some(Sources::new(&path, &instance));
    supervise::spawn(Task::Reload, move || {
        let sources = first
            .take()
            .unwrap_or_else(|| Sources::new(&path, &instance));
        let reloader = Reloader::new(path.clone(), Arc::clone(&instance));
        let shutdown = shutdown.clone();
        async move {
            // Held for as long as the loop runs: dropping it stops the watch.
            let _watcher = sources.watcher;
            run(
                reloader,
                sources.hup,
                sources.events,
                sources.poll,
                shutdown,
            )
            .await;
        }
    });
}

/// What can start a reload: SIGHUP, directory events, the poll timer.
struct Sources {
    hup: Option<tokio::signal::unix::Signal>,
    events: mpsc::UnboundedReceiver<()>,
    watcher: Option<notify::RecommendedWatcher>,
    poll: Option<tokio::time::Interval>,
}

impl Sources {
    fn new(path: &Path, instance: &Instance) -> Sources {
        let (tx, events) = mpsc::unbounded_channel::<()>();
        if !path.is_file() {
            // No file to reload (a config given as text): DNS discovery only.
            return Sources {
                hup: None,
                events,
                watcher: None,
                poll: None,
            };
        }
        let settings = instance.snapshot.load().config.reload.clone();
        let hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(error = %e, "cannot handle SIGHUP; reload by file watch or poll only");
                None
            }
        };
        let watcher = if settings.watch {
            watch_dirs(&dirs_to_watch(path, &instance.snapshot.load().config), tx)
        } else {
            None
        };
        let poll = settings.poll_interval.map(|every| {
            let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval
        });
        Sources {
            hup,
            events,
            watcher,
            poll,
        }
    }
}

async fn run(
    mut reloader: Reloader,
    mut hup: Option<tokio::signal::unix::Signal>,
    mut events: mpsc::UnboundedReceiver<()>,
    mut poll: Option<tokio::time::Interval>,
    shutdown: CancellationToken,
) {
    let mut next_discovery = discovery_due(&reloader.instance);
    loop {
        let reload = tokio::select! {
            _ = shutdown.cancelled() => return,
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                info!("SIGHUP: reloading {}", reloader.path.display());
                Some(true)
            }
            Some(()) = events.recv() => {
                // Debounce: wait until the directory has been quiet for a moment.
                while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, events.recv()).await {}
                Some(false)
            }
            _ = async { match poll.as_mut() { Some(p) => { p.tick().await; } None => std::future::pending().await } } => Some(false),
            _ = async { match next_discovery { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => None,
        };
        // Errors are logged and counted inside (or, for DNS, the last good
        // answers are kept); the loop goes on.
        match reload {
            Some(force) => {
                let _outcome = reloader.reload(force).await;
            }
            None => {
                if let Err(e) = reloader.rediscover().await {
                    warn!("DNS discovery failed; the running table stays: {e}");
                }
            }
        }
        next_discovery = discovery_due(&reloader.instance);
    }
}

/// When the running config's `dns`/`srv` entries are due to be resolved
/// again; `None` without discovery.
fn discovery_due(instance: &Instance) -> Option<tokio::time::Instant> {
    let every = instance.snapshot.load().config.discovery.as_ref()?.interval;
    Some(tokio::time::Instant::now() + every)
}

/// Whether a directory event can have changed a file's content: a write, a
/// create, a rename or move (an editor's save, a ConfigMap's symlink swap), a
/// removal. Opening, reading and closing a file unwritten cannot: magpie's
/// own re-read is such an event, and reacting to it would re-read forever.
/// Metadata changes (`touch`, `chmod`) cannot either.
pub(crate) fn can_change_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Metadata(_)) => false,
        EventKind::Create(_)
        | EventKind::Modify(_)
        | EventKind::Remove(_)
        | EventKind::Any
        | EventKind::Other => true,
    }
}

/// The directory of `path` (the config file), and those of the certificate
/// and key files `config` names, each once.
fn dirs_to_watch(path: &Path, config: &Config) -> Vec<PathBuf> {
    let dir_of = |p: &Path| match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut dirs = vec![dir_of(path)];
    for c in config.certificates() {
        for file in [&c.cert_file, &c.key_file] {
            let dir = dir_of(file);
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

/// Watches `dirs`; every event that can change a file's content sends a
/// tick (the content hash then tells whether anything did).
fn watch_dirs(
    dirs: &[PathBuf],
    tx: mpsc::UnboundedSender<()>,
) -> Option<notify::RecommendedWatcher> {
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| can_change_content(&e.kind)) {
            // The receiver is gone only when reloading stopped.
            let _closed = tx.send(());
        }
    });
    let mut watcher = match watcher {
        Ok(w) => w,
        Err(e) => {
            warn!(error = %e, "cannot watch the config directory; reload on SIGHUP or poll only");
            return None;
        }
    };
    for dir in dirs {
        if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
            warn!(dir = %dir.display(), error = %e, "cannot watch a directory of the config or its certificates; reload on SIGHUP or poll only");
        }
    }
    Some(watcher)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(text: &str, version: u64, instance: Option<&Instance>) -> Snapshot {
        let config = Arc::new(Config::parse(Path::new("t.yaml"), text).unwrap());
        let carry = instance.map(Instance::carry).unwrap_or_default();
        Snapshot::build(config, version, &carry).unwrap()
    }

    #[test]
    fn only_events_that_can_change_content_trigger_a_read() {
        use notify::event::{CreateKind, DataChange, MetadataKind, RemoveKind, RenameMode};
        for kind in [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Read),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)),
        ] {
            assert!(!can_change_content(&kind), "{kind:?}");
        }
        for kind in [
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Remove(RemoveKind::File),
        ] {
            assert!(can_change_content(&kind), "{kind:?}");
        }
    }

    const WITH_D: &str = "listen: 127.0.0.1:7000\ndrain_timeout: 2s\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: d, addr: 127.0.0.1:8004}\n";
    const WITHOUT_D: &str = "listen: 127.0.0.1:7000\ndrain_timeout: 2s\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n";

    /// Removes `d` (its drain timer starts), and returns it.
    fn remove_d(instance: &Instance, version: u64) -> Arc<Backend> {
        let removed = instance.publish(snapshot(WITHOUT_D, version, Some(instance)));
        assert_eq!(removed.len(), 1);
        schedule_drain(&removed[0], Some(Duration::from_secs(2)));
        Arc::clone(&removed[0])
    }

    #[tokio::test(start_paused = true)]
    async fn a_backend_put_back_before_its_drain_timeout_is_not_closed() {
        let instance = Instance::new(snapshot(WITH_D, 1, None));
        let open = instance
            .snapshot
            .load()
            .backend("d")
            .unwrap()
            .live
            .reserve();
        let d = remove_d(&instance, 2);
        instance.publish(snapshot(WITH_D, 3, Some(&instance)));
        let back = Arc::clone(instance.snapshot.load().backend("d").unwrap());
        assert!(Arc::ptr_eq(&back.live, &d.live), "state carried over");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            !back.live.drain.closing().is_cancelled(),
            "the old drain closed it"
        );
        drop(open);
    }

    #[tokio::test(start_paused = true)]
    async fn the_drain_timeout_closes_what_is_still_open_and_a_later_return_is_fresh() {
        let instance = Instance::new(snapshot(WITH_D, 1, None));
        let open = instance
            .snapshot
            .load()
            .backend("d")
            .unwrap()
            .live
            .reserve();
        let d = remove_d(&instance, 2);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(d.live.drain.closing().is_cancelled());
        // Put back while the closed connection is still winding down: new
        // connections must not inherit the cancelled token.
        instance.publish(snapshot(WITH_D, 3, Some(&instance)));
        let back = Arc::clone(instance.snapshot.load().backend("d").unwrap());
        assert!(!back.live.drain.closing().is_cancelled());
        drop(open);
    }

    #[tokio::test(start_paused = true)]
    async fn removed_again_the_second_drain_timer_counts() {
        let instance = Instance::new(snapshot(WITH_D, 1, None));
        let open = instance
            .snapshot
            .load()
            .backend("d")
            .unwrap()
            .live
            .reserve();
        remove_d(&instance, 2);
        tokio::time::sleep(Duration::from_secs(1)).await;
        instance.publish(snapshot(WITH_D, 3, Some(&instance)));
        let d = remove_d(&instance, 4);
        // The first timer fires at 2 s, the second at 3 s.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            !d.live.drain.closing().is_cancelled(),
            "closed by the first removal's timer"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(d.live.drain.closing().is_cancelled());
        drop(open);
    }
}
