//! Listeners, the accept loop, connection limits and graceful drain.
//!
//! The entry point takes bound listeners and a shutdown signal:
//! [`serve`]`(listeners, shared, shutdown)`. Each accepted connection becomes
//! one task running [`crate::proxy::handle`], tracked so that shutdown can
//! wait for it: on the signal, accepting stops at once, open connections get
//! `shutdown_grace` to finish, and whatever is left is then closed.
//!
//! The accept loop never ends because of a peer. Running out of file
//! descriptors (EMFILE/ENFILE) or buffers is counted, logged and waited out
//! with a short back-off; other accept errors are counted and skipped.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::net::{bind, is_resource_exhaustion, tune_stream};
use crate::proxy;
use crate::snapshot::Shared;

/// Pause after an accept error that more accepting cannot fix (no fds, no memory).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// File descriptors kept aside for listeners, admin, health checks and logs.
const FD_MARGIN: u64 = 64;

/// Raises the soft RLIMIT_NOFILE as far as the hard limit allows, and warns
/// if it still cannot hold `max_connections` (two descriptors each).
pub fn check_fd_limit(max_connections: usize) {
    let needed = 2 * max_connections as u64 + FD_MARGIN;
    let soft = match rlimit::increase_nofile_limit(needed.max(1 << 16)) {
        Ok(soft) => soft,
        Err(e) => {
            warn!(error = %e, "cannot read or raise the open-file limit");
            return;
        }
    };
    if needed > soft {
        warn!(
            limit = soft,
            needed,
            "open-file limit is below 2 x max_connections + {FD_MARGIN}: accepts will fail before max_connections is reached (raise `ulimit -n`)"
        );
    }
}

/// Serves `listeners` until `shutdown` fires, then drains.
pub async fn serve(listeners: Vec<TcpListener>, shared: Arc<Shared>, shutdown: CancellationToken) {
    let limit = Arc::clone(&shared.limit);
    let tracker = TaskTracker::new();
    // Cancelled when the grace period is over: open connections close.
    let hard_stop = CancellationToken::new();

    let accept_loops: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            tokio::spawn(accept_loop(
                listener,
                Arc::clone(&shared),
                Arc::clone(&limit),
                tracker.clone(),
                shutdown.clone(),
                hard_stop.clone(),
            ))
        })
        .collect();

    shutdown.cancelled().await;
    for accept_loop in accept_loops {
        if let Err(e) = accept_loop.await {
            warn!(error = %e, "accept loop ended abnormally");
        }
    }
    tracker.close();
    // Read now, not at start: a reload may have changed it.
    let grace = shared.snapshot.load().config.shutdown_grace;
    let open = tracker.len();
    info!(open, grace = ?grace, "shutting down: no new connections; waiting for open ones");
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        warn!(
            open = tracker.len(),
            "grace period over; closing the remaining connections"
        );
        hard_stop.cancel();
        tracker.wait().await;
    }
    info!("all connections closed");
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    limit: Arc<Semaphore>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    hard_stop: CancellationToken,
) {
    let local = listener.local_addr().ok();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                shared.stats.count_accept_error();
                if is_resource_exhaustion(&e) {
                    warn!(error = %e, "accept failed: out of resources; backing off");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                } else {
                    debug!(error = %e, "accept failed");
                }
                continue;
            }
        };
        shared.stats.count_accepted();
        let Ok(permit) = Arc::clone(&limit).try_acquire_owned() else {
            // Over the limit: close at once (the client sees the connection
            // accepted and closed, not a hang in the backlog).
            shared.stats.count_rejected();
            debug!(%peer, "over max_connections; closing");
            drop(stream);
            continue;
        };
        tune_stream(&stream);
        let local = stream.local_addr().ok().or(local).unwrap_or(peer);
        let shared = Arc::clone(&shared);
        let stop = hard_stop.clone();
        tracker.spawn(async move {
            proxy::handle(stream, peer, local, shared, stop).await;
            drop(permit);
        });
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    #[error("table build was interrupted")]
    BuildAborted,
}

/// A started magpie: where it listens, its shared state, and its task.
pub struct Running {
    pub listen: Vec<SocketAddr>,
    /// Where the admin endpoint listens, if it is on.
    pub admin: Option<SocketAddr>,
    pub shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Resolves when magpie has shut down and every connection is closed.
    pub async fn wait(self) {
        if let Err(e) = self.task.await {
            warn!(error = %e, "server task ended abnormally");
        }
    }
}

/// Builds the first snapshot, binds every listener and the admin endpoint, and
/// serves until `shutdown` fires, with health checks, and with reloads of
/// `config.source` when that is a file. Binding happens before this returns,
/// so a port that is taken is an error here, not a log line later.
pub async fn start(
    config: crate::config::Config,
    shutdown: CancellationToken,
) -> Result<Running, StartError> {
    let config = Arc::new(config);
    let build = Arc::clone(&config);
    let snapshot = tokio::task::spawn_blocking(move || {
        crate::snapshot::Snapshot::build(build, 1, &Default::default())
    })
    .await
    .map_err(|_| StartError::BuildAborted)??;
    check_fd_limit(config.max_connections);
    let mut listeners = Vec::new();
    let mut listen = Vec::new();
    for &addr in &config.listen {
        let listener = bind(addr).map_err(|source| StartError::Bind { addr, source })?;
        listen.push(listener.local_addr().unwrap_or(addr));
        listeners.push(listener);
    }
    let admin_listener = match config.admin {
        Some(addr) => Some(bind(addr).map_err(|source| StartError::Bind { addr, source })?),
        None => None,
    };
    let admin = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
    info!(
        config = %config.source.display(),
        listen = ?listen,
        admin = ?admin,
        backends = snapshot.backends.len(),
        algorithm = ?snapshot.table.algorithm(),
        fingerprint = %snapshot.fingerprint,
        key = ?config.key,
        "magpie started"
    );
    let shared = Arc::new(Shared::new(snapshot));
    // The admin endpoint outlives the listeners: during a drain, operators
    // watch the active connections go down. It stops when the drain is done.
    let drained = CancellationToken::new();
    if let Some(listener) = admin_listener {
        tokio::spawn(crate::admin::serve(
            listener,
            Arc::clone(&shared),
            drained.clone(),
        ));
    }
    tokio::spawn(crate::health::run(Arc::clone(&shared), shutdown.clone()));
    if config.source.is_file() {
        crate::reload::spawn(config.source.clone(), Arc::clone(&shared), shutdown.clone());
    }
    let serving = serve(listeners, Arc::clone(&shared), shutdown);
    let task = tokio::spawn(async move {
        serving.await;
        drained.cancel();
    });
    Ok(Running {
        listen,
        admin,
        shared,
        task,
    })
}
