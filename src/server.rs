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

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::net::{is_resource_exhaustion, tune_stream};
use crate::proxy;
use crate::snapshot::Shared;

/// Pause after an accept error that more accepting cannot fix (no fds, no memory).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

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
