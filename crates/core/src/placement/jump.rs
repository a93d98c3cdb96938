//! Jump consistent hash (Lamping and Veach, 2014) over numbered buckets.
//!
//! Jump maps a key to one of `n` buckets `0 … n−1` with no table at all and
//! moves only `1/(n+1)` of the keys when bucket `n` is added. It knows numbers,
//! not names: removing any bucket but the last renumbers the rest, which is why
//! the proxy does not use it and the lab shows what that costs.
//!
//! The primary is [`jump`]`(k, n)`, exactly the paper's algorithm (the 64-bit
//! LCG `k = k · 2862933555777941757 + 1` and
//! `j = floor((b + 1) · 2^31 / ((k >> 33) + 1))` in double precision).
//!
//! Later candidates are distinct and deterministic: candidate `i ≥ 1` is
//! `jump(mix64(k + i · 0x9E3779B97F4A7C15), n − i)`, read as a rank among the
//! buckets not chosen yet (in ascending order). So candidate `i` is drawn
//! uniformly from the buckets that are left, each step costs one jump plus a
//! scan of at most [`MAX_CANDIDATES`] chosen buckets, and no step retries.

use super::rendezvous::mix64;
use super::{MAX_CANDIDATES, PlacementError, Scheme};

/// Lamping and Veach's jump consistent hash: the bucket in `0 … buckets−1` for
/// `key`. `buckets` must be at least 1.
#[inline]
pub fn jump(mut key: u64, buckets: u32) -> u32 {
    let n = i64::from(buckets);
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < n {
        b = j;
        key = key.wrapping_mul(2862933555777941757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// Jump over `buckets` numbered buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Jump {
    buckets: u32,
}

impl Jump {
    pub fn new(buckets: u32) -> Result<Jump, PlacementError> {
        if buckets == 0 {
            return Err(PlacementError::Empty);
        }
        Ok(Jump { buckets })
    }

    pub fn buckets(&self) -> u32 {
        self.buckets
    }
}

/// Candidates for one key; `chosen[..len]` is kept sorted ascending.
#[derive(Debug, Clone)]
pub struct JumpCandidates {
    key: u64,
    buckets: u32,
    chosen: [u32; MAX_CANDIDATES],
    len: usize,
    limit: usize,
}

impl Iterator for JumpCandidates {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.len >= self.limit {
            return None;
        }
        let round = self.len as u64;
        let key = if round == 0 {
            self.key
        } else {
            mix64(
                self.key
                    .wrapping_add(round.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            )
        };
        // A rank among the buckets left, turned into a bucket number by
        // stepping over every already-chosen bucket at or below it.
        let mut bucket = jump(key, self.buckets - self.len as u32);
        let mut at = self.len;
        for (pos, &c) in self.chosen[..self.len].iter().enumerate() {
            if c <= bucket {
                bucket += 1;
            } else {
                at = pos;
                break;
            }
        }
        self.chosen.copy_within(at..self.len, at + 1);
        self.chosen[at] = bucket;
        self.len += 1;
        Some(bucket as usize)
    }
}

impl Scheme for Jump {
    type Candidates<'a> = JumpCandidates;

    fn candidates(&self, key: u64) -> JumpCandidates {
        JumpCandidates {
            key,
            buckets: self.buckets,
            chosen: [0; MAX_CANDIDATES],
            len: 0,
            limit: (self.buckets as usize).min(MAX_CANDIDATES),
        }
    }

    #[inline]
    fn primary(&self, key: u64) -> Option<usize> {
        Some(jump(key, self.buckets) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::h64;

    #[test]
    fn matches_the_reference_algorithm() {
        // Values from an independent Python transcription of the paper's code.
        assert_eq!(jump(0, 1), 0);
        assert_eq!(jump(1, 1), 0);
        assert_eq!(jump(0xDEAD10CC, 1 << 16), 6591);
        assert_eq!(jump(0, 100), 0);
        assert_eq!(jump(u64::MAX, 100), 92);
    }

    #[test]
    fn growing_moves_keys_only_to_the_new_bucket() {
        let mut moved = 0;
        for k in 0..20_000u64 {
            let key = h64(&k.to_le_bytes());
            let (a, b) = (jump(key, 10), jump(key, 11));
            if a != b {
                assert_eq!(b, 10);
                moved += 1;
            }
        }
        let share = f64::from(moved) / 20_000.0;
        assert!((share - 1.0 / 11.0).abs() < 0.01, "{share}");
    }

    #[test]
    fn candidates_are_distinct_bounded_and_deterministic() {
        for n in [1u32, 2, 10, 100] {
            let j = Jump::new(n).unwrap();
            for k in 0..200u64 {
                let key = h64(&k.to_le_bytes());
                let c: Vec<usize> = j.candidates(key).collect();
                assert_eq!(c.len(), (n as usize).min(MAX_CANDIDATES));
                assert_eq!(c[0], jump(key, n) as usize);
                assert!(c.iter().all(|&b| b < n as usize));
                let mut sorted = c.clone();
                sorted.sort();
                sorted.dedup();
                assert_eq!(sorted.len(), c.len(), "{c:?}");
                assert_eq!(c, j.candidates(key).collect::<Vec<_>>());
            }
        }
        assert_eq!(Jump::new(0), Err(PlacementError::Empty));
    }

    #[test]
    fn second_candidates_spread_evenly() {
        let j = Jump::new(5).unwrap();
        let mut counts = [[0u32; 5]; 5];
        for k in 0..50_000u64 {
            let mut c = j.candidates(h64(&k.to_le_bytes()));
            let (a, b) = (c.next().unwrap(), c.next().unwrap());
            counts[a][b] += 1;
        }
        // Given the primary, each of the other four is about equally likely.
        for (a, row) in counts.iter().enumerate() {
            let total: u32 = row.iter().sum();
            for (b, &n) in row.iter().enumerate() {
                if a != b {
                    let share = f64::from(n) / f64::from(total);
                    assert!((share - 0.25).abs() < 0.03, "{a}->{b}: {share}");
                }
            }
        }
    }

    #[test]
    fn golden_keys() {
        let got: Vec<u32> = ["user:0", "user:1", "user:42", "user:99999", "session-abc"]
            .iter()
            .map(|k| jump(h64(k.as_bytes()), 10))
            .collect();
        assert_eq!(got, GOLDEN);
    }
    const GOLDEN: [u32; 5] = [2, 1, 9, 3, 3];
}
