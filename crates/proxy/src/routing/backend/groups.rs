//! The groups a backend serves (`key.group`): how many distinct groups
//! reached it lately, and at which rank of their candidates its
//! conversations were placed.
//!
//! Distinct groups are counted in two rotating sets of group hashes: the
//! current one, and the one before it; every [`GROUPS_PERIOD`] the current
//! set becomes the previous one and a new one starts, so the count
//! ([`Groups::seen`]) covers between one and two periods (2.5 to 5
//! minutes). Each set holds at most [`MAX_GROUPS_TRACKED`] hashes (8 bytes
//! each, about 80 KiB per set): past that, new groups are not added and the
//! count stays at the bound until the next rotation.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::routing::keys::GroupKey;
use magpie_core::labels;

/// How long one set of group hashes collects before it rotates.
pub(crate) const GROUPS_PERIOD: Duration = Duration::from_secs(150);
/// The most group hashes one set holds.
pub(crate) const MAX_GROUPS_TRACKED: usize = 10_000;

labels! {
    /// Which of its group's candidates a conversation was first placed on.
    pub(crate) enum Rank {
        First => "1",
        Second => "2",
        Third => "3",
        Later => "4+",
    }
}

impl Rank {
    /// The rank of the candidate at `index` (0 is the group's primary).
    pub(crate) fn of_index(index: usize) -> Rank {
        match index {
            0 => Rank::First,
            1 => Rank::Second,
            2 => Rank::Third,
            _ => Rank::Later,
        }
    }
}

/// One backend's group counters.
#[derive(Debug)]
pub(crate) struct Groups {
    placements: [AtomicU64; Rank::COUNT],
    seen: Mutex<Seen>,
}

impl Default for Groups {
    fn default() -> Self {
        Groups {
            placements: Default::default(),
            seen: Mutex::new(Seen {
                current: HashSet::new(),
                previous: HashSet::new(),
                since: Instant::now(),
            }),
        }
    }
}

#[derive(Debug)]
struct Seen {
    current: HashSet<u64>,
    previous: HashSet<u64>,
    /// When `current` started collecting.
    since: Instant,
}

impl Seen {
    /// Rotates the sets for the time passed since `since`.
    fn rotate(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed < GROUPS_PERIOD {
            return;
        }
        if elapsed >= 2 * GROUPS_PERIOD {
            self.previous.clear();
            self.current.clear();
        } else {
            self.previous = std::mem::take(&mut self.current);
        }
        self.since = now;
    }
}

impl Groups {
    /// A conversation was first placed here by its group, at `rank`.
    pub(crate) fn count_placement(&self, rank: Rank) {
        self.placements[rank.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn placements(&self, rank: Rank) -> u64 {
        self.placements[rank.index()].load(Ordering::Relaxed)
    }

    /// A request of `group` was served here.
    pub(crate) fn served(&self, group: GroupKey) {
        let mut seen = self.lock();
        seen.rotate(Instant::now());
        if seen.current.len() < MAX_GROUPS_TRACKED {
            seen.current.insert(group.hash());
        }
    }

    /// Whether a request of `group` was served here in the current or the
    /// previous period.
    pub(crate) fn holds(&self, group: GroupKey) -> bool {
        let mut seen = self.lock();
        seen.rotate(Instant::now());
        let hash = group.hash();
        seen.current.contains(&hash) || seen.previous.contains(&hash)
    }

    /// Distinct groups served here in the current and the previous period.
    pub(crate) fn seen(&self) -> usize {
        let mut seen = self.lock();
        seen.rotate(Instant::now());
        let earlier = seen
            .previous
            .iter()
            .filter(|g| !seen.current.contains(g))
            .count();
        seen.current.len() + earlier
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn groups_are_counted_over_two_periods() {
        let groups = Groups::default();
        groups.served(GroupKey::new(1));
        groups.served(GroupKey::new(2));
        groups.served(GroupKey::new(1));
        assert_eq!(groups.seen(), 2);
        assert!(groups.holds(GroupKey::new(2)) && !groups.holds(GroupKey::new(3)));
        tokio::time::advance(GROUPS_PERIOD).await;
        groups.served(GroupKey::new(2));
        groups.served(GroupKey::new(3));
        // 1 from the previous period, 2 and 3 from this one.
        assert_eq!(groups.seen(), 3);
        tokio::time::advance(GROUPS_PERIOD).await;
        // 2 and 3 now from the previous period.
        assert_eq!(groups.seen(), 2);
        assert!(groups.holds(GroupKey::new(3)) && !groups.holds(GroupKey::new(1)));
        tokio::time::advance(2 * GROUPS_PERIOD).await;
        assert_eq!(groups.seen(), 0);
    }

    #[test]
    fn a_set_is_bounded() {
        let groups = Groups::default();
        for g in 0..(MAX_GROUPS_TRACKED as u64 + 50) {
            groups.served(GroupKey::new(g));
        }
        assert_eq!(groups.seen(), MAX_GROUPS_TRACKED);
    }

    #[test]
    fn ranks() {
        let ranks: Vec<&str> = (0..6).map(|i| Rank::of_index(i).as_str()).collect();
        assert_eq!(ranks, ["1", "2", "3", "4+", "4+", "4+"]);
        let groups = Groups::default();
        groups.count_placement(Rank::Second);
        assert_eq!(groups.placements(Rank::Second), 1);
        assert_eq!(groups.placements(Rank::First), 0);
    }
}
