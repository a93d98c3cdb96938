//! Active health checks: a TCP connect to every backend, every `interval`
//! (plus up to 10% jitter, so a fleet does not probe in step), with
//! `timeout`, `rise` and `fall`.
//!
//! Health marks backends up or down in their live state; it never rebuilds the
//! table. A lookup skips down backends, so a flapping backend never moves the
//! keys of healthy ones, and every instance with the same config still routes
//! a key the same way. Down backends keep being probed, so they come back
//! without needing traffic. Backends start *up*: traffic flows from the first
//! moment, and a dead backend is taken out after `fall` failed checks (or
//! sooner, after `passive_failures` failed connects on the data path).
//!
//! Checks run only when the config has a `health` section; the loop follows
//! reloads, so adding or removing the section takes effect without a restart.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backend::Backend;
use crate::snapshot::Shared;

/// How often to look again for a `health` section when there is none.
const IDLE_RECHECK: Duration = Duration::from_secs(1);

/// Probes the current snapshot's backends until `shutdown`.
pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut jitter = Jitter::new();
    loop {
        let snapshot = shared.snapshot.load_full();
        let wait = match snapshot.config.health.clone() {
            None => IDLE_RECHECK,
            Some(health) => {
                let started = Instant::now();
                let mut probes = JoinSet::new();
                for backend in snapshot.backends.iter().cloned() {
                    let timeout = health.timeout;
                    probes.spawn(async move {
                        let ok = probe(&backend, timeout).await;
                        (backend, ok)
                    });
                }
                drop(snapshot);
                while let Some(done) = probes.join_next().await {
                    let Ok((backend, ok)) = done else { continue };
                    match backend.live.record_check(ok, health.rise, health.fall) {
                        Some(true) => info!(backend = %backend.name, "backend is up"),
                        Some(false) => {
                            warn!(backend = %backend.name, addr = %backend.addr, "backend is down: {} failed checks", health.fall)
                        }
                        None => {}
                    }
                }
                (health.interval + jitter.up_to(health.interval / 10))
                    .saturating_sub(started.elapsed())
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One check: can we open a TCP connection within `timeout`?
pub async fn probe(backend: &Backend, timeout: Duration) -> bool {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(backend.addr)).await {
        Ok(Ok(_stream)) => true,
        Ok(Err(e)) => {
            tracing::debug!(backend = %backend.name, error = %e, "health check failed");
            false
        }
        Err(_) => {
            tracing::debug!(backend = %backend.name, "health check timed out");
            false
        }
    }
}

/// A tiny xorshift for jitter; seeded from the clock, no crate needed.
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        Jitter(seed | 1)
    }

    fn up_to(&mut self, max: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let nanos = max.as_nanos() as u64;
        if nanos == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos(self.0 % nanos)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range() {
        let mut j = Jitter::new();
        for _ in 0..1000 {
            assert!(j.up_to(Duration::from_millis(200)) < Duration::from_millis(200));
        }
        assert_eq!(j.up_to(Duration::ZERO), Duration::ZERO);
    }
}
