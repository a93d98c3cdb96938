//! What the queue counts: requests admitted by how, refused by why, both
//! by class; how long the admitted ones waited; the body bytes waiting
//! requests hold. Relaxed atomics, read at scrape time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use magpie_core::labels;

use crate::config::MAX_CLASSES;
use crate::telemetry::stats::Histogram;

labels! {
    /// How a request was admitted.
    pub(crate) enum Admit {
        /// Its home (or, for a new conversation, a target) had room.
        AtOnce => "at_once",
        /// It waited, and its home took it.
        Waited => "waited",
        /// Another of its targets took it: its home had no room (for a
        /// request with a home, within `queue.affinity_wait`).
        Spilled => "spilled",
        /// A conversation's first request: the target where it cost least
        /// took it, not its table owner.
        Placed => "placed",
    }
}

labels! {
    /// Why a request left the queue without a backend.
    pub(crate) enum Refusal {
        /// `queue.size` requests (or `queue.max_body_bytes`) were waiting
        /// already: `429`.
        Full => "full",
        /// Its tenant had `queue.tenant.max_queued` waiting already: `429`.
        TenantFull => "tenant_full",
        /// It waited `queue.timeout`: `503`.
        TimedOut => "timeout",
        /// The client went away while it waited.
        ClientGone => "client_gone",
    }
}

/// The queue's counters.
#[derive(Debug)]
pub(crate) struct QueueStats {
    admitted: [[AtomicU64; Admit::COUNT]; MAX_CLASSES],
    refused: [[AtomicU64; Refusal::COUNT]; MAX_CLASSES],
    /// How long the requests that waited waited (not those admitted at once).
    pub(crate) wait: Histogram,
    bytes: AtomicU64,
}

impl Default for QueueStats {
    fn default() -> Self {
        QueueStats {
            admitted: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            refused: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            wait: Histogram::default(),
            bytes: AtomicU64::new(0),
        }
    }
}

impl QueueStats {
    pub(super) fn admitted(&self, class: usize, how: Admit, waited: Duration) {
        let class = class.min(MAX_CLASSES - 1);
        self.admitted[class][how.index()].fetch_add(1, Ordering::Relaxed);
        if how != Admit::AtOnce || !waited.is_zero() {
            self.wait.observe(waited);
        }
    }

    pub(super) fn refused(&self, class: usize, why: Refusal) {
        let class = class.min(MAX_CLASSES - 1);
        self.refused[class][why.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// A waiting request's body bytes, held (`true`) or let go.
    pub(super) fn hold_bytes(&self, n: u64, held: bool) {
        if held {
            self.bytes.fetch_add(n, Ordering::Relaxed);
        } else {
            self.bytes.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Body bytes the waiting requests hold.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Requests of `class` admitted so.
    pub(crate) fn admitted_count(&self, class: usize, how: Admit) -> u64 {
        self.admitted
            .get(class)
            .map_or(0, |c| c[how.index()].load(Ordering::Relaxed))
    }

    /// Requests of `class` refused so.
    pub(crate) fn refused_count(&self, class: usize, why: Refusal) -> u64 {
        self.refused
            .get(class)
            .map_or(0, |c| c[why.index()].load(Ordering::Relaxed))
    }
}
