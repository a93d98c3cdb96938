//! A backend: its identity (name, address, weight, zone) and its live state.
//!
//! Identity comes from the config and never changes within a snapshot. Live
//! state is a set of atomics shared by the data path (which counts), health
//! checks (which mark up and down) and metrics/admin (which read). It lives
//! behind its own `Arc`, so a reload can hand the same live state to the next
//! snapshot when a backend's name and address are unchanged: its counters,
//! health and open connections carry over.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use tokio_util::sync::CancellationToken;

use crate::config::BackendConfig;
use crate::stats::{FAST_BUCKETS, Histogram};

#[derive(Debug)]
pub struct Backend {
    pub name: String,
    pub addr: SocketAddr,
    pub weight: u32,
    pub zone: Option<String>,
    pub live: Arc<Live>,
}

impl Backend {
    pub fn new(config: &BackendConfig, live: Arc<Live>) -> Self {
        Backend {
            name: config.name.clone(),
            addr: config.addr,
            weight: config.weight,
            zone: config.zone.clone(),
            live,
        }
    }
}

/// Why a connect to a backend failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    Refused,
    Timeout,
    /// Anything else: unreachable, reset, out of ports, ...
    Error,
}

impl ConnectFailure {
    pub const ALL: [ConnectFailure; 3] = [
        ConnectFailure::Refused,
        ConnectFailure::Timeout,
        ConnectFailure::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ConnectFailure::Refused => "refused",
            ConnectFailure::Timeout => "timeout",
            ConnectFailure::Error => "error",
        }
    }

    pub fn of(error: &std::io::Error) -> Self {
        match error.kind() {
            std::io::ErrorKind::ConnectionRefused => ConnectFailure::Refused,
            std::io::ErrorKind::TimedOut => ConnectFailure::Timeout,
            _ => ConnectFailure::Error,
        }
    }
}

/// What became of a request sent to a backend (`mode: http`), by the class
/// of its status code; `Error` when no response came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeClass {
    Informational,
    Success,
    Redirection,
    ClientError,
    ServerError,
    Error,
}

impl CodeClass {
    pub const ALL: [CodeClass; 6] = [
        CodeClass::Informational,
        CodeClass::Success,
        CodeClass::Redirection,
        CodeClass::ClientError,
        CodeClass::ServerError,
        CodeClass::Error,
    ];

    pub fn of(status: u16) -> CodeClass {
        match status {
            100..=199 => CodeClass::Informational,
            200..=299 => CodeClass::Success,
            300..=399 => CodeClass::Redirection,
            400..=499 => CodeClass::ClientError,
            _ => CodeClass::ServerError,
        }
    }

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            CodeClass::Informational => "1xx",
            CodeClass::Success => "2xx",
            CodeClass::Redirection => "3xx",
            CodeClass::ClientError => "4xx",
            CodeClass::ServerError => "5xx",
            CodeClass::Error => "error",
        }
    }
}

/// What one active health check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckOutcome {
    Ok,
    /// The connect (or the HTTP exchange) failed.
    Failed,
    /// No answer within `health.timeout`.
    Timeout,
    /// An HTTP check got a status outside `health.expect_status`.
    BadStatus,
}

impl CheckOutcome {
    pub const ALL: [CheckOutcome; 4] = [
        CheckOutcome::Ok,
        CheckOutcome::Failed,
        CheckOutcome::Timeout,
        CheckOutcome::BadStatus,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckOutcome::Ok => "ok",
            CheckOutcome::Failed => "failed",
            CheckOutcome::Timeout => "timeout",
            CheckOutcome::BadStatus => "bad_status",
        }
    }
}

/// The live state of one backend. All counters only grow; `active` goes up
/// and down through [`ActiveGuard`].
#[derive(Debug)]
pub struct Live {
    active: AtomicU64,
    connections: AtomicU64,
    /// Bytes received from the backend (and sent on to clients).
    bytes_received: AtomicU64,
    /// Bytes sent to the backend (received from clients).
    bytes_sent: AtomicU64,
    connect_failures: [AtomicU64; 3],
    spills: [AtomicU64; Spill::ALL.len()],
    /// Requests answered (`mode: http`), by code class.
    requests: [AtomicU64; CodeClass::ALL.len()],
    /// Requests whose client went away before the response was complete.
    client_aborts: AtomicU64,
    /// Connections aborted (reset) by either side and passed on as a reset to
    /// the other, by the side that aborted.
    resets: [AtomicU64; Side::ALL.len()],
    /// Upstream connections open (`mode: http`: pooled and busy ones).
    upstream_connections: AtomicU64,
    /// Time to open a data-path connection (mode http: a fresh one).
    pub connect_time: Histogram,
    /// From connected to closed (`mode: tcp`).
    pub connection_duration: Histogram,
    /// Connections closed because neither side sent anything for
    /// `idle_timeout` (`mode: tcp`).
    idle_closes: AtomicU64,
    /// From sending a request to the response head (`mode: http`).
    pub time_to_first_byte: Histogram,
    /// From sending a request to the response's last byte (`mode: http`).
    pub request_duration: Histogram,
    up: AtomicBool,
    /// Consecutive data-path connect failures, for passive health.
    consecutive_failures: AtomicU32,
    /// Consecutive active-check results of one kind (rise and fall).
    checks_ok: AtomicU32,
    checks_failed: AtomicU32,
    /// Active checks by outcome, and up/down transitions, for the metrics.
    checks: [AtomicU64; CheckOutcome::ALL.len()],
    went_up: AtomicU64,
    went_down: AtomicU64,
    /// Fired when connections to this backend must close: it was removed and
    /// its `drain_timeout` passed. Replaced by a fresh one when the backend
    /// is put back, so connections made after that are not born closed.
    closing: std::sync::Mutex<CancellationToken>,
    /// Bumped when the backend leaves the table and when it comes back: a
    /// drain timer closes connections only if nothing happened since it
    /// started.
    removals: AtomicU64,
}

impl Default for Live {
    fn default() -> Self {
        Live {
            active: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            connect_failures: Default::default(),
            spills: Default::default(),
            requests: Default::default(),
            client_aborts: AtomicU64::new(0),
            resets: Default::default(),
            upstream_connections: AtomicU64::new(0),
            connect_time: Histogram::with_bounds(&FAST_BUCKETS),
            connection_duration: Histogram::default(),
            idle_closes: AtomicU64::new(0),
            time_to_first_byte: Histogram::default(),
            request_duration: Histogram::default(),
            // A backend starts up: traffic flows from the first moment, and
            // checks (or passive failures) take it out if it is dead.
            up: AtomicBool::new(true),
            consecutive_failures: AtomicU32::new(0),
            checks_ok: AtomicU32::new(0),
            checks_failed: AtomicU32::new(0),
            checks: Default::default(),
            went_up: AtomicU64::new(0),
            went_down: AtomicU64::new(0),
            closing: std::sync::Mutex::new(CancellationToken::new()),
            removals: AtomicU64::new(0),
        }
    }
}

impl Live {
    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn bytes_received(&self) -> u64 {
        self.bytes_received.load(Ordering::Relaxed)
    }

    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent.load(Ordering::Relaxed)
    }

    pub fn connect_failures(&self, why: ConnectFailure) -> u64 {
        self.connect_failures[why as usize].load(Ordering::Relaxed)
    }

    /// Traffic passed over this backend for `why`.
    pub fn spills(&self, why: Spill) -> u64 {
        self.spills[why as usize].load(Ordering::Relaxed)
    }

    /// Spills for any reason.
    pub fn spills_total(&self) -> u64 {
        Spill::ALL.iter().map(|&why| self.spills(why)).sum()
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Sets the health flag; returns the previous value. A change is counted
    /// as a transition.
    pub fn set_up(&self, up: bool) -> bool {
        if up {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        } else {
            // Coming back takes `rise` fresh successes.
            self.checks_ok.store(0, Ordering::Relaxed);
        }
        let was = self.up.swap(up, Ordering::Relaxed);
        match (was, up) {
            (false, true) => self.went_up.fetch_add(1, Ordering::Relaxed),
            (true, false) => self.went_down.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        was
    }

    /// Up/down transitions so far: (to up, to down).
    pub fn transitions(&self) -> (u64, u64) {
        (
            self.went_up.load(Ordering::Relaxed),
            self.went_down.load(Ordering::Relaxed),
        )
    }

    pub fn checks(&self, outcome: CheckOutcome) -> u64 {
        self.checks[outcome as usize].load(Ordering::Relaxed)
    }

    /// Records one active check. `rise` consecutive successes bring a down
    /// backend up, `fall` consecutive failures take an up one down. Returns
    /// the new state when it changed.
    pub fn record_check(&self, outcome: CheckOutcome, rise: u32, fall: u32) -> Option<bool> {
        self.checks[outcome as usize].fetch_add(1, Ordering::Relaxed);
        if outcome == CheckOutcome::Ok {
            self.checks_failed.store(0, Ordering::Relaxed);
            let streak = self
                .checks_ok
                .fetch_add(1, Ordering::Relaxed)
                .saturating_add(1);
            (streak >= rise && !self.set_up(true)).then_some(true)
        } else {
            self.checks_ok.store(0, Ordering::Relaxed);
            let streak = self
                .checks_failed
                .fetch_add(1, Ordering::Relaxed)
                .saturating_add(1);
            (streak >= fall && self.set_up(false)).then_some(false)
        }
    }

    /// Takes one active slot unconditionally.
    pub fn reserve(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::Relaxed);
        ActiveGuard {
            live: Arc::clone(self),
        }
    }

    /// Takes one active slot if fewer than `cap` are taken. The check and the
    /// increment are one atomic step, so concurrent accepts never push a
    /// backend past its bounded-load cap.
    pub fn try_reserve(self: &Arc<Self>, cap: u64) -> Option<ActiveGuard> {
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()
            .map(|_| ActiveGuard {
                live: Arc::clone(self),
            })
    }

    pub fn count_request(&self, class: CodeClass) {
        self.requests[class as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn requests(&self, class: CodeClass) -> u64 {
        self.requests[class as usize].load(Ordering::Relaxed)
    }

    pub fn count_client_abort(&self) {
        self.client_aborts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn client_aborts(&self) -> u64 {
        self.client_aborts.load(Ordering::Relaxed)
    }

    /// An upstream connection opened; it is counted until the guard drops.
    pub fn open_upstream(self: &Arc<Self>) -> UpstreamGuard {
        self.upstream_connections.fetch_add(1, Ordering::Relaxed);
        UpstreamGuard {
            live: Arc::clone(self),
        }
    }

    pub fn upstream_connections(&self) -> u64 {
        self.upstream_connections.load(Ordering::Relaxed)
    }

    pub fn count_spill(&self, why: Spill) {
        self.spills[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A data-path connect failed; returns the consecutive failure count.
    pub fn count_connect_failure(&self, why: ConnectFailure) -> u32 {
        self.connect_failures[why as usize].fetch_add(1, Ordering::Relaxed);
        self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A backend answered with a server error (passive health); returns the
    /// consecutive failure count.
    pub fn count_passive_failure(&self) -> u32 {
        self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A backend answered well: its failure streak is over.
    pub fn count_answer_ok(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
    }

    /// A data-path connect succeeded.
    pub fn count_connection(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
        self.consecutive_failures.store(0, Ordering::Relaxed);
    }

    pub fn add_bytes_sent(&self, n: u64) {
        self.bytes_sent.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_bytes_received(&self, n: u64) {
        self.bytes_received.fetch_add(n, Ordering::Relaxed);
    }

    /// A connection was closed for idling.
    pub fn count_idle_close(&self) {
        self.idle_closes.fetch_add(1, Ordering::Relaxed);
    }

    pub fn idle_closes(&self) -> u64 {
        self.idle_closes.load(Ordering::Relaxed)
    }

    /// A connection through this backend was aborted by `by`.
    pub fn count_reset(&self, by: Side) {
        self.resets[by as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn resets(&self, by: Side) -> u64 {
        self.resets[by as usize].load(Ordering::Relaxed)
    }

    /// Fires when connections to this backend must be closed.
    pub fn closing(&self) -> CancellationToken {
        self.closing_token().clone()
    }

    fn closing_token(&self) -> std::sync::MutexGuard<'_, CancellationToken> {
        // Poisoned only if a thread panicked holding it; the token is fine.
        self.closing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The backend left the table.
    pub fn removed(&self) {
        self.removals.fetch_add(1, Ordering::Relaxed);
    }

    /// How often the backend left or rejoined the table: a drain timer
    /// started now closes connections only if this is unchanged when it fires.
    pub fn removals(&self) -> u64 {
        self.removals.load(Ordering::Relaxed)
    }

    /// The backend is back in the table: pending drain timers are called off,
    /// and a token already fired is replaced for the connections to come.
    pub fn put_back(&self) {
        self.removals.fetch_add(1, Ordering::Relaxed);
        let mut token = self.closing_token();
        if token.is_cancelled() {
            *token = CancellationToken::new();
        }
    }

    /// The drain timer of `removal` fired: closes the backend's connections
    /// unless it was put back (or removed again) since.
    pub fn drain_timer_fired(&self, removal: u64) -> bool {
        let token = self.closing_token();
        if self.removals.load(Ordering::Relaxed) != removal {
            return false;
        }
        token.cancel();
        true
    }
}

/// Why a candidate was passed over (a spill to the next one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spill {
    /// Health marked it down.
    Down,
    /// It had reached its bounded-load cap.
    AtCap,
}

impl Spill {
    pub const ALL: [Spill; 2] = [Spill::Down, Spill::AtCap];

    pub fn as_str(self) -> &'static str {
        match self {
            Spill::Down => "down",
            Spill::AtCap => "at_cap",
        }
    }
}

/// One end of a proxied connection, for counting which one aborted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Backend,
}

impl Side {
    pub const ALL: [Side; 2] = [Side::Client, Side::Backend];

    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Backend => "backend",
        }
    }
}

/// One active connection (or connection attempt) to a backend; dropping it
/// gives the slot back.
#[derive(Debug)]
pub struct ActiveGuard {
    live: Arc<Live>,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.live.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One open upstream connection (`mode: http`); dropping it uncounts it.
#[derive(Debug)]
pub struct UpstreamGuard {
    live: Arc<Live>,
}

impl Drop for UpstreamGuard {
    fn drop(&mut self) {
        self.live
            .upstream_connections
            .fetch_sub(1, Ordering::Relaxed);
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
        assert_eq!(live.active(), 2);
        drop(a);
        assert_eq!(live.active(), 1);
        let _c = live.reserve();
        assert_eq!(live.active(), 2);
    }

    #[test]
    fn checks_rise_and_fall() {
        use CheckOutcome::{Failed, Ok, Timeout};
        let live = Live::default();
        assert!(live.is_up());
        assert_eq!(live.record_check(Failed, 2, 3), None);
        assert_eq!(live.record_check(Timeout, 2, 3), None);
        assert_eq!(live.record_check(Failed, 2, 3), Some(false));
        assert_eq!(live.record_check(Failed, 2, 3), None);
        assert_eq!(live.record_check(Ok, 2, 3), None);
        assert_eq!(live.record_check(Failed, 2, 3), None);
        assert_eq!(live.record_check(Ok, 2, 3), None);
        assert_eq!(live.record_check(Ok, 2, 3), Some(true));
        assert!(live.is_up());
        assert_eq!(live.record_check(Ok, 2, 3), None);
        assert_eq!(live.checks(Failed), 4);
        assert_eq!(live.transitions(), (1, 1));
    }

    #[test]
    fn passive_failures_count_until_success() {
        let live = Live::default();
        assert_eq!(live.count_connect_failure(ConnectFailure::Refused), 1);
        assert_eq!(live.count_connect_failure(ConnectFailure::Timeout), 2);
        live.count_connection();
        assert_eq!(live.count_connect_failure(ConnectFailure::Refused), 1);
        assert_eq!(live.connect_failures(ConnectFailure::Refused), 2);
        assert_eq!(live.connections(), 1);
    }
}
