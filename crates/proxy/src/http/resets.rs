//! HTTP/2 streams a client resets after magpie dispatched them, and the
//! budget past which its connection gets GOAWAY (`limits.h2_resets_per_second`).
//!
//! hyper already bounds streams reset *before* they are dispatched (the
//! rapid-reset flood). A client can still open a stream, let magpie pick a
//! backend and send the request there, and reset it at once, over and over:
//! every such stream costs a backend request for nothing. Each request's
//! service future carries a [`Dispatched`] guard; dropped before the
//! response was ready on an HTTP/2 connection, it counts one reset
//! (`magpie_http2_client_resets_total`), and a connection that passes its
//! budget within one second is told to go away
//! (`magpie_http2_reset_goaways_total`): the streams it has open finish,
//! new ones are refused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::client_deadlines::Clock;
use crate::routing::instance::Instance;
use crate::telemetry::stats::Stats;

/// One connection's resets in the current one-second window.
#[derive(Debug)]
pub(crate) struct Resets {
    budget: u64,
    /// When the window began, and the resets in it. Only a reset takes
    /// the lock, never a request that completes.
    window: Mutex<(Instant, u64)>,
    over: AtomicBool,
    notify: Notify,
}

impl Resets {
    pub(crate) fn new(budget: u64) -> Arc<Resets> {
        Arc::new(Resets {
            budget,
            window: Mutex::new((Instant::now(), 0)),
            over: AtomicBool::new(false),
            notify: Notify::new(),
        })
    }

    /// One stream was reset after dispatch; `true` when this one passed
    /// the budget.
    fn reset(&self) -> bool {
        let now = Instant::now();
        let count = {
            let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
            if now.duration_since(window.0) >= Duration::from_secs(1) {
                *window = (now, 0);
            }
            window.1 += 1;
            window.1
        };
        if count > self.budget && !self.over.swap(true, Ordering::Relaxed) {
            self.notify.notify_one();
            return true;
        }
        false
    }

    /// Resolves once the connection has passed its budget.
    pub(crate) async fn exceeded(&self) {
        loop {
            let notified = self.notify.notified();
            if self.over.load(Ordering::Relaxed) {
                return;
            }
            notified.await;
        }
    }
}

/// Rides along with one request's service future.
pub(crate) struct Dispatched {
    resets: Arc<Resets>,
    clock: Arc<Clock>,
    instance: Arc<Instance>,
    done: bool,
}

impl Dispatched {
    pub(crate) fn new(
        resets: &Arc<Resets>,
        clock: &Arc<Clock>,
        instance: &Arc<Instance>,
    ) -> Dispatched {
        Dispatched {
            resets: Arc::clone(resets),
            clock: Arc::clone(clock),
            instance: Arc::clone(instance),
            done: false,
        }
    }

    /// The response is ready: no reset.
    pub(crate) fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Dispatched {
    fn drop(&mut self) {
        if self.done || !self.clock.is_h2() {
            return;
        }
        let stats: &Stats = &self.instance.stats;
        stats.count_h2_reset();
        if self.resets.reset() {
            stats.count_h2_reset_goaway();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_per_second_and_passing_it_is_told_once() {
        let r = Resets::new(3);
        assert!(!r.reset() && !r.reset() && !r.reset());
        assert!(r.reset(), "the fourth in a second passes a budget of 3");
        assert!(!r.reset(), "told once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_second_starts_a_new_count() {
        let r = Resets::new(2);
        assert!(!r.reset() && !r.reset());
        tokio::time::advance(std::time::Duration::from_millis(1000)).await;
        assert!(!r.reset() && !r.reset());
        assert!(r.reset());
        tokio::time::timeout(std::time::Duration::from_secs(1), r.exceeded())
            .await
            .expect("exceeded resolves");
    }
}
