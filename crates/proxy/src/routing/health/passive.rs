//! Passive health: what the data paths see of a backend counts toward its
//! health, with no probe of its own.
//!
//! A failed connect counts against its backend (by reason), and with
//! `health.passive_failures` set, that many in a row mark it down; with
//! `health.passive_status` (mode http), a `502`/`503`/`504` answer counts the
//! same way. A connect that works, or a good answer, ends the streak. When
//! magpie itself is out of file descriptors or memory, no backend is to
//! blame: that is counted as resource exhaustion and leaves every backend's
//! health alone.

use std::io;

use tracing::warn;

use super::Target;
use super::state::ConnectFailure;
use crate::config::HealthConfig;
use crate::net::is_resource_exhaustion;
use crate::telemetry::stats::{Exhausted, Stats};
use crate::telemetry::throttle::Throttle;

/// Whose fault a failed connect was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blame {
    /// The backend's: the next candidate may do better.
    Backend,
    /// magpie's own (out of file descriptors, buffers or memory): every
    /// candidate would fail the same way, and no backend is to blame.
    Local,
}

/// Counts a failed data-path connect: against `target` (and, with passive
/// health on, marking it down after `passive_failures` in a row) unless
/// magpie itself ran out of resources, which is counted in `stats`, logged at
/// most once a second, and leaves every backend's health alone.
pub(crate) fn connect_failed(
    target: &impl Target,
    error: &io::Error,
    config: Option<&HealthConfig>,
    stats: &Stats,
) -> Blame {
    static EXHAUSTED_LOG: Throttle = Throttle::new(std::time::Duration::from_secs(1));
    if is_resource_exhaustion(error) {
        stats.count_exhausted(Exhausted::Connect);
        if let Some(held_back) = EXHAUSTED_LOG.allow() {
            warn!(backend = %target.name(), %error, held_back, "cannot open a connection: magpie is out of resources (raise the file descriptor limit or lower max_connections); not counted against the backend");
        }
        return Blame::Local;
    }
    let streak = target.health().connect_failed(ConnectFailure::of(error));
    warn!(backend = %target.name(), addr = %target.addr(), %error, "connect failed; trying the next candidate");
    if mark_down(target, streak, config) {
        warn!(backend = %target.name(), failures = streak, "marked down after consecutive connect failures");
    }
    Blame::Backend
}

/// Counts a `502`/`503`/`504` answer from `target` (`health.passive_status`)
/// towards passive health, like a failed connect.
pub(crate) fn answer_failed(target: &impl Target, status: u16, config: &HealthConfig) {
    let streak = target.health().failed();
    if mark_down(target, streak, Some(config)) {
        warn!(backend = %target.name(), status, failures = streak, "marked down after consecutive failed answers");
    }
}

/// A connect to `target` worked, or it answered well: its streak is over.
pub(crate) fn succeeded(target: &impl Target) {
    target.health().succeeded();
}

/// Marks `target` down when `streak` reached `passive_failures` (0: off);
/// whether this call took it down.
fn mark_down(target: &impl Target, streak: u32, config: Option<&HealthConfig>) -> bool {
    config.is_some_and(|h| h.passive_failures > 0 && streak >= h.passive_failures)
        && target.health().set_up(false)
}
