//! Hashes a backend served lately (groups, heads), each with the backend's
//! computed tokens when it was last served ([`super::load::Load::computed`]),
//! which tells whether what it names is likely still in the engine's cache.
//!
//! Two rotating maps: the current one, and the one before it; every
//! [`RECENT_PERIOD`] the current map becomes the previous one and a new one
//! starts, so a hash counts for between one and two periods (2.5 to 5
//! minutes). Each map holds at most [`MAX_RECENT`] hashes (16 bytes each,
//! about 160 KiB per map): past that, new hashes are not added until the
//! next rotation.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How long one map collects before it rotates.
pub(crate) const RECENT_PERIOD: Duration = Duration::from_secs(150);
/// The most hashes one map holds.
pub(crate) const MAX_RECENT: usize = 10_000;

/// Hashes served lately, with when (in computed tokens).
#[derive(Debug)]
pub(crate) struct Recent {
    maps: Mutex<Maps>,
}

#[derive(Debug)]
struct Maps {
    /// Hash to the backend's computed tokens when it was last served.
    current: HashMap<u64, u64>,
    previous: HashMap<u64, u64>,
    /// When `current` started collecting.
    since: Instant,
}

impl Default for Recent {
    fn default() -> Self {
        Recent {
            maps: Mutex::new(Maps {
                current: HashMap::new(),
                previous: HashMap::new(),
                since: Instant::now(),
            }),
        }
    }
}

impl Maps {
    /// Rotates the maps for the time passed since `since`.
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
    /// `hash` was served, when the backend had computed `computed` tokens.
    pub(crate) fn served(&self, hash: u64, computed: u64) {
        let mut maps = self.lock();
        let full = maps.current.len() >= MAX_RECENT;
        if let Some(at) = maps.current.get_mut(&hash) {
            *at = computed;
        } else if !full {
            maps.current.insert(hash, computed);
        }
    }

    /// Whether `hash` was served in the current or the previous period
    /// and, with the cache's room in tokens known (`room`), a cache that
    /// evicts the least recently used has not pushed it out yet
    /// ([`pushed_out`]; `computed` now).
    pub(crate) fn holds(&self, hash: u64, computed: u64, room: Option<u64>) -> bool {
        let maps = self.lock();
        let at = maps.current.get(&hash).or_else(|| maps.previous.get(&hash));
        at.is_some_and(|&at| !pushed_out(at, computed, room))
    }

    /// Distinct hashes served in the current and the previous period.
    pub(crate) fn count(&self) -> usize {
        let maps = self.lock();
        let earlier = (maps.previous.keys())
            .filter(|h| !maps.current.contains_key(h))
            .count();
        maps.current.len() + earlier
    }

    /// The maps, rotated to now.
    fn lock(&self) -> std::sync::MutexGuard<'_, Maps> {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        maps.rotate(Instant::now());
        maps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn hashes_count_over_two_periods() {
        let recent = Recent::default();
        recent.served(1, 0);
        recent.served(2, 0);
        recent.served(1, 0);
        assert_eq!(recent.count(), 2);
        assert!(recent.holds(2, 0, None) && !recent.holds(3, 0, None));
        tokio::time::advance(RECENT_PERIOD).await;
        recent.served(2, 0);
        recent.served(3, 0);
        // 1 from the previous period, 2 and 3 from this one.
        assert_eq!(recent.count(), 3);
        tokio::time::advance(RECENT_PERIOD).await;
        // 2 and 3 now from the previous period.
        assert_eq!(recent.count(), 2);
        assert!(recent.holds(3, 0, None) && !recent.holds(1, 0, None));
        tokio::time::advance(2 * RECENT_PERIOD).await;
        assert_eq!(recent.count(), 0);
    }

    #[test]
    fn a_map_is_bounded() {
        let recent = Recent::default();
        for h in 0..(MAX_RECENT as u64 + 50) {
            recent.served(h, 0);
        }
        assert_eq!(recent.count(), MAX_RECENT);
    }

    #[test]
    fn a_cache_of_known_size_pushes_out_what_was_served_before_it_filled() {
        let recent = Recent::default();
        recent.served(7, 1_000);
        assert!(recent.holds(7, 10_999, Some(10_000)));
        assert!(!recent.holds(7, 11_000, Some(10_000)));
        assert!(recent.holds(7, 11_000, None));
        recent.served(7, 11_000);
        assert!(recent.holds(7, 11_000, Some(10_000)));
        // A cache held whole by running requests: nothing computed since,
        // nothing pushed out; one token more, gone.
        assert!(recent.holds(7, 11_000, Some(0)));
        assert!(!recent.holds(7, 11_001, Some(0)));
    }
}
