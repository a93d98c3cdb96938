//! The distinct-candidate walk shared by Maglev and the ring.
//!
//! Both tables are a circular list of owners (Maglev: one per slot; ring: one
//! per point). A key's candidates are the owner at its position, then each
//! new owner met walking on, wrapping at the end: distinct, primary first, at
//! most [`MAX_CANDIDATES`], never more than one lap, and the walk stops as soon
//! as it has met every node that owns anything. No allocation: duplicates are
//! caught by the inline `Seen` set.

use super::{MAX_CANDIDATES, Seen};

/// An entry of a circular table that names its owner.
pub trait Owned: Copy {
    /// The node index that owns this entry.
    fn owner(self) -> u32;
}

/// A Maglev slot is its owner.
impl Owned for u32 {
    #[inline]
    fn owner(self) -> u32 {
        self
    }
}

/// A ring point: (hash, owner).
impl Owned for (u64, u32) {
    #[inline]
    fn owner(self) -> u32 {
        self.1
    }
}

/// The distinct owners met walking `entries` from a start position.
#[derive(Debug, Clone)]
pub struct Walk<'a, T> {
    entries: &'a [T],
    pos: usize,
    walked: usize,
    limit: usize,
    seen: Seen,
}

impl<'a, T: Owned> Walk<'a, T> {
    /// A walk from `start`, ending after `owners` distinct owners (capped at
    /// [`MAX_CANDIDATES`]) or one lap.
    pub(crate) fn new(entries: &'a [T], start: usize, owners: usize) -> Self {
        Walk {
            entries,
            pos: start,
            walked: 0,
            limit: owners.min(MAX_CANDIDATES),
            seen: Seen::new(),
        }
    }
}

impl<T: Owned> Iterator for Walk<'_, T> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.seen.len() < self.limit && self.walked < self.entries.len() {
            let owner = self.entries[self.pos].owner();
            self.pos += 1;
            if self.pos == self.entries.len() {
                self.pos = 0;
            }
            self.walked += 1;
            if self.seen.insert(owner) {
                return Some(owner as usize);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_wrap_and_stay_distinct() {
        let table: [u32; 6] = [0, 0, 1, 0, 2, 1];
        let got: Vec<usize> = Walk::new(&table, 3, 3).collect();
        assert_eq!(got, [0, 2, 1]);
        // Stops after the owners it was told about, even mid-lap.
        let got: Vec<usize> = Walk::new(&table, 4, 2).collect();
        assert_eq!(got, [2, 1]);
        let points = [(10u64, 1u32), (20, 1), (30, 0)];
        let got: Vec<usize> = Walk::new(&points, 2, 2).collect();
        assert_eq!(got, [0, 1]);
    }
}
