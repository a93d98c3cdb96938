//! Hashes a backend served lately (groups, system heads): what its
//! engine's cache likely holds. A shared head is the last of its chain a
//! cache lets go (engines free a finished request's blocks tail first, and
//! every request that shares it touches it again), so it counts while it
//! was served lately, however much was computed since. A conversation's own
//! blocks are judged by what was computed since ([`pushed_out`]).
//!
//! Two rotating sets: the current one, and the one before it; every
//! [`RECENT_PERIOD`] the current set becomes the previous one and a new one
//! starts, so a hash counts for between one and two periods (2.5 to 5
//! minutes). Each set holds at most [`MAX_RECENT`] hashes (8 bytes each,
//! under 150 KiB per set with the table's own): past that, new hashes are
//! not added until the next rotation.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How long one set collects before it rotates.
pub(crate) const RECENT_PERIOD: Duration = Duration::from_secs(150);
/// The most hashes one set holds.
pub(crate) const MAX_RECENT: usize = 10_000;

/// Hashes served lately.
#[derive(Debug)]
pub(crate) struct Recent {
    sets: Mutex<Sets>,
}

#[derive(Debug)]
struct Sets {
    current: HashSet<u64>,
    previous: HashSet<u64>,
    /// When `current` started collecting.
    since: Instant,
}

impl Default for Recent {
    fn default() -> Self {
        Recent {
            sets: Mutex::new(Sets {
                current: HashSet::new(),
                previous: HashSet::new(),
                since: Instant::now(),
            }),
        }
    }
}

impl Sets {
    /// Rotates the sets for the time passed since `since`.
    fn rotate(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed < RECENT_PERIOD {
            return;
        }
        if elapsed >= 2 * RECENT_PERIOD {
            self.previous.clear();
            self.current.clear();
        } else {
            self.previous = std::mem::take(&mut self.current);
        }
        self.since = now;
    }
}

/// Whether a cache that keeps `room` tokens (when known) of what no
/// running request holds, evicting the least recently used, has pushed out
/// what was last used when its backend had computed `then` tokens, `now`
/// computed since it started: at least `room` computed since, and at
/// least one (with no room, what nothing came after is still there).
pub(crate) fn pushed_out(then: u64, now: u64, room: Option<u64>) -> bool {
    room.is_some_and(|room| now.saturating_sub(then) >= room.max(1))
}

impl Recent {
    /// `hash` was served.
    pub(crate) fn served(&self, hash: u64) {
        let mut sets = self.lock();
        if sets.current.len() < MAX_RECENT {
            sets.current.insert(hash);
        }
    }

    /// Whether `hash` was served in the current or the previous period.
    pub(crate) fn holds(&self, hash: u64) -> bool {
        let sets = self.lock();
        sets.current.contains(&hash) || sets.previous.contains(&hash)
    }

    /// Distinct hashes served in the current and the previous period.
    pub(crate) fn count(&self) -> usize {
        let sets = self.lock();
        let earlier = (sets.previous.iter())
            .filter(|h| !sets.current.contains(h))
            .count();
        sets.current.len() + earlier
    }

    /// The sets, rotated to now.
    fn lock(&self) -> std::sync::MutexGuard<'_, Sets> {
        let mut sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        sets.rotate(Instant::now());
        sets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn hashes_count_over_two_periods() {
        let recent = Recent::default();
        recent.served(1);
        recent.served(2);
        recent.served(1);
        assert_eq!(recent.count(), 2);
        assert!(recent.holds(2) && !recent.holds(3));
        tokio::time::advance(RECENT_PERIOD).await;
        recent.served(2);
        recent.served(3);
        // 1 from the previous period, 2 and 3 from this one.
        assert_eq!(recent.count(), 3);
        tokio::time::advance(RECENT_PERIOD).await;
        // 2 and 3 now from the previous period.
        assert_eq!(recent.count(), 2);
        assert!(recent.holds(3) && !recent.holds(1));
        tokio::time::advance(2 * RECENT_PERIOD).await;
        assert_eq!(recent.count(), 0);
    }

    #[test]
    fn a_set_is_bounded() {
        let recent = Recent::default();
        for h in 0..(MAX_RECENT as u64 + 50) {
            recent.served(h);
        }
        assert_eq!(recent.count(), MAX_RECENT);
    }

    #[test]
    fn a_cache_of_known_size_pushes_out_what_was_used_before_its_room_was_computed() {
        assert!(!pushed_out(1_000, 10_999, Some(10_000)));
        assert!(pushed_out(1_000, 11_000, Some(10_000)));
        // Its room unknown, nothing is judged pushed out.
        assert!(!pushed_out(1_000, 1_000_000, None));
        // A cache held whole by running requests: nothing computed since,
        // nothing pushed out; one token more, gone.
        assert!(!pushed_out(11_000, 11_000, Some(0)));
        assert!(pushed_out(11_000, 11_001, Some(0)));
    }
}
