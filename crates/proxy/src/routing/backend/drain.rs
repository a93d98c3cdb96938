//! A removed backend's drain: when its connections must close.
//!
//! A backend that leaves the table keeps its open connections; with
//! `drain_timeout` set, a timer (in `reload`) closes what is left when it
//! fires. Putting the backend back before then calls the timer off, so the
//! removal count tells a timer whether anything happened since it started.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio_util::sync::CancellationToken;

#[derive(Debug, Default)]
pub(crate) struct Drain {
    /// Fired when connections to this backend must close: it was removed and
    /// its `drain_timeout` passed. Replaced by a fresh one when the backend
    /// is put back, so connections made after that are not born closed.
    closing: Mutex<CancellationToken>,
    /// Bumped when the backend leaves the table and when it comes back: a
    /// drain timer closes connections only if nothing happened since it
    /// started.
    removals: AtomicU64,
}

impl Drain {
    /// Fires when connections to this backend must be closed.
    pub(crate) fn closing(&self) -> CancellationToken {
        self.token().clone()
    }

    fn token(&self) -> std::sync::MutexGuard<'_, CancellationToken> {
        // Poisoned only if a thread panicked holding it; the token is fine.
        self.closing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The backend left the table.
    pub(crate) fn removed(&self) {
        self.removals.fetch_add(1, Ordering::Relaxed);
    }

    /// How often the backend left or rejoined the table: a drain timer
    /// started now closes connections only if this is unchanged when it fires.
    pub(crate) fn removals(&self) -> u64 {
        self.removals.load(Ordering::Relaxed)
    }

    /// The backend is back in the table: pending drain timers are called off,
    /// and a token already fired is replaced for the connections to come.
    pub(crate) fn put_back(&self) {
        self.removals.fetch_add(1, Ordering::Relaxed);
        let mut token = self.token();
        if token.is_cancelled() {
            *token = CancellationToken::new();
        }
    }

    /// The drain timer of `removal` fired: closes the backend's connections
    /// unless it was put back (or removed again) since.
    pub(crate) fn timer_fired(&self, removal: u64) -> bool {
        let token = self.token();
        if self.removals.load(Ordering::Relaxed) != removal {
            return false;
        }
        token.cancel();
        true
    }
}
