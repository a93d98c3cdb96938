//! The groups a backend serves (`key.group`): which groups reached it
//! lately ([`super::recent`]: 2.5 to 5 minutes), and at which rank of
//! their candidates its conversations were placed.

use std::sync::atomic::{AtomicU64, Ordering};

use super::recent::Recent;
use crate::routing::keys::GroupKey;
use magpie_core::labels;

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
#[derive(Debug, Default)]
pub(crate) struct Groups {
    placements: [AtomicU64; Rank::COUNT],
    seen: Recent,
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
        self.seen.served(group.hash());
    }

    /// Whether `group` was served here lately: its head is likely still
    /// cached ([`Recent::holds`]).
    pub(crate) fn holds(&self, group: GroupKey) -> bool {
        self.seen.holds(group.hash())
    }

    /// Distinct groups served here in the current and the previous period.
    pub(crate) fn seen(&self) -> usize {
        self.seen.count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
