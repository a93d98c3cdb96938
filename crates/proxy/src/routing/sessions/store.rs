//! Instance session pins in Redis (or Valkey): `sessions.store: redis`.
//!
//! Every magpie using the same store agrees on pinned keys, as they already
//! agree on unpinned ones through the table. The local pin map stays in front
//! as a cache: a hit never waits on the store. On a miss, one round trip binds
//! the key to the table's choice unless another instance bound it first
//! (`SET NX` semantics inside a script): the first binding wins everywhere. A
//! binding to a backend that is down or gone is replaced by a compare-and-set
//! script, so one replacement wins everywhere too.
//!
//! A cached pin's binding is refreshed in the background at most once per
//! key per `ttl / 4` by the same script as a miss: its TTL is extended, or,
//! if the store lost it (an empty restart, a flush, an eviction), it is bound
//! again to the cached backend unless another instance bound the key
//! meanwhile. Either way the binding that holds is returned, and the cache
//! follows it, so every instance converges on one binding per live key.
//!
//! Bindings are read with a bounded size: every script checks `TYPE` and
//! `STRLEN` before `GET`, and a value that is not a string of at most
//! [`MAX_BINDING`] bytes is treated as absent for its key, unlinked and bound
//! over in the same script (counted, `bad_values`). So no reply is larger
//! than a backend's name, and a wrong value costs one key one binding, never
//! the store.
//!
//! The store never costs a request more than `timeout` (every round trip of
//! one lookup shares that deadline; a later turn of a conversation waits
//! [`LATER_TURN_WAITS`] times as long), and never fails one: past it,
//! or while the store is unreachable, the request is routed by the table,
//! counted, and logged at most once a second. A broken connection, or
//! [`TIMEOUTS_TO_BACK_OFF`] timeouts in a row, leave the store alone for a
//! back-off (100 ms, doubling to 5 s) while a background task reconnects;
//! one late answer (a busy host, a stalled server) costs only its own
//! request, as a late reply on the multiplexed connection is dropped when it
//! comes. An error reply about one operation (the server refused that
//! command) is counted and logged but backs nothing off.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::RedisConfig;
use crate::telemetry::stats::{FAST_BUCKETS, Histogram};
use crate::telemetry::throttle::Throttle;
use magpie_core::labels;

/// How many times `timeout` a later turn of a conversation waits for the
/// store (100 ms by default) before it goes by the table: its binding was
/// likely made by an earlier turn, and the table may send it away from the
/// backend that holds its cache, where its whole prompt would be computed
/// again. A conversation's first request has nothing to lose and waits
/// `timeout`.
pub(crate) const LATER_TURN_WAITS: u32 = 5;

/// The most bytes a binding (a backend's name) may hold in the store; a
/// longer value is treated as absent. A backend whose name is longer is
/// never bound in the store: its keys are routed by the table.
pub(crate) const MAX_BINDING: usize = 256;

/// Reads KEYS[1]'s binding: a string of at most `max` bytes, else (a longer
/// string, a list, a hash...) the value is unlinked and the key counts as
/// absent. Returns the binding (or false) and 1 if a bad value was removed.
macro_rules! read_binding {
    () => {
        r"
local function read(max)
  local kind = redis.call('TYPE', KEYS[1])['ok']
  if kind == 'none' then return false, 0 end
  if kind == 'string' and redis.call('STRLEN', KEYS[1]) <= max then
    return redis.call('GET', KEYS[1]), 0
  end
  redis.call('UNLINK', KEYS[1])
  return false, 1
end
"
    };
}

/// The same function, for scripts built elsewhere.
pub(super) const READ_BINDING: &str = read_binding!();

/// Binds KEYS[1] to ARGV[2] for ARGV[3] ms unless it is bound (a binding
/// to ARGV[2] gets its TTL extended); ARGV[1] is [`MAX_BINDING`]. Leaves
/// `held` (the binding that holds now), `bad` (1 if a bad value was
/// replaced) and `bound` (whether this call bound it).
macro_rules! bind_step {
    () => {
        r"
local held, bad = read(tonumber(ARGV[1]))
local bound = not held
if held then
  if held == ARGV[2] then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  held = ARGV[2]
end
"
    };
}

/// The same step, for scripts built elsewhere.
pub(super) const BIND_STEP: &str = bind_step!();

/// [`BIND_STEP`]: returns {the binding that holds now, 1 if a bad value was
/// replaced}.
const BIND: &str = concat!(read_binding!(), bind_step!(), "return {held, bad}\n");

/// Replaces KEYS[1]'s binding ARGV[2] (a backend that is down or gone) with
/// ARGV[3] for ARGV[4] ms, unless it changed meanwhile; ARGV[1] is
/// [`MAX_BINDING`]. Returns {the binding that holds now, 1 if a bad value
/// was replaced}.
const REPLACE: &str = concat!(
    read_binding!(),
    r"
local held, bad = read(tonumber(ARGV[1]))
if held and held ~= ARGV[2] then return {held, bad} end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
return {ARGV[3], bad}
"
);

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Timeouts in a row (no answer in time between them) that back off.
const TIMEOUTS_TO_BACK_OFF: u64 = 3;

labels! {
    /// What a store operation did, for `magpie_session_store_operations_total`.
    pub(crate) enum OpResult {
        Ok => "ok",
        Error => "error",
        Timeout => "timeout",
        /// Not tried: the store is backing off after a failure.
        Skipped => "skipped",
    }
}

/// The store's counters.
#[derive(Debug)]
pub(crate) struct StoreStats {
    ops: [AtomicU64; OpResult::COUNT],
    /// Round trips that answered, in seconds.
    pub(crate) latency: Histogram,
    /// Requests routed by the table because the store did not answer in time.
    fallbacks: AtomicU64,
    /// Bindings to a down or removed backend replaced by this instance.
    replaced: AtomicU64,
    /// Background TTL refreshes (or re-bindings) that the store answered.
    refreshes: AtomicU64,
    /// Values under a key that were not a binding (wrong type, or longer
    /// than [`MAX_BINDING`]), treated as absent and bound over.
    bad_values: AtomicU64,
    /// First requests placed again elsewhere (`fleet::crowded`).
    moved_placements: AtomicU64,
}

impl Default for StoreStats {
    fn default() -> Self {
        StoreStats {
            ops: Default::default(),
            latency: Histogram::with_bounds(&FAST_BUCKETS),
            fallbacks: AtomicU64::new(0),
            replaced: AtomicU64::new(0),
            refreshes: AtomicU64::new(0),
            bad_values: AtomicU64::new(0),
            moved_placements: AtomicU64::new(0),
        }
    }
}

impl StoreStats {
    pub(crate) fn ops(&self, result: OpResult) -> u64 {
        self.ops[result.index()].load(Ordering::Relaxed)
    }
    pub(crate) fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }
    pub(crate) fn replaced(&self) -> u64 {
        self.replaced.load(Ordering::Relaxed)
    }
    pub(crate) fn refreshes(&self) -> u64 {
        self.refreshes.load(Ordering::Relaxed)
    }
    pub(crate) fn bad_values(&self) -> u64 {
        self.bad_values.load(Ordering::Relaxed)
    }
    pub(crate) fn moved_placements(&self) -> u64 {
        self.moved_placements.load(Ordering::Relaxed)
    }
    pub(crate) fn count_moved_placement(&self) {
        self.moved_placements.fetch_add(1, Ordering::Relaxed);
    }
}

/// A connection to the shared store, or the knowledge that there is none.
pub(crate) struct Store {
    config: RedisConfig,
    ttl_ms: u64,
    client: Option<redis::Client>,
    connection: ArcSwapOption<MultiplexedConnection>,
    /// A reconnect task is running.
    connecting: AtomicBool,
    /// Milliseconds since `epoch` before which the store is not asked.
    resume_at_ms: AtomicU64,
    backoff_ms: AtomicU64,
    /// Operations that timed out since the last that was answered.
    timeouts_in_row: AtomicU64,
    epoch: Instant,
    bind: redis::Script,
    replace: redis::Script,
    pub(crate) stats: StoreStats,
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
    pub(crate) fn new(config: RedisConfig, ttl: Duration) -> Store {
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
            timeouts_in_row: AtomicU64::new(0),
            epoch: Instant::now(),
            bind: redis::Script::new(BIND),
            replace: redis::Script::new(REPLACE),
            stats: StoreStats::default(),
            config,
        }
    }

    /// Starts connecting.
    pub(crate) fn start(self: &Arc<Self>) {
        self.reconnect();
    }

    /// Whether a connection is up.
    pub(crate) fn is_connected(&self) -> bool {
        self.connection.load().is_some()
    }

    /// Whether the store is asked now: connected and not backing off.
    pub(crate) fn is_usable(&self) -> bool {
        self.is_connected() && self.now_ms() >= self.resume_at_ms.load(Ordering::Relaxed)
    }

    pub(super) fn key(&self, key: u64) -> String {
        format!("{}{key:016x}", self.config.prefix)
    }

    /// A key of the store's own under the configured prefix.
    pub(super) fn prefixed(&self, rest: &str) -> String {
        format!("{}{rest}", self.config.prefix)
    }

    /// A deadline for one lookup from now.
    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.config.timeout
    }

    /// The deadline for a request's lookup from now: `timeout`, or for a
    /// later turn of a conversation [`LATER_TURN_WAITS`] times that.
    pub(crate) fn deadline_for(&self, later_turn: bool) -> Instant {
        match later_turn {
            true => Instant::now() + self.config.timeout.saturating_mul(LATER_TURN_WAITS),
            false => self.deadline(),
        }
    }

    pub(super) fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// A request is routed by the table: the store did not answer in time.
    pub(super) fn fell_back(&self) {
        self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// The binding of `key` a request uses: the store's, or `choice` if the
    /// store had none (or a bad value); a binding that `usable` refuses (a
    /// backend down or gone) is replaced by `choice` once for all. Both
    /// round trips share one `deadline`. `None`: route by the table (the
    /// store did not answer in time, or refused).
    pub(crate) async fn pin(
        &self,
        key: u64,
        choice: &str,
        usable: impl Fn(&str) -> bool,
        deadline: Instant,
    ) -> Option<String> {
        if !bindable(choice) {
            return None;
        }
        let answered = self.pin_by(key, choice, usable, deadline).await;
        if answered.is_none() {
            self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        answered.flatten()
    }

    /// [`Store::pin`] by `deadline`: `None` if the store did not answer,
    /// `Some(None)` if it holds no usable binding after all.
    async fn pin_by(
        &self,
        key: u64,
        choice: &str,
        usable: impl Fn(&str) -> bool,
        deadline: Instant,
    ) -> Option<Option<String>> {
        let held = self.bind(key, choice, deadline).await?;
        self.usable_or_replaced(key, held, choice, usable, deadline)
            .await
    }

    /// `held`, the binding of `key` a script found, if `usable` takes it;
    /// else (a backend that is down or gone) `choice` in its place, once for
    /// all. `None` if the store did not answer by `deadline`, `Some(None)`
    /// if it holds no usable binding after all.
    pub(super) async fn usable_or_replaced(
        &self,
        key: u64,
        held: Vec<u8>,
        choice: &str,
        usable: impl Fn(&str) -> bool,
        deadline: Instant,
    ) -> Option<Option<String>> {
        let held = match String::from_utf8(held) {
            Ok(name) if usable(&name) => return Some(Some(name)),
            Ok(name) => name.into_bytes(),
            Err(e) => e.into_bytes(),
        };
        let now = self.replace(key, &held, choice, deadline).await?;
        Some(String::from_utf8(now).ok().filter(|name| usable(name)))
    }

    /// Extends `key`'s binding to `backend` by the TTL, or binds it again
    /// if the store lost it. The binding that holds now (another
    /// instance's, if it bound the key meanwhile); `None`: no answer.
    pub(crate) async fn refresh(&self, key: u64, backend: &str) -> Option<Vec<u8>> {
        let deadline = Instant::now() + self.config.timeout;
        let held = self.bind(key, backend, deadline).await;
        if held.is_some() {
            self.stats.refreshes.fetch_add(1, Ordering::Relaxed);
        }
        held
    }

    /// Binds `key` to `backend` unless it is bound; the binding that holds.
    async fn bind(&self, key: u64, backend: &str, deadline: Instant) -> Option<Vec<u8>> {
        let mut invocation = self.bind.key(self.key(key));
        invocation.arg(MAX_BINDING).arg(backend).arg(self.ttl_ms);
        let reply = self
            .run(deadline, |mut c| async move {
                invocation.invoke_async(&mut c).await
            })
            .await;
        self.held(reply)
    }

    /// Replaces `key`'s binding `stale` with `backend`; the binding that
    /// holds (`backend` if this replacement won).
    pub(super) async fn replace(
        &self,
        key: u64,
        stale: &[u8],
        backend: &str,
        deadline: Instant,
    ) -> Option<Vec<u8>> {
        let mut invocation = self.replace.key(self.key(key));
        invocation
            .arg(MAX_BINDING)
            .arg(stale)
            .arg(backend)
            .arg(self.ttl_ms);
        let reply = self
            .run(deadline, |mut c| async move {
                invocation.invoke_async(&mut c).await
            })
            .await;
        let held = self.held(reply)?;
        if held == backend.as_bytes() {
            self.stats.replaced.fetch_add(1, Ordering::Relaxed);
        }
        Some(held)
    }

    /// A script's reply {binding, bad}: the binding, a bad value counted.
    pub(super) fn held(&self, reply: Option<(Vec<u8>, u8)>) -> Option<Vec<u8>> {
        let (held, bad) = reply?;
        if bad != 0 {
            self.stats.bad_values.fetch_add(1, Ordering::Relaxed);
        }
        Some(held)
    }

    /// One operation by `deadline`, counted. A store that failed (no
    /// connection, a broken connection, [`TIMEOUTS_TO_BACK_OFF`] late
    /// answers in a row) backs off and reconnects; an error reply about this
    /// operation alone, or one late answer, does not.
    pub(super) async fn run<T, F, Fut>(&self, deadline: Instant, op: F) -> Option<T>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        static LOG: Throttle = Throttle::new(Duration::from_secs(1));
        let connection = match self.connection.load_full() {
            Some(c) if self.now_ms() >= self.resume_at_ms.load(Ordering::Relaxed) => c,
            _ => {
                self.count(OpResult::Skipped);
                return None;
            }
        };
        let started = Instant::now();
        let result = tokio::time::timeout_at(deadline, op((*connection).clone())).await;
        let failure = match result {
            Ok(Ok(value)) => {
                self.stats.latency.observe(started.elapsed());
                self.count(OpResult::Ok);
                self.backoff_ms.store(0, Ordering::Relaxed);
                self.timeouts_in_row.store(0, Ordering::Relaxed);
                return Some(value);
            }
            // The client's own response timeout, or the deadline.
            Ok(Err(e)) if e.is_timeout() => self.timed_out()?,
            Err(_) => self.timed_out()?,
            Ok(Err(e)) if !store_wide(&e) => {
                self.count(OpResult::Error);
                if let Some(held_back) = LOG.allow() {
                    warn!(addr = %self.config.addr, error = %e, held_back, "session store refused an operation; routing that request by the table");
                }
                return None;
            }
            Ok(Err(e)) => {
                self.count(OpResult::Error);
                e.to_string()
            }
        };
        if let Some(held_back) = LOG.allow() {
            warn!(addr = %self.config.addr, error = %failure, held_back, "session store failed; routing by the table and backing off");
        }
        self.back_off();
        None
    }

    /// Counts a late answer; the failure to back off for, once
    /// [`TIMEOUTS_TO_BACK_OFF`] came in a row, else `None` (logged).
    fn timed_out(&self) -> Option<String> {
        static LOG: Throttle = Throttle::new(Duration::from_secs(1));
        self.count(OpResult::Timeout);
        let in_row = self.timeouts_in_row.fetch_add(1, Ordering::Relaxed) + 1;
        if in_row >= TIMEOUTS_TO_BACK_OFF {
            self.timeouts_in_row.store(0, Ordering::Relaxed);
            return Some(format!(
                "no answer within {:?}, {in_row} times in a row",
                self.config.timeout
            ));
        }
        if let Some(held_back) = LOG.allow() {
            warn!(addr = %self.config.addr, timeout = ?self.config.timeout, held_back, "session store answered late; routing that request by the table");
        }
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
                    .set_response_timeout(Some(
                        store.config.timeout.saturating_mul(LATER_TURN_WAITS),
                    ));
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
    pub(crate) fn ensure_connecting(self: &Arc<Self>) {
        if !self.is_connected() {
            self.reconnect();
        }
    }
}

/// Whether `e` says the store (or the connection to it) failed, rather
/// than that the server refused this one operation: I/O and protocol
/// errors, and the server's own "wait" answers (`LOADING`, `MASTERDOWN`...).
fn store_wide(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_unrecoverable_error()
        || matches!(e.retry_method(), redis::RetryMethod::WaitAndRetry)
}

/// Whether `backend`'s name can be a binding (at most [`MAX_BINDING`]
/// bytes); a longer one is logged.
pub(super) fn bindable(backend: &str) -> bool {
    if backend.len() <= MAX_BINDING {
        return true;
    }
    static LOG: Throttle = Throttle::new(Duration::from_secs(60));
    if let Some(held_back) = LOG.allow() {
        warn!(%backend, held_back, "a backend name longer than {MAX_BINDING} bytes is never bound in the session store; its keys go by the table");
    }
    false
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

#[cfg(test)]
mod tests;
