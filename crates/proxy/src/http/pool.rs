//! Keep-alive connections to backends (`mode: http`), reused across requests
//! and clients.
//!
//! A connection is opened on demand (`net::connect`, counted against the
//! backend like a TCP-path connect; to a `tls: true` backend, then the TLS
//! handshake of [`crate::net::tls_client`]) and handed to hyper's HTTP/1.1 client,
//! whose connection task is kept as a [`Conn`]: dropping a `Conn` aborts the
//! task, which closes the socket at once, whatever state hyper was in. A
//! request holds its connection as a [`Lease`]; the response body gives the
//! lease back to its backend's idle list when the client has read it to the
//! end, and a response abandoned or cut half-way drops it (closing it).
//!
//! Idle connections are closed by a timer, not when a request happens to
//! meet them: each waits at most `http.pool_idle_timeout` (servers such as
//! uvicorn, behind vLLM and SGLang, close idle keep-alive connections after
//! 5 s, and a request sent on a connection the server is closing is lost),
//! and a backend keeps at most `http.pool_max_idle_per_backend` (the oldest
//! goes first). Both come from the config the request was routed with.
//!
//! Connections are kept by backend address, so a reload that keeps a
//! backend keeps them. One sweeper task per pool ([`Pool::start_sweeper`])
//! sleeps until the earliest idle deadline, or until a connection comes back
//! with an earlier one, and closes what has expired (or was closed by the
//! backend). It also follows the published snapshot: on every publish, the
//! idle connections to addresses that are no longer a backend's close at
//! once, and connections given back to such an address later are closed
//! instead of kept.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::sync::{Notify, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::backend_deadlines::Outgoing;
use super::reuse::Claim;
use super::upstream::UpstreamIo;
use crate::config::HttpConfig;
use crate::routing::backend::{Backend, Discard, Live, UpstreamGuard};
use crate::routing::instance::Instance;
use crate::telemetry::throttle::Throttle;

/// The most one upstream connection's reader and writer each hold (hyper's
/// least is 8 KiB).
pub(crate) const UPSTREAM_BUFFER_BYTES: usize = 16 << 10;

/// A sender for requests on one upstream connection.
pub(crate) type Sender = SendRequest<Outgoing>;

/// How long, and how many, idle connections are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) idle_timeout: Duration,
    pub(crate) max_idle: usize,
}

impl Limits {
    pub(crate) fn of(http: &HttpConfig) -> Limits {
        Limits {
            idle_timeout: http.pool_idle_timeout,
            max_idle: http.pool_max_idle_per_backend,
        }
    }
}

/// What a pool keeps: one upstream connection between two requests.
pub(crate) trait Pooled: Send + 'static {
    /// Whether it can carry another request: when it cannot, why, if its
    /// backend made it so (bytes it sent unasked, a close) and that was not
    /// counted yet.
    fn fit(&self) -> Result<(), Option<Discard>>;
    /// Counts `why` against its backend.
    fn count_discard(&self, why: Discard);
}

/// One upstream connection spoken to by hyper's client: the sender for its
/// requests, and its task. Dropping it aborts the task, which closes the
/// socket.
pub(crate) struct Conn {
    pub(crate) sender: Sender,
    task: AbortHandle,
    /// The backend's live state, to count a discard against.
    live: Arc<Live>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Pooled for Conn {
    /// hyper's client closes a connection whose backend closed it or sent
    /// bytes it did not expect.
    fn fit(&self) -> Result<(), Option<Discard>> {
        if self.sender.is_closed() {
            return Err(Some(Discard::Closed));
        }
        Ok(())
    }

    fn count_discard(&self, why: Discard) {
        self.live.traffic.count_discard(why);
    }
}

/// An upstream connection the pass-through speaks HTTP/1.1 on itself: no
/// task of its own, no buffer while it waits in the pool.
pub(crate) struct RawConn {
    pub(crate) io: UpstreamIo,
    /// Set when what was read or written leaves it unfit for another
    /// request (a response not read to its end, a request not sent whole);
    /// a reason its backend gave was counted then.
    pub(crate) spent: bool,
    /// Counts it among the backend's open upstream connections.
    open: UpstreamGuard,
}

impl RawConn {
    pub(crate) fn new(io: UpstreamIo, backend: &Arc<Backend>) -> RawConn {
        RawConn {
            io,
            spent: false,
            open: backend.live.open_upstream(),
        }
    }
}

impl Pooled for RawConn {
    fn fit(&self) -> Result<(), Option<Discard>> {
        if self.spent {
            return Err(None);
        }
        self.io.idle_state().map_err(Some)
    }

    fn count_discard(&self, why: Discard) {
        self.open.count_discard(why);
    }
}

struct Idle<C> {
    conn: C,
    until: Instant,
    /// The client connection that used it last.
    owner: u64,
}

/// Whether an idle connection can be lent before `now`; one that cannot is
/// dropped (closing it), its backend's part counted.
fn usable<C: Pooled>(idle: &Idle<C>, now: Instant) -> bool {
    if idle.until <= now {
        return false;
    }
    match idle.conn.fit() {
        Ok(()) => true,
        Err(why) => {
            if let Some(why) = why {
                discarded(&idle.conn, why);
            }
            false
        }
    }
}

struct Lists<C> {
    by_addr: HashMap<SocketAddr, VecDeque<Idle<C>>>,
    /// The backends' addresses in the published snapshot, once the sweeper
    /// follows it; a connection to any other address is not kept.
    current: Option<HashSet<SocketAddr>>,
    /// When the sweeper wakes next, if it sleeps until a deadline.
    wake_at: Option<Instant>,
}

impl<C> Default for Lists<C> {
    fn default() -> Self {
        Lists {
            by_addr: HashMap::new(),
            current: None,
            wake_at: None,
        }
    }
}

/// Counts and logs (at most once a second) a connection closed instead of
/// pooled because of what its backend did.
pub(crate) fn discarded<C: Pooled>(conn: &C, why: Discard) {
    static LOG: Throttle = Throttle::new(Duration::from_secs(1));
    conn.count_discard(why);
    if why == Discard::Unsolicited
        && let Some(held_back) = LOG.allow()
    {
        warn!(
            held_back,
            "a backend sent bytes nobody asked for on a kept-alive connection; the connection is closed, never lent (magpie_backend_pool_discards_total says which backend)"
        );
    }
}

/// The idle connections of every backend, by address (addresses are unique
/// within a pool, and a connection to an address serves whichever backend
/// has it).
pub(crate) struct Pool<C = Conn> {
    lists: Mutex<Lists<C>>,
    /// Wakes the sweeper: a connection came back with an earlier deadline
    /// than it sleeps until, or the pool is gone.
    news: Arc<Notify>,
    sweeping: AtomicBool,
}

impl<C> Default for Pool<C> {
    fn default() -> Self {
        Pool {
            lists: Mutex::default(),
            news: Arc::default(),
            sweeping: AtomicBool::new(false),
        }
    }
}

/// One upstream connection, held by one request from its send to the end of
/// its response. Given back, it waits in the pool for the next request;
/// dropped, it closes.
pub(crate) struct Lease<C: Pooled = Conn> {
    pub(crate) conn: C,
    /// Opened for this request (not taken from the pool).
    pub(crate) fresh: bool,
    addr: SocketAddr,
    limits: Limits,
    pool: Arc<Pool<C>>,
    /// The client connection it serves.
    owner: u64,
}

impl<C: Pooled> Lease<C> {
    /// A lease on `conn`, just opened to `addr` for the client connection
    /// `owner`, given back to `pool`.
    pub(crate) fn fresh(
        conn: C,
        addr: SocketAddr,
        limits: Limits,
        pool: &Arc<Pool<C>>,
        owner: u64,
    ) -> Lease<C> {
        Lease {
            conn,
            fresh: true,
            addr,
            limits,
            pool: Arc::clone(pool),
            owner,
        }
    }

    /// The response was read to its end: the connection goes back to the pool.
    pub(crate) fn give_back(self) {
        self.pool
            .checkin(self.addr, self.conn, self.limits, self.owner);
    }
}

impl<C: Pooled> Pool<C> {
    /// An idle connection to `addr` that `claim` may take and that is still
    /// fit and within its deadline: the one its client connection used
    /// last, else (when the claim allows) the most recently used. Those
    /// found unfit on the way are dropped. Its last response was read to
    /// the end, so it is ready for a request as soon as its connection task
    /// has noticed (`SendRequest::ready`).
    pub(crate) fn checkout(
        self: &Arc<Self>,
        addr: SocketAddr,
        limits: Limits,
        claim: Claim,
    ) -> Option<Lease<C>> {
        let mut lists = lock(&self.lists);
        let list = lists.by_addr.get_mut(&addr)?;
        let now = Instant::now();
        let idle = loop {
            let own = list.iter().rposition(|idle| idle.owner == claim.client);
            let at = own.or_else(|| claim.others.then(|| list.len().checked_sub(1)).flatten())?;
            let idle = list.remove(at)?;
            // Only the one taken is looked at: the rest wait for the sweeper.
            if usable(&idle, now) {
                break idle;
            }
        };
        Some(Lease {
            conn: idle.conn,
            fresh: false,
            addr,
            limits,
            pool: Arc::clone(self),
            owner: claim.client,
        })
    }

    /// Keeps `conn`, last used by the client connection `owner`, once the
    /// response it carried has been read to the end, unless it is unfit,
    /// its address left the pool or `limits` keep nothing; the oldest idle
    /// connection makes room when the list is full.
    fn checkin(&self, addr: SocketAddr, conn: C, limits: Limits, owner: u64) {
        if let Err(why) = conn.fit() {
            if let Some(why) = why {
                discarded(&conn, why);
            }
            return;
        }
        if limits.max_idle == 0 {
            return;
        }
        let until = Instant::now() + limits.idle_timeout;
        let mut lists = lock(&self.lists);
        if lists.current.as_ref().is_some_and(|c| !c.contains(&addr)) {
            return;
        }
        let list = lists.by_addr.entry(addr).or_default();
        while list.len() >= limits.max_idle {
            list.pop_front();
        }
        list.push_back(Idle { conn, until, owner });
        if lists.wake_at.is_none_or(|at| until < at) {
            lists.wake_at = Some(until);
            self.news.notify_one();
        }
    }

    /// Closes the idle connections past their deadline or closed by their
    /// backend; the earliest deadline left, which the sweeper sleeps until.
    fn close_expired(&self, now: Instant) -> Option<Instant> {
        let mut lists = lock(&self.lists);
        let mut earliest: Option<Instant> = None;
        lists.by_addr.retain(|_, list| {
            list.retain(|idle| usable(idle, now));
            for idle in list.iter() {
                earliest = Some(earliest.map_or(idle.until, |e| e.min(idle.until)));
            }
            !list.is_empty()
        });
        lists.wake_at = earliest;
        earliest
    }

    /// A snapshot was published with backends at `addrs`: idle connections
    /// to any other address close now, and none will be kept for one.
    fn follow(&self, addrs: HashSet<SocketAddr>) {
        let mut lists = lock(&self.lists);
        lists.by_addr.retain(|addr, _| addrs.contains(addr));
        lists.current = Some(addrs);
    }

    /// Starts this pool's sweeper, once: it closes idle connections at their
    /// deadline and those of removed backends on every publish of `shared`.
    /// It ends when the pool is dropped or `shared` publishes no more.
    pub(crate) fn start_sweeper(self: &Arc<Self>, instance: &Arc<Instance>) {
        if self.sweeping.load(Ordering::Relaxed) || self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        self.follow(addresses(instance));
        let sweeper = Sweeper {
            pool: Arc::downgrade(self),
            news: Arc::clone(&self.news),
            instance: Arc::downgrade(instance),
            versions: instance.versions(),
        };
        tokio::spawn(sweeper.run());
    }
}

impl<C> Drop for Pool<C> {
    fn drop(&mut self) {
        // The sweeper holds only a weak reference: let it see that.
        self.news.notify_one();
    }
}

/// The backends' addresses in `shared`'s published snapshot.
fn addresses(instance: &Instance) -> HashSet<SocketAddr> {
    let snapshot = instance.snapshot.load();
    snapshot.every_backend().map(|b| b.addr).collect()
}

/// Closes a pool's idle connections when their time is up, and a removed
/// backend's at the publish that removed it.
struct Sweeper<C> {
    pool: Weak<Pool<C>>,
    news: Arc<Notify>,
    instance: Weak<Instance>,
    versions: watch::Receiver<u64>,
}

impl<C: Pooled> Sweeper<C> {
    async fn run(mut self) {
        loop {
            let Some(pool) = self.pool.upgrade() else {
                return;
            };
            let next = pool.close_expired(Instant::now());
            drop(pool);
            let deadline = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = deadline => {}
                _ = self.news.notified() => {}
                changed = self.versions.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let (Some(pool), Some(instance)) = (self.pool.upgrade(), self.instance.upgrade())
                    else {
                        return;
                    };
                    pool.follow(addresses(&instance));
                }
            }
        }
    }
}

/// Starts hyper's HTTP/1.1 client on a connected `stream` (plain or TLS):
/// its sender, and its connection task.
pub(crate) async fn start(stream: UpstreamIo, backend: &Arc<Backend>) -> io::Result<Conn> {
    let (sender, connection) = http1::Builder::new()
        // What one upstream connection may buffer: a response head (as
        // HAProxy's default 16 KiB buffers allow), and of a body no more
        // than that while the client is slow to take it.
        .max_buf_size(UPSTREAM_BUFFER_BYTES)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    let open = backend.live.open_upstream();
    let name = backend.name.clone();
    let task = tokio::spawn(async move {
        // Aborted (its `Conn` dropped), this future is dropped with its
        // socket and the guard.
        let _open = open;
        if let Err(e) = connection.await {
            debug!(backend = %name, error = %e, "upstream connection ended with an error");
        }
    });
    Ok(Conn {
        sender,
        task: task.abort_handle(),
        live: Arc::clone(&backend.live),
    })
}

/// A poisoned lock only means another thread panicked while holding it; the
/// lists themselves are still valid.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection to `addr` whose other end is kept open by the test.
    async fn conn_to(listener: &tokio::net::TcpListener) -> (Conn, tokio::net::TcpStream) {
        let addr = listener.local_addr().unwrap();
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (peer, _) = listener.accept().await.unwrap();
        let (sender, connection) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let task = tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("test connection: {e}");
            }
        });
        let conn = Conn {
            sender,
            task: task.abort_handle(),
            live: Arc::default(),
        };
        (conn, peer)
    }

    /// Client connection 1's claim on any idle connection.
    const ANY: Claim = Claim {
        client: 1,
        others: true,
    };

    fn limits(ms: u64, max_idle: usize) -> Limits {
        Limits {
            idle_timeout: Duration::from_millis(ms),
            max_idle,
        }
    }

    fn idle_count(pool: &Pool<Conn>, addr: SocketAddr) -> usize {
        lock(&pool.lists)
            .by_addr
            .get(&addr)
            .map_or(0, VecDeque::len)
    }

    #[tokio::test]
    async fn deadlines_and_the_cap_decide_what_stays() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pool = Arc::new(Pool::<Conn>::default());
        let mut peers = Vec::new();
        for _ in 0..3 {
            let (conn, peer) = conn_to(&listener).await;
            pool.checkin(addr, conn, limits(60_000, 2), 1);
            peers.push(peer);
        }
        // The oldest made room.
        assert_eq!(idle_count(&pool, addr), 2);
        // Nothing is due yet; then everything is.
        let now = Instant::now();
        let next = pool.close_expired(now).expect("a deadline");
        assert!(next > now && next <= now + Duration::from_secs(60));
        assert_eq!(lock(&pool.lists).wake_at, Some(next));
        assert_eq!(idle_count(&pool, addr), 2);
        assert_eq!(pool.close_expired(now + Duration::from_secs(61)), None);
        assert_eq!(idle_count(&pool, addr), 0);
        assert!(pool.checkout(addr, limits(1, 2), ANY).is_none());
        // Keeping none is allowed.
        let (conn, _peer) = conn_to(&listener).await;
        pool.checkin(addr, conn, limits(60_000, 0), 1);
        assert_eq!(idle_count(&pool, addr), 0);
    }

    #[tokio::test]
    async fn an_address_that_left_keeps_nothing() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pool = Arc::new(Pool::<Conn>::default());
        let (conn, _peer) = conn_to(&listener).await;
        pool.checkin(addr, conn, limits(60_000, 4), 1);
        assert_eq!(idle_count(&pool, addr), 1);
        pool.follow(HashSet::new());
        assert_eq!(idle_count(&pool, addr), 0);
        let (conn, _peer) = conn_to(&listener).await;
        pool.checkin(addr, conn, limits(60_000, 4), 1);
        assert_eq!(idle_count(&pool, addr), 0);
        pool.follow(HashSet::from([addr]));
        let (conn, _peer) = conn_to(&listener).await;
        pool.checkin(addr, conn, limits(60_000, 4), 1);
        let lease = pool.checkout(addr, limits(60_000, 4), ANY).expect("kept");
        assert!(!lease.fresh);
    }

    /// A request takes the connection its client used last, then (if its
    /// claim allows) the most recent of another client's; never another's
    /// otherwise.
    #[tokio::test]
    async fn a_claim_takes_its_own_connection_first_and_others_only_if_allowed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pool = Arc::new(Pool::<Conn>::default());
        let mut peers = Vec::new();
        for owner in [7, 8] {
            let (conn, peer) = conn_to(&listener).await;
            pool.checkin(addr, conn, limits(60_000, 4), owner);
            peers.push(peer);
        }
        let own = |client| Claim {
            client,
            others: false,
        };
        // Client 9 may take none of them; client 7 takes its own, not the
        // more recent one of 8.
        assert!(pool.checkout(addr, limits(60_000, 4), own(9)).is_none());
        let lease = pool
            .checkout(addr, limits(60_000, 4), own(7))
            .expect("7's own");
        assert_eq!(lease.owner, 7);
        lease.give_back();
        assert_eq!(idle_count(&pool, addr), 2);
        // Allowed others, client 9 takes the most recent: 7's, given back last.
        let any = Claim {
            client: 9,
            others: true,
        };
        let lease = pool.checkout(addr, limits(60_000, 4), any).expect("any");
        assert_eq!(lease.owner, 9);
        assert_eq!(idle_count(&pool, addr), 1);
    }
}
