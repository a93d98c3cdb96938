//! Rate-limited log lines: a condition a peer or the machine can repeat
//! thousands of times a second (running out of file descriptors, refused
//! PROXY headers) is logged at most once per interval, with the number of
//! lines held back since the last one. Counters still count every case.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One log line's budget: at most one per `interval`. Lives in a `static`
/// at the line's call site.
#[derive(Debug)]
pub(crate) struct Throttle {
    interval_ms: u64,
    /// Milliseconds since [`epoch`] before which nothing is logged.
    next_ms: AtomicU64,
    held_back: AtomicU64,
}

/// The clock every throttle reads: milliseconds since the first use.
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Throttle {
    pub(crate) const fn new(interval: Duration) -> Throttle {
        Throttle {
            interval_ms: interval.as_millis() as u64,
            next_ms: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last line)` when a line may be logged now;
    /// `None` (and one more held back) when not.
    pub(crate) fn allow(&self) -> Option<u64> {
        let now = now_ms();
        let next = self.next_ms.load(Ordering::Relaxed);
        if now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now + self.interval_ms,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.held_back.swap(0, Ordering::Relaxed));
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_the_rest_are_counted() {
        let t = Throttle::new(Duration::from_secs(3600));
        assert_eq!(t.allow(), Some(0));
        for _ in 0..5 {
            assert_eq!(t.allow(), None);
        }
        // Open the window again as if the interval had passed.
        t.next_ms.store(0, Ordering::Relaxed);
        assert_eq!(t.allow(), Some(5));
    }
}
