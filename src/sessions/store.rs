//! Shared session pins in Redis (or Valkey): `sessions.store: redis`.
//!
//! Every magpie using the same store agrees on pinned keys, as they already
//! agree on unpinned ones through the table. The local pin map stays in front
//! as a cache: a hit never touches the store. On a miss, one round trip binds
//! the key to the table's choice unless another instance bound it first
//! (`SET NX` semantics inside a script): the first binding wins everywhere. A
//! binding to a backend that is down or gone is replaced by a compare-and-set
//! script, so one replacement wins everywhere too.
//!
//! The store never costs a request more than `timeout`, and never fails one:
//! past the timeout, or while the store is unreachable, the request is routed
//! by the table, counted, and logged at most once a second; the store is then
//! left alone for a back-off (100 ms, doubling to 5 s) while a background
//! task reconnects. TTL refreshes of cached pins are sent in the background,
//! at most one per key per `ttl / 4`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::RedisConfig;
use crate::label::labels;
use crate::stats::{FAST_BUCKETS, Histogram};
use crate::throttle::Throttle;

/// Binds KEYS[1] to ARGV[1] for ARGV[2] ms unless it is bound; returns the
/// binding that holds now.
const BIND_OR_GET: &str = r"
local held = redis.call('GET', KEYS[1])
if held then return held end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
";

/// Replaces KEYS[1]'s binding ARGV[1] (a backend that is down or gone) with
/// ARGV[2] for ARGV[3] ms, unless it changed meanwhile; returns the binding
/// that holds now.
const REPLACE: &str = r"
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return held end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return ARGV[2]
";

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

labels! {
    /// What a store operation did, for `magpie_session_store_operations_total`.
    pub enum OpResult {
        Ok => "ok",
        Error => "error",
        Timeout => "timeout",
        /// Not tried: the store is backing off after a failure.
        Skipped => "skipped",
    }
}

/// The store's counters.
#[derive(Debug)]
pub struct StoreStats {
    ops: [AtomicU64; OpResult::COUNT],
    /// Round trips that answered, in seconds.
    pub latency: Histogram,
    /// Requests routed by the table because the store did not answer in time.
    fallbacks: AtomicU64,
    /// Bindings to a down or removed backend replaced by this instance.
    replaced: AtomicU64,
    /// Background TTL refreshes sent.
    refreshes: AtomicU64,
}

impl Default for StoreStats {
    fn default() -> Self {
        StoreStats {
            ops: Default::default(),
            latency: Histogram::with_bounds(&FAST_BUCKETS),
            fallbacks: AtomicU64::new(0),
            replaced: AtomicU64::new(0),
            refreshes: AtomicU64::new(0),
        }
    }
}

impl StoreStats {
    pub fn ops(&self, result: OpResult) -> u64 {
        self.ops[result.index()].load(Ordering::Relaxed)
    }
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }
    pub fn replaced(&self) -> u64 {
        self.replaced.load(Ordering::Relaxed)
    }
    pub fn refreshes(&self) -> u64 {
        self.refreshes.load(Ordering::Relaxed)
    }
}

/// A connection to the shared store, or the knowledge that there is none.
pub struct Store {
    config: RedisConfig,
    ttl_ms: u64,
    client: Option<redis::Client>,
    connection: ArcSwapOption<MultiplexedConnection>,
    /// A reconnect task is running.
    connecting: AtomicBool,
    /// Milliseconds since `epoch` before which the store is not asked.
    resume_at_ms: AtomicU64,
    backoff_ms: AtomicU64,
    epoch: Instant,
    bind_or_get: redis::Script,
    replace: redis::Script,
    pub stats: StoreStats,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("config", &self.config)
            .finish()
    }
}

impl Store {
    /// A store for `config`; it connects in the background (call
    /// [`Store::start`] from within the runtime).
    pub fn new(config: RedisConfig, ttl: Duration) -> Store {
        let client = connection_info(&config).and_then(|info| {
            redis::Client::open(info)
                .map_err(|e| warn!(addr = %config.addr, error = %e, "cannot use the session store address"))
                .ok()
        });
        Store {
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            client,
            connection: ArcSwapOption::empty(),
            connecting: AtomicBool::new(false),
            resume_at_ms: AtomicU64::new(0),
            backoff_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            bind_or_get: redis::Script::new(BIND_OR_GET),
            replace: redis::Script::new(REPLACE),
            stats: StoreStats::default(),
            config,
        }
    }

    /// Starts connecting.
    pub fn start(self: &Arc<Self>) {
        self.reconnect();
    }

    /// Whether a connection is up.
    pub fn is_connected(&self) -> bool {
        self.connection.load().is_some()
    }

    fn key(&self, key: u64) -> String {
        format!("{}{key:016x}", self.config.prefix)
    }

    /// Binds `key` to `backend` unless it is bound; the binding that holds.
    /// `None`: the store did not answer in time (route by the table).
    pub async fn bind_or_get(&self, key: u64, backend: &str) -> Option<String> {
        let mut invocation = self.bind_or_get.key(self.key(key));
        invocation.arg(backend).arg(self.ttl_ms);
        self.run(|mut c| async move { invocation.invoke_async(&mut c).await })
            .await
    }

    /// Replaces `key`'s binding `stale` with `backend`; the binding that
    /// holds (`backend` if this replacement won). `None`: no answer in time.
    pub async fn replace(&self, key: u64, stale: &str, backend: &str) -> Option<String> {
        let mut invocation = self.replace.key(self.key(key));
        invocation.arg(stale).arg(backend).arg(self.ttl_ms);
        let held: Option<String> = self
            .run(|mut c| async move { invocation.invoke_async(&mut c).await })
            .await;
        if held.as_deref() == Some(backend) {
            self.stats.replaced.fetch_add(1, Ordering::Relaxed);
        }
        held
    }

    /// Extends `key`'s binding by the TTL, in the background.
    pub fn refresh(self: &Arc<Self>, key: u64) {
        let store = Arc::clone(self);
        tokio::spawn(async move {
            let k = store.key(key);
            let ttl = store.ttl_ms;
            let done: Option<i64> = store
                .run(|mut c| async move {
                    redis::cmd("PEXPIRE")
                        .arg(k)
                        .arg(ttl)
                        .query_async(&mut c)
                        .await
                })
                .await;
            if done.is_some() {
                store.stats.refreshes.fetch_add(1, Ordering::Relaxed);
            }
        });
    }

    /// One operation within the timeout, counted; on any failure the store
    /// backs off and reconnects, and the caller routes by the table.
    async fn run<T, F, Fut>(&self, op: F) -> Option<T>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        static LOG: Throttle = Throttle::new(Duration::from_secs(1));
        let connection = match self.connection.load_full() {
            Some(c) if self.now_ms() >= self.resume_at_ms.load(Ordering::Relaxed) => c,
            _ => {
                self.count(OpResult::Skipped);
                self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let started = Instant::now();
        let result = tokio::time::timeout(self.config.timeout, op((*connection).clone())).await;
        let failure = match result {
            Ok(Ok(value)) => {
                self.stats.latency.observe(started.elapsed());
                self.count(OpResult::Ok);
                self.backoff_ms.store(0, Ordering::Relaxed);
                return Some(value);
            }
            Ok(Err(e)) => {
                self.count(OpResult::Error);
                e.to_string()
            }
            Err(_) => {
                self.count(OpResult::Timeout);
                format!("no answer within {:?}", self.config.timeout)
            }
        };
        self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        if let Some(held_back) = LOG.allow() {
            warn!(addr = %self.config.addr, error = %failure, held_back, "session store failed; routing by the table and backing off");
        }
        self.back_off();
        None
    }

    fn count(&self, result: OpResult) {
        self.stats.ops[result.index()].fetch_add(1, Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Leaves the store alone for a while (doubling each time) and
    /// reconnects: a failed connection is dropped, so the next one is fresh.
    fn back_off(&self) {
        let last = self.backoff_ms.load(Ordering::Relaxed);
        let next = (last * 2).clamp(
            FIRST_BACKOFF.as_millis() as u64,
            MAX_BACKOFF.as_millis() as u64,
        );
        self.backoff_ms.store(next, Ordering::Relaxed);
        self.resume_at_ms
            .store(self.now_ms() + next, Ordering::Relaxed);
        self.connection.store(None);
    }

    /// Connects in the background until it works (with the back-off between
    /// tries), unless a reconnect is already running.
    fn reconnect(self: &Arc<Self>) {
        let Some(client) = self.client.clone() else {
            return;
        };
        if self.connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = Arc::clone(self);
        tokio::spawn(async move {
            let mut pause = FIRST_BACKOFF;
            loop {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(
                        store.config.timeout.max(Duration::from_millis(100)),
                    ))
                    .set_response_timeout(Some(store.config.timeout));
                match client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                {
                    Ok(c) => {
                        info!(addr = %store.config.addr, "session store connected");
                        store.connection.store(Some(Arc::new(c)));
                        store.resume_at_ms.store(0, Ordering::Relaxed);
                        break;
                    }
                    Err(e) => {
                        static LOG: Throttle = Throttle::new(Duration::from_secs(5));
                        if let Some(held_back) = LOG.allow() {
                            warn!(addr = %store.config.addr, error = %e, held_back, "cannot connect to the session store; routing by the table meanwhile");
                        }
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(MAX_BACKOFF);
                    }
                }
            }
            store.connecting.store(false, Ordering::Release);
        });
    }

    /// Reconnects if the connection was dropped (called on the request path;
    /// it only spawns).
    pub fn ensure_connecting(self: &Arc<Self>) {
        if !self.is_connected() {
            self.reconnect();
        }
    }
}

fn connection_info(config: &RedisConfig) -> Option<redis::ConnectionInfo> {
    use redis::IntoConnectionInfo;
    let (host, port) = config.addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let info = (host, port).into_connection_info().ok()?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &config.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &config.password {
        settings = settings.set_password(password);
    }
    Some(info.set_redis_settings(settings))
}
