//! Consistent-hash ring with virtual nodes (Karger et al.), the scheme under
//! bounded loads and the lab's `ring-*` rows.
//!
//! Node `n` with weight `w` gets `points_per_weight · w` points; point `v` sits
//! at `h64("{n}#{v}")`. Points are sorted by (hash, node name), and a key hash
//! belongs to the first point whose hash is strictly greater than it, wrapping
//! past the largest point to the first. These are the lab's fixed conventions,
//! so the proxy's ring and `magpie simulate` agree point for point.
//!
//! Candidates are the distinct nodes met walking clockwise from that point,
//! primary first, at most `MAX_CANDIDATES`, and never more than one lap.

use std::fmt::Write;

use super::walk::Walk;

use super::{MAX_LAB_RING_POINTS, MAX_RING_POINTS, NodeSet, PlacementError, Scheme};
use crate::hash::h64;

/// A built ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// (point hash, node index), sorted by hash then node index. Node indices
    /// follow name order, so this is the (hash, name) order.
    points: Vec<(u64, u32)>,
    /// Nodes with at least one point: a walk stops once it has met them all.
    owners: usize,
    nodes: usize,
}

impl Ring {
    /// The proxy's ring: at most [`MAX_RING_POINTS`] points in all.
    pub fn new(nodes: &NodeSet, points_per_weight: u32) -> Result<Ring, PlacementError> {
        let total = Ring::points_for(nodes, points_per_weight)?;
        if total > MAX_RING_POINTS {
            return Err(PlacementError::TooManyPoints(total));
        }
        Ok(Ring::build(nodes, points_per_weight, total))
    }

    /// The lab's ring (`magpie simulate`): the same ring, allowed up to
    /// [`MAX_LAB_RING_POINTS`], because the lab measures rings far denser than
    /// anyone should route with.
    pub fn for_lab(nodes: &NodeSet, points_per_weight: u32) -> Result<Ring, PlacementError> {
        let total = Ring::points_for(nodes, points_per_weight)?;
        if total > MAX_LAB_RING_POINTS {
            return Err(PlacementError::TooManyLabPoints(total));
        }
        Ok(Ring::build(nodes, points_per_weight, total))
    }

    /// Points in all; saturates, so an absurd pool cannot wrap past a limit.
    fn points_for(nodes: &NodeSet, points_per_weight: u32) -> Result<u64, PlacementError> {
        if points_per_weight == 0 {
            return Err(PlacementError::NoPoints);
        }
        Ok(nodes
            .total_weight()
            .saturating_mul(u64::from(points_per_weight)))
    }

    /// Builds `total` points; the caller has checked `total` against its limit.
    fn build(nodes: &NodeSet, points_per_weight: u32, total: u64) -> Ring {
        let mut points = Vec::with_capacity(total as usize);
        let mut text = String::new();
        for (i, node) in nodes.nodes().iter().enumerate() {
            for v in 0..u64::from(points_per_weight) * u64::from(node.weight) {
                text.clear();
                write!(text, "{}#{}", node.name, v).expect("writing to a String cannot fail");
                points.push((h64(text.as_bytes()), i as u32));
            }
        }
        points.sort_unstable();
        let owners = nodes.nodes().iter().filter(|n| n.weight > 0).count();
        Ring {
            points,
            owners,
            nodes: nodes.len(),
        }
    }

    /// (hash, node index) of every point, in ring order.
    pub fn points(&self) -> &[(u64, u32)] {
        &self.points
    }

    /// Index into [`points`](Self::points) of the point that owns `key`: the
    /// first with a hash strictly greater, wrapping to 0.
    #[inline]
    pub fn point_for(&self, key: u64) -> usize {
        let i = self.points.partition_point(|&(h, _)| h <= key);
        if i == self.points.len() { 0 } else { i }
    }

    /// Fraction of the 2^64 key-hash space each node index owns as primary.
    pub fn shares(&self) -> Vec<f64> {
        let mut arcs = vec![0u128; self.nodes];
        let Some(&(last, _)) = self.points.last() else {
            return vec![0.0; self.nodes];
        };
        // Point i owns [h(i-1), h(i)); point 0 also owns everything from the
        // last point up to 2^64.
        let mut prev = u128::from(last);
        for (j, &(h, node)) in self.points.iter().enumerate() {
            let h = u128::from(h);
            let arc = if j == 0 {
                (1u128 << 64) - prev + h
            } else {
                h - prev
            };
            arcs[node as usize] += arc;
            prev = h;
        }
        let space = (1u128 << 64) as f64;
        arcs.into_iter().map(|a| a as f64 / space).collect()
    }
}

/// Candidates for one key: distinct nodes clockwise from the key's point.
pub type RingCandidates<'a> = Walk<'a, (u64, u32)>;

impl Scheme for Ring {
    type Candidates<'a> = RingCandidates<'a>;

    fn candidates(&self, key: u64) -> RingCandidates<'_> {
        Walk::new(&self.points, self.point_for(key), self.owners)
    }

    #[inline]
    fn primary(&self, key: u64) -> Option<usize> {
        Some(self.points[self.point_for(key)].1 as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Node;

    fn numbered(n: usize) -> NodeSet {
        NodeSet::new((0..n).map(|i| Node::new(i.to_string(), 1))).unwrap()
    }

    #[test]
    fn points_follow_the_fixed_convention() {
        let set = numbered(4);
        let ring = Ring::new(&set, 20).unwrap();
        assert_eq!(ring.points().len(), 80);
        // h64("3#17") is one of DESIGN.md's golden vectors.
        let three = set.index_of("3").unwrap() as u32;
        assert!(ring.points().contains(&(0x105ba1f3c1adb049, three)));
        assert!(ring.points().windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn strictly_greater_and_wrapping() {
        let ring = Ring::new(&numbered(3), 5).unwrap();
        let p = ring.points();
        // A key equal to a point's hash belongs to the next point.
        assert_eq!(ring.point_for(p[4].0), 5);
        assert_eq!(ring.point_for(p[4].0 - 1), 4);
        // Past the last point wraps to the first.
        assert_eq!(ring.point_for(p[p.len() - 1].0), 0);
        assert_eq!(ring.point_for(u64::MAX), 0);
        assert_eq!(ring.point_for(0), 0);
    }

    #[test]
    fn rejects_bad_parameters() {
        assert_eq!(Ring::new(&numbered(2), 0), Err(PlacementError::NoPoints));
        let heavy = NodeSet::new([Node::new("a", u32::MAX), Node::new("b", 2)]).unwrap();
        assert!(matches!(
            Ring::new(&heavy, 2),
            Err(PlacementError::TooManyPoints(_))
        ));
    }

    #[test]
    fn the_proxy_ring_is_limited_and_the_lab_ring_less_so() {
        let over = MAX_RING_POINTS + 1;
        let one = |w: u64| NodeSet::new([Node::new("a", u32::try_from(w).unwrap())]).unwrap();
        assert_eq!(
            Ring::new(&one(over), 1),
            Err(PlacementError::TooManyPoints(over))
        );
        assert_eq!(
            Ring::new(&one(MAX_RING_POINTS / 2 + 1), 2),
            Err(PlacementError::TooManyPoints(MAX_RING_POINTS + 2))
        );
        let lab_over = MAX_LAB_RING_POINTS + 1;
        assert_eq!(
            Ring::for_lab(&one(lab_over), 1),
            Err(PlacementError::TooManyLabPoints(lab_over))
        );
        // Below both limits the two are the same ring.
        let set = numbered(7);
        assert_eq!(Ring::for_lab(&set, 30), Ring::new(&set, 30));
        assert_eq!(Ring::for_lab(&set, 0), Err(PlacementError::NoPoints));
    }

    #[test]
    fn shares_sum_to_one_and_follow_weights() {
        let set = NodeSet::new([Node::new("a", 1), Node::new("b", 2), Node::new("c", 0)]).unwrap();
        let ring = Ring::new(&set, 1000).unwrap();
        let shares = ring.shares();
        assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert_eq!(shares[2], 0.0);
        assert!((shares[1] / shares[0] - 2.0).abs() < 0.15, "{shares:?}");
    }

    #[test]
    fn candidates_are_distinct_bounded_and_clockwise() {
        for n in [1usize, 5, 70] {
            let ring = Ring::new(&numbered(n), 10).unwrap();
            for k in 0..200u64 {
                let key = h64(&k.to_le_bytes());
                let c: Vec<usize> = ring.candidates(key).collect();
                assert_eq!(c.len(), n.min(crate::placement::MAX_CANDIDATES));
                assert_eq!(ring.primary(key), Some(c[0]));
                let mut sorted = c.clone();
                sorted.sort();
                sorted.dedup();
                assert_eq!(sorted.len(), c.len());
            }
        }
        // The second candidate is the first different node clockwise.
        let ring = Ring::new(&numbered(3), 4).unwrap();
        let p = ring.points();
        let start = ring.point_for(12345);
        let first = p[start].1;
        let second = (1..p.len())
            .map(|d| p[(start + d) % p.len()].1)
            .find(|&x| x != first)
            .unwrap();
        let c: Vec<usize> = ring.candidates(12345).collect();
        assert_eq!(&c[..2], [first as usize, second as usize]);
    }

    #[test]
    fn golden_keys() {
        let set = numbered(10);
        let ring = Ring::new(&set, 100).unwrap();
        let got: Vec<&str> = ["user:0", "user:1", "user:42", "user:99999", "session-abc"]
            .iter()
            .map(|k| {
                set.nodes()[ring.primary(h64(k.as_bytes())).unwrap()]
                    .name
                    .as_str()
            })
            .collect();
        // Cross-checked with an independent Python ring over hashlib.blake2b.
        assert_eq!(got, GOLDEN);
    }
    const GOLDEN: [&str; 5] = ["8", "0", "6", "6", "4"];
}
