//! The bytes every request together holds while its key is looked for in
//! its body (`limits.key_buffer_bytes`).
//!
//! Each request reading a body for its key takes bytes from one budget as
//! they arrive ([`Held::grow`]); a request that would go over it stops
//! reading at once and is routed by its fallback key (`buffer_budget`), its
//! body streamed on untouched. What a request took is given back when the
//! bytes it read have been handed to the backend's connection (the
//! [`Held`] guard travels with them in the request body mode http sends
//! on), or when the request is dropped. The total is a gauge
//! (`magpie_key_buffer_bytes`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The bytes held for keys across all requests.
#[derive(Debug, Default)]
pub(crate) struct KeyBudget {
    held: AtomicU64,
}

impl KeyBudget {
    /// Bytes held now.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// A request's share, empty for now.
    pub(crate) fn share(self: &Arc<Self>, max: u64) -> Held {
        Held {
            budget: Arc::clone(self),
            bytes: 0,
            max,
        }
    }
}

/// One request's bytes of the budget; given back when dropped.
#[derive(Debug)]
pub(crate) struct Held {
    budget: Arc<KeyBudget>,
    bytes: u64,
    max: u64,
}

impl Held {
    /// Takes `n` more bytes if the budget's total stays within its maximum.
    pub(crate) fn grow(&mut self, n: usize) -> bool {
        let n = n as u64;
        let max = self.max;
        let taken = self
            .budget
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(n).filter(|&total| total <= max)
            });
        if taken.is_ok() {
            self.bytes += n;
        }
        taken.is_ok()
    }

    #[cfg(test)]
    /// Bytes this request holds.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_take_from_one_budget_and_give_back_on_drop() {
        let budget = Arc::new(KeyBudget::default());
        let mut a = budget.share(100);
        let mut b = budget.share(100);
        assert!(a.grow(60));
        assert!(!b.grow(41));
        assert!(b.grow(40));
        assert_eq!((budget.held(), a.bytes(), b.bytes()), (100, 60, 40));
        assert!(!a.grow(1));
        drop(a);
        assert_eq!(budget.held(), 40);
        assert!(b.grow(60));
        drop(b);
        assert_eq!(budget.held(), 0);
    }
}
