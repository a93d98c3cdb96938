//! `key mod N`: the baseline the lab measures every other scheme against.
//!
//! The primary for key hash `k` over `n` numbered buckets is `k mod n`. Adding
//! one bucket moves about `n / (n+1)` of all keys, which is the whole reason
//! consistent hashing exists; magpie never routes traffic with it.
//!
//! Later candidates are the following buckets in numeric order, wrapping:
//! `k mod n, k mod n + 1, …`, so they are distinct and deterministic.

use super::{MAX_CANDIDATES, PlacementError, Scheme};

/// `key mod N` over `buckets` numbered buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModN {
    buckets: u32,
}

impl ModN {
    pub fn new(buckets: u32) -> Result<ModN, PlacementError> {
        if buckets == 0 {
            return Err(PlacementError::Empty);
        }
        Ok(ModN { buckets })
    }

    pub fn buckets(&self) -> u32 {
        self.buckets
    }
}

/// Candidates for one key: consecutive buckets from `key mod n`.
#[derive(Debug, Clone)]
pub struct ModNCandidates {
    next: u32,
    buckets: u32,
    left: usize,
}

impl Iterator for ModNCandidates {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let bucket = self.next;
        self.next = if bucket + 1 == self.buckets {
            0
        } else {
            bucket + 1
        };
        Some(bucket as usize)
    }
}

impl Scheme for ModN {
    type Candidates<'a> = ModNCandidates;

    fn candidates(&self, key: u64) -> ModNCandidates {
        ModNCandidates {
            next: (key % u64::from(self.buckets)) as u32,
            buckets: self.buckets,
            left: (self.buckets as usize).min(MAX_CANDIDATES),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::h64;

    #[test]
    fn candidates_wrap_and_stay_distinct() {
        let m = ModN::new(5).unwrap();
        assert_eq!(m.candidates(13).collect::<Vec<_>>(), [3, 4, 0, 1, 2]);
        let big = ModN::new(1000).unwrap();
        let c: Vec<usize> = big.candidates(999).collect();
        assert_eq!(c.len(), MAX_CANDIDATES);
        assert_eq!(&c[..3], [999, 0, 1]);
        assert_eq!(ModN::new(0), Err(PlacementError::Empty));
    }

    #[test]
    fn growing_moves_most_keys() {
        let (a, b) = (ModN::new(10).unwrap(), ModN::new(11).unwrap());
        let moved = (0..20_000u64)
            .map(|k| h64(&k.to_le_bytes()))
            .filter(|&k| a.primary(k) != b.primary(k))
            .count();
        let share = moved as f64 / 20_000.0;
        assert!((share - 10.0 / 11.0).abs() < 0.01, "{share}");
    }

    #[test]
    fn golden_keys() {
        let m = ModN::new(10).unwrap();
        let got: Vec<usize> = ["user:0", "user:1", "user:42", "user:99999", "session-abc"]
            .iter()
            .map(|k| m.primary(h64(k.as_bytes())).unwrap())
            .collect();
        // h64("user:0") = 0x2b6e5f8c3559ee21, and that mod 10 is 1.
        assert_eq!(got, GOLDEN);
    }
    const GOLDEN: [usize; 5] = [1, 8, 2, 8, 3];
}
