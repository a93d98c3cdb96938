//! The accept loop both data paths share: connection limits, one task per
//! connection, and the graceful drain at shutdown.
//!
//! The entry point takes bound listeners, a shutdown signal and what to do
//! with each connection: [`serve`]`(listeners, shared, shutdown, handler)`.
//! Each accepted connection becomes one task running the handler (a TCP
//! connection, or an HTTP connection serving many requests), tracked so that
//! shutdown can wait for it: on the signal, accepting stops at once, open
//! connections get `shutdown_grace` to finish, and whatever is left is then
//! closed.
//!
//! The accept loop never ends because of a peer. Running out of file
//! descriptors (EMFILE/ENFILE) or buffers is counted, logged and waited out
//! with a short back-off; other accept errors are counted and skipped.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::net::{Local, Peer, is_resource_exhaustion};
use crate::routing::instance::Instance;
use crate::telemetry::stats::{Exhausted, Stats};
use crate::telemetry::supervise::{self, Task};
use crate::telemetry::throttle::Throttle;

/// Pause after an accept error that more accepting cannot fix (no fds, no memory).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// One accepted connection, handed to the data path.
pub(crate) struct Accepted {
    /// The accepted socket, tuned.
    pub(crate) stream: TcpStream,
    /// Where the TCP connection came from.
    pub(crate) peer: Peer,
    /// The address it was accepted on.
    pub(crate) local: Local,
    /// The listener's position in `listen`.
    pub(crate) listener: usize,
    pub(crate) instance: Arc<Instance>,
    /// Fired at shutdown: finish what is in flight, take nothing new (an HTTP
    /// connection stops keep-alive).
    pub(crate) shutdown: CancellationToken,
    /// Fired when the shutdown grace is over: close now.
    pub(crate) stop: CancellationToken,
    /// The connection's `max_connections` slot, given back when it is dropped.
    pub(crate) slot: OwnedSemaphorePermit,
}

/// What every accept loop shares.
#[derive(Clone)]
struct Acceptor<H> {
    /// Serves one accepted connection.
    handler: H,
    instance: Arc<Instance>,
    /// Every connection task, so that shutdown can wait for them.
    tracker: TaskTracker,
    /// Stop accepting.
    shutdown: CancellationToken,
    /// The grace period is over: open connections close.
    hard_stop: CancellationToken,
}

/// Serves `listeners` with `handler` until `shutdown` fires, then drains.
pub(crate) async fn serve<H, F>(
    listeners: Vec<TcpListener>,
    instance: Arc<Instance>,
    shutdown: CancellationToken,
    handler: H,
) -> Drained
where
    H: Fn(Accepted) -> F + Clone + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let acceptor = Acceptor {
        handler,
        instance: Arc::clone(&instance),
        tracker: TaskTracker::new(),
        shutdown: shutdown.clone(),
        hard_stop: CancellationToken::new(),
    };
    let accept_loops: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(index, listener)| {
            let (listener, acceptor) = (Arc::new(listener), acceptor.clone());
            supervise::spawn(Task::Accept, move || {
                accept_loop(Arc::clone(&listener), index, acceptor.clone())
            })
        })
        .collect();

    shutdown.cancelled().await;
    // Not ready from now on (`/readyz`): load balancers stop sending new
    // connections while the open ones drain.
    instance.start_draining();
    for accept_loop in accept_loops {
        if let Err(e) = accept_loop.await {
            warn!(error = %e, "accept loop ended abnormally");
        }
    }
    let tracker = &acceptor.tracker;
    tracker.close();
    // Read now, not at start: a reload may have changed it.
    let grace = instance.snapshot.load().config.shutdown_grace;
    // Queued requests are served or refused (503) a little before the
    // grace ends, so their answers go out before connections are cut.
    let margin = (grace / 10).min(std::time::Duration::from_secs(1));
    (instance.queue).close_by(tokio::time::Instant::now() + grace - margin);
    let open = tracker.len();
    info!(open, grace = ?grace, "shutting down: no new connections; waiting for open ones");
    let mut cut = 0;
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        cut = tracker.len();
        warn!(
            cut,
            "grace period over; resetting the remaining connections"
        );
        acceptor.hard_stop.cancel();
        tracker.wait().await;
    }
    info!("all connections closed");
    Drained { cut, failed: false }
}

/// How the drain at shutdown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Drained {
    /// Connections still open when the grace period ended, closed with a
    /// reset (0: every connection finished on its own).
    pub cut: usize,
    /// The serving task itself failed (a bug): the drain is not known to
    /// have finished.
    pub failed: bool,
}

impl Drained {
    /// Whether every connection ended on its own and nothing failed.
    pub fn is_clean(&self) -> bool {
        self.cut == 0 && !self.failed
    }
}

/// Counts a failed accept; when magpie is out of file descriptors or memory,
/// logs it (at most once a second) and backs off, since accepting again at
/// once would fail the same way and spin. Used by the admin endpoint too.
pub(crate) async fn accept_failed(error: &std::io::Error, stats: &Stats, during: Exhausted) {
    // One budget per listener kind, so a busy one does not hide the other.
    static EXHAUSTED_LOG: [Throttle; Exhausted::COUNT] =
        [const { Throttle::new(Duration::from_secs(1)) }; Exhausted::COUNT];
    stats.count_accept_error();
    if is_resource_exhaustion(error) {
        stats.count_exhausted(during);
        if let Some(held_back) = EXHAUSTED_LOG[during.index()].allow() {
            warn!(%error, during = during.as_str(), held_back, "accept failed: magpie is out of resources; backing off");
        }
        tokio::time::sleep(ACCEPT_BACKOFF).await;
    } else {
        debug!(%error, "accept failed");
    }
}

async fn accept_loop<H, F>(listener: Arc<TcpListener>, index: usize, acceptor: Acceptor<H>)
where
    H: Fn(Accepted) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    // A listener on one address needs no getsockname per connection to know
    // where a client connected; a wildcard one does.
    let listening = listener.local_addr().ok();
    let specific = listening.filter(|a| !a.ip().is_unspecified());
    let stats = &acceptor.instance.stats;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = acceptor.shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                accept_failed(&e, stats, Exhausted::Accept).await;
                continue;
            }
        };
        stats.count_accepted();
        let Ok(permit) = Arc::clone(&acceptor.instance.limit).try_acquire_owned() else {
            // Over the limit: close at once (the client sees the connection
            // accepted and closed, not a hang in the backlog).
            stats.count_rejected();
            debug!(%peer, "over max_connections; closing");
            drop(stream);
            continue;
        };
        // TCP_NODELAY and keepalive come from the listening socket.
        let local = match specific {
            Some(addr) => addr,
            None => stream.local_addr().ok().or(listening).unwrap_or(peer),
        };
        // The handler's future is spawned as it is: wrapping it in another
        // async block would store it twice in the task.
        acceptor.tracker.spawn((acceptor.handler)(Accepted {
            stream,
            peer: Peer(peer),
            local: Local(local),
            listener: index,
            instance: Arc::clone(&acceptor.instance),
            shutdown: acceptor.shutdown.clone(),
            stop: acceptor.hard_stop.clone(),
            slot: permit,
        }));
    }
}
