//! Weighted rendezvous hashing (highest random weight, Thaler and Ravishankar),
//! with the logarithmic method for weights (Schindelhauer and Schomaker).
//!
//! Every node scores every key; the key goes to the highest score. A node's
//! score for key hash `k` is `-w / ln(u)`, where `u ∈ (0, 1)` comes from
//! `mix64(seed ^ k)`, `seed = h64("{name}|hrw")` and `mix64` is the SplitMix64
//! finaliser (a fast bijective 64-bit mix; BLAKE2b per node per lookup would
//! cost far more). Under that score each node wins with probability `w / W`.
//! When all weighted nodes share one weight, `-w / ln(u)` is increasing in `u`,
//! so the ranking is the ranking by `u` itself and the logarithm is skipped.
//!
//! Candidates come in score order without allocating: each step takes the best
//! node strictly worse than the previous candidate, a full pass over the nodes
//! per candidate. Ties in score go to the earlier node index (name order).
//! Weight-0 nodes are never candidates.

use std::cmp::Ordering;

use super::{MAX_CANDIDATES, NodeSet, Scheme};
use crate::hash::h64_parts;

/// SplitMix64's output function: a bijection on `u64` with full avalanche.
#[inline]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Maps a 64-bit hash to `u ∈ (0, 1)`: the top 53 bits, centred in their cell,
/// so `ln(u)` is finite and negative.
#[inline]
pub fn unit_interval(h: u64) -> f64 {
    ((h >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
}

/// The logarithmic-method score: `-w / ln(u)`.
#[inline]
pub fn log_score(weight: u32, u: f64) -> f64 {
    -f64::from(weight) / u.ln()
}

/// How a node ranks for one key; the higher rank wins.
///
/// When every weighted node has the same weight, `-w / ln(u)` orders nodes
/// exactly as `u` does, and `u` (the top 53 bits of the hash) exactly as the
/// hash itself, so the hash is compared directly; otherwise the logarithmic
/// method's score. Both the scheme below and the lab (`magpie simulate`,
/// which hashes `"{n}|{key}"` per node) rank with this.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rank {
    Hash(u64),
    Score(f64),
}

impl Rank {
    #[inline]
    pub fn of(weight: u32, hash: u64, uniform: bool) -> Rank {
        if uniform {
            Rank::Hash(hash)
        } else {
            Rank::Score(log_score(weight, unit_interval(hash)))
        }
    }

    /// Total order between ranks made the same way.
    #[inline]
    pub fn order(self, other: Rank) -> Ordering {
        match (self, other) {
            (Rank::Hash(a), Rank::Hash(b)) => a.cmp(&b),
            (Rank::Score(a), Rank::Score(b)) => a.total_cmp(&b),
            // Never mixed within one lookup; order kinds so the result is total.
            (Rank::Hash(_), Rank::Score(_)) => Ordering::Less,
            (Rank::Score(_), Rank::Hash(_)) => Ordering::Greater,
        }
    }

    /// Strictly higher than `other`.
    #[inline]
    pub fn beats(self, other: Rank) -> bool {
        self.order(other) == Ordering::Greater
    }
}

/// A built rendezvous scheme: one seed and weight per node index.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendezvous {
    /// (node index, seed, weight) for every node with weight > 0.
    nodes: Vec<(u32, u64, u32)>,
    /// All weighted nodes share one weight: rank by `u`, skip the logarithm.
    uniform: bool,
}

impl Rendezvous {
    pub fn new(nodes: &NodeSet) -> Rendezvous {
        let weighted: Vec<(u32, u64, u32)> = nodes
            .nodes()
            .iter()
            .enumerate()
            .filter(|(_, n)| n.weight > 0)
            .map(|(i, n)| (i as u32, h64_parts(&[n.name.as_bytes(), b"|hrw"]), n.weight))
            .collect();
        let uniform = weighted.windows(2).all(|w| w[0].2 == w[1].2);
        Rendezvous {
            nodes: weighted,
            uniform,
        }
    }

    /// Node `slot` (an entry of `self.nodes`)'s rank for `key`.
    #[inline]
    fn score(&self, slot: usize, key: u64) -> Rank {
        let (_, seed, weight) = self.nodes[slot];
        Rank::of(weight, mix64(seed ^ key), self.uniform)
    }
}

/// (rank, node index) ordered best first: higher rank, then lower index.
#[inline]
fn better(a: (Rank, u32), b: (Rank, u32)) -> bool {
    match a.0.order(b.0) {
        Ordering::Greater => true,
        Ordering::Less => false,
        Ordering::Equal => a.1 < b.1,
    }
}

/// Candidates in descending score order.
#[derive(Debug, Clone)]
pub struct RendezvousCandidates<'a> {
    scheme: &'a Rendezvous,
    key: u64,
    previous: Option<(Rank, u32)>,
    left: usize,
}

impl Iterator for RendezvousCandidates<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        let mut best: Option<(Rank, u32)> = None;
        for slot in 0..self.scheme.nodes.len() {
            let this = (self.scheme.score(slot, self.key), self.scheme.nodes[slot].0);
            if self.previous.is_some_and(|p| !better(p, this)) {
                continue;
            }
            if best.is_none_or(|b| better(this, b)) {
                best = Some(this);
            }
        }
        self.previous = best;
        self.left -= 1;
        best.map(|(_, i)| i as usize)
    }
}

impl Scheme for Rendezvous {
    type Candidates<'a> = RendezvousCandidates<'a>;

    fn candidates(&self, key: u64) -> RendezvousCandidates<'_> {
        RendezvousCandidates {
            scheme: self,
            key,
            previous: None,
            left: self.nodes.len().min(MAX_CANDIDATES),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::h64;
    use crate::placement::Node;

    fn numbered(n: usize) -> NodeSet {
        NodeSet::new((0..n).map(|i| Node::new(i.to_string(), 1))).unwrap()
    }

    #[test]
    fn candidates_are_in_score_order_distinct_and_bounded() {
        for n in [1usize, 7, 100] {
            let set = numbered(n);
            let r = Rendezvous::new(&set);
            for k in 0..100u64 {
                let key = h64(&k.to_le_bytes());
                let c: Vec<usize> = r.candidates(key).collect();
                assert_eq!(c.len(), n.min(MAX_CANDIDATES));
                // Brute force: sort every node by score.
                let mut all: Vec<(Rank, usize)> = (0..n)
                    .map(|s| (r.score(s, key), r.nodes[s].0 as usize))
                    .collect();
                all.sort_by(|a, b| b.0.order(a.0).then(a.1.cmp(&b.1)));
                let expected: Vec<usize> = all.iter().map(|x| x.1).take(c.len()).collect();
                assert_eq!(c, expected);
            }
        }
    }

    #[test]
    fn weights_are_proportional_and_zero_is_never_chosen() {
        let set = NodeSet::new([
            Node::new("a", 1),
            Node::new("b", 2),
            Node::new("c", 0),
            Node::new("d", 1),
        ])
        .unwrap();
        let r = Rendezvous::new(&set);
        assert!(!r.uniform);
        let mut counts = [0u32; 4];
        for k in 0..40_000u64 {
            let key = h64(&k.to_le_bytes());
            counts[r.primary(key).unwrap()] += 1;
            assert!(r.candidates(key).all(|c| c != 2));
        }
        assert_eq!(counts[2], 0);
        let ratio = f64::from(counts[1]) / (f64::from(counts[0] + counts[3]) / 2.0);
        assert!((ratio - 2.0).abs() < 0.1, "{counts:?}");
    }

    #[test]
    fn uniform_shortcut_ranks_like_the_logarithm() {
        let set = NodeSet::new((0..20).map(|i| Node::new(format!("n{i}"), 3))).unwrap();
        let r = Rendezvous::new(&set);
        assert!(r.uniform);
        for k in 0..200u64 {
            let key = h64(&k.to_le_bytes());
            let by_log = (0..20)
                .max_by(|&a, &b| {
                    let (ua, ub) = (
                        unit_interval(mix64(r.nodes[a].1 ^ key)),
                        unit_interval(mix64(r.nodes[b].1 ^ key)),
                    );
                    log_score(3, ua).total_cmp(&log_score(3, ub))
                })
                .unwrap();
            assert_eq!(r.primary(key), Some(by_log));
        }
    }

    #[test]
    fn adding_a_node_only_moves_keys_to_it() {
        let before = numbered(10);
        let after = numbered(11);
        let (rb, ra) = (Rendezvous::new(&before), Rendezvous::new(&after));
        let mut moved = 0;
        for k in 0..20_000u64 {
            let key = h64(&k.to_le_bytes());
            let b = &before.nodes()[rb.primary(key).unwrap()].name;
            let a = &after.nodes()[ra.primary(key).unwrap()].name;
            if a != b {
                assert_eq!(a, "10");
                moved += 1;
            }
        }
        let share = f64::from(moved) / 20_000.0;
        assert!((share - 1.0 / 11.0).abs() < 0.01, "{share}");
    }

    #[test]
    fn golden_keys() {
        let set = numbered(10);
        let r = Rendezvous::new(&set);
        let got: Vec<&str> = ["user:0", "user:1", "user:42", "user:99999", "session-abc"]
            .iter()
            .map(|k| {
                set.nodes()[r.primary(h64(k.as_bytes())).unwrap()]
                    .name
                    .as_str()
            })
            .collect();
        assert_eq!(got, GOLDEN);
    }
    const GOLDEN: [&str; 5] = ["3", "5", "4", "1", "8"];
}
