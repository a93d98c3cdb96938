//! A backend's health: up or down, the streaks that move it, and the record
//! of how it moved.
//!
//! Two kinds of evidence write here. Active checks ([`super::active`]) record
//! each outcome: `rise` successes in a row bring a down backend up, `fall`
//! failures in a row take an up one down. The data paths ([`super::passive`])
//! record failed connects and failed answers: `passive_failures` in a row take
//! a backend down, and any success ends the streak. Everything is atomics, so
//! the data path reads `is_up` without a lock; the state lives in a backend's
//! live state and carries over a reload that keeps the backend.
//!
//! It also remembers when the backend last joined the pool, by coming up
//! or by being added in a reload: `placement.slow_start` counts from then.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use magpie_core::labels;

labels! {
    /// What one active health check found.
    pub(crate) enum CheckOutcome {
        Ok => "ok",
        /// The connect (or the HTTP exchange) failed.
        Failed => "failed",
        /// No answer within `health.timeout`.
        Timeout => "timeout",
        /// An HTTP check got a status outside `health.expect_status`.
        BadStatus => "bad_status",
        /// A datagram check got an answer that does not start with
        /// `health.datagram.expect`.
        BadAnswer => "bad_answer",
    }
}

labels! {
    /// Why a data-path connect to a backend failed.
    pub(crate) enum ConnectFailure {
        Refused => "refused",
        Timeout => "timeout",
        /// The TLS handshake with a `tls: true` backend failed (its
        /// certificate, a timeout, no TLS at all).
        Tls => "tls",
        /// Anything else: unreachable, reset, out of ports, ...
        Error => "error",
    }
}

impl ConnectFailure {
    pub(crate) fn of(error: &std::io::Error) -> Self {
        if crate::net::tls_client::is_handshake_failure(error) {
            return ConnectFailure::Tls;
        }
        match error.kind() {
            std::io::ErrorKind::ConnectionRefused => ConnectFailure::Refused,
            std::io::ErrorKind::TimedOut => ConnectFailure::Timeout,
            _ => ConnectFailure::Error,
        }
    }
}

/// One backend's health. Starts up: traffic flows from the first moment, and
/// checks (or passive failures) take a dead backend out.
#[derive(Debug)]
pub(crate) struct Health {
    up: AtomicBool,
    /// Consecutive data-path failures (connects, and with
    /// `passive_status` 502/503/504 answers).
    failure_streak: AtomicU32,
    /// Failed data-path connects, by reason.
    connect_failures: [AtomicU64; ConnectFailure::COUNT],
    /// Consecutive active-check results of one kind (rise and fall).
    checks_ok: AtomicU32,
    checks_failed: AtomicU32,
    /// Active checks by outcome.
    checks: [AtomicU64; CheckOutcome::COUNT],
    went_up: AtomicU64,
    went_down: AtomicU64,
    /// `joined` counts from here.
    epoch: Instant,
    /// Nanoseconds from `epoch` to when it last came up or was added, plus
    /// one; 0: in the pool since magpie started.
    joined: AtomicU64,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            up: AtomicBool::new(true),
            failure_streak: AtomicU32::new(0),
            connect_failures: Default::default(),
            checks_ok: AtomicU32::new(0),
            checks_failed: AtomicU32::new(0),
            checks: Default::default(),
            went_up: AtomicU64::new(0),
            went_down: AtomicU64::new(0),
            epoch: Instant::now(),
            joined: AtomicU64::new(0),
        }
    }
}

impl Health {
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Sets the flag; returns the previous value. A change is counted as a
    /// transition. Going up ends the failure streak; going down means coming
    /// back takes `rise` fresh successes.
    pub(crate) fn set_up(&self, up: bool) -> bool {
        if up {
            self.failure_streak.store(0, Ordering::Relaxed);
        } else {
            self.checks_ok.store(0, Ordering::Relaxed);
        }
        let was = self.up.swap(up, Ordering::Relaxed);
        if !was && up {
            self.joined_at(Instant::now());
        }
        match (was, up) {
            (false, true) => self.went_up.fetch_add(1, Ordering::Relaxed),
            (true, false) => self.went_down.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        was
    }

    /// It joined the pool at `now`: came up, or was added by a reload.
    pub(crate) fn joined_at(&self, now: Instant) {
        let since = now.saturating_duration_since(self.epoch).as_nanos();
        let since = u64::try_from(since).unwrap_or(u64::MAX - 1);
        self.joined.store(since + 1, Ordering::Relaxed);
    }

    /// How long ago it last joined the pool; `None`: it has been in it since
    /// magpie started.
    pub(crate) fn since_joined(&self, now: Instant) -> Option<Duration> {
        let joined = self.joined.load(Ordering::Relaxed).checked_sub(1)?;
        let at = self.epoch + Duration::from_nanos(joined);
        Some(now.saturating_duration_since(at))
    }

    /// Up/down transitions so far: (to up, to down).
    pub(crate) fn transitions(&self) -> (u64, u64) {
        (
            self.went_up.load(Ordering::Relaxed),
            self.went_down.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn checks(&self, outcome: CheckOutcome) -> u64 {
        self.checks[outcome.index()].load(Ordering::Relaxed)
    }

    /// Records one active check. `rise` consecutive successes bring a down
    /// backend up, `fall` consecutive failures take an up one down. Returns
    /// the new state when it changed.
    pub(crate) fn record_check(&self, outcome: CheckOutcome, rise: u32, fall: u32) -> Option<bool> {
        self.checks[outcome.index()].fetch_add(1, Ordering::Relaxed);
        let (streak, other) = if outcome == CheckOutcome::Ok {
            (&self.checks_ok, &self.checks_failed)
        } else {
            (&self.checks_failed, &self.checks_ok)
        };
        other.store(0, Ordering::Relaxed);
        let streak = streak.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if outcome == CheckOutcome::Ok {
            (streak >= rise && !self.set_up(true)).then_some(true)
        } else {
            (streak >= fall && self.set_up(false)).then_some(false)
        }
    }

    pub(crate) fn connect_failures(&self, why: ConnectFailure) -> u64 {
        self.connect_failures[why.index()].load(Ordering::Relaxed)
    }

    /// A data-path connect failed; returns the failure streak.
    pub(crate) fn connect_failed(&self, why: ConnectFailure) -> u32 {
        self.connect_failures[why.index()].fetch_add(1, Ordering::Relaxed);
        self.failed()
    }

    /// A data-path failure (a failed connect or a failed answer); returns the
    /// failure streak.
    pub(crate) fn failed(&self) -> u32 {
        self.failure_streak
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1)
    }

    /// A connect succeeded, or the backend answered well: the failure streak
    /// is over.
    pub(crate) fn succeeded(&self) {
        // A load first: the data path calls this on every success, and a
        // store to a line other cores read costs more than a read.
        if self.failure_streak.load(Ordering::Relaxed) != 0 {
            self.failure_streak.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_rise_and_fall() {
        use CheckOutcome::{Failed, Ok, Timeout};
        let health = Health::default();
        assert!(health.is_up());
        assert_eq!(health.record_check(Failed, 2, 3), None);
        assert_eq!(health.record_check(Timeout, 2, 3), None);
        assert_eq!(health.record_check(Failed, 2, 3), Some(false));
        assert_eq!(health.record_check(Failed, 2, 3), None);
        assert_eq!(health.record_check(Ok, 2, 3), None);
        assert_eq!(health.record_check(Failed, 2, 3), None);
        assert_eq!(health.record_check(Ok, 2, 3), None);
        assert_eq!(health.record_check(Ok, 2, 3), Some(true));
        assert!(health.is_up());
        assert_eq!(health.record_check(Ok, 2, 3), None);
        assert_eq!(health.checks(Failed), 4);
        assert_eq!(health.transitions(), (1, 1));
    }

    #[test]
    fn passive_failures_count_until_success() {
        let health = Health::default();
        assert_eq!(health.connect_failed(ConnectFailure::Refused), 1);
        assert_eq!(health.connect_failed(ConnectFailure::Timeout), 2);
        health.succeeded();
        assert_eq!(health.connect_failed(ConnectFailure::Refused), 1);
        assert_eq!(health.failed(), 2);
        assert_eq!(health.connect_failures(ConnectFailure::Refused), 2);
        assert_eq!(health.connect_failures(ConnectFailure::Timeout), 1);
    }
}
