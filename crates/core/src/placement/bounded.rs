//! Bounded loads (Mirrokni, Thorup and Zadimoghaddam, SODA 2018) on top of any
//! scheme's candidates: the arithmetic, and the check of the factor.
//!
//! With total load `T` (before the new key), total weight `W` and a factor
//! `c ≥ 1`, node `i` of weight `w_i` may take the key while its load is below
//! `cap_i = ceil(c · (T + 1) · w_i / W)`. A lookup walks the candidates in
//! order and takes the first with room, so a key stays on its primary unless
//! that node is full: traffic does this in the proxy's `route` (with live
//! connection or request counts), the lab's bounded-ring in `simulate` (with
//! key counts). This module never allocates.
//!
//! Invariant: after every placement made that way, each node's load is at
//! most `ceil(c · T' · w_i / W)` for the new total `T'`. Because `c ≥ 1` makes
//! the caps sum to at least `T + 1`, some node always has room when the
//! candidates cover every weighted node.

use super::PlacementError;

/// Checks a bounded-load factor: finite and at least 1.0.
pub fn check_factor(f: f64) -> Result<f64, PlacementError> {
    if f.is_finite() && f >= 1.0 {
        Ok(f)
    } else {
        Err(PlacementError::BadLoadFactor(f))
    }
}

/// `ceil(factor · (total_load + 1) · weight / total_weight)`; 0 for weight 0.
///
/// Computed in `f64`, with a value within a relative 1e-12 above an integer
/// taken as that integer, so that float noise (1.1 · 100000 / 10 =
/// 11000.000000000002) does not add one. A non-finite or huge result saturates
/// at `u64::MAX`.
pub fn cap(factor: f64, total_load: u64, weight: u32, total_weight: u64) -> u64 {
    if weight == 0 || total_weight == 0 {
        return 0;
    }
    let exact = factor * (total_load as f64 + 1.0) * f64::from(weight) / total_weight as f64;
    if exact.is_nan() {
        return 0;
    }
    if exact >= u64::MAX as f64 {
        return u64::MAX;
    }
    let floor = exact.floor();
    let snapped = if exact - floor <= exact * 1e-12 {
        floor
    } else {
        exact.ceil()
    };
    snapped as u64
}

/// A node's mean share of `total_load + 1`: `(total_load + 1) · weight /
/// total_weight`; 0 for weight 0.
pub fn mean(total_load: u64, weight: u32, total_weight: u64) -> f64 {
    if weight == 0 || total_weight == 0 {
        return 0.0;
    }
    (total_load as f64 + 1.0) * f64::from(weight) / total_weight as f64
}

/// The cap with an absolute floor: a node may take the key while its load is
/// below [`cap`] *or* below its [`mean`] plus `min_excess`, so a key spills
/// only when its node is over both the relative and the absolute threshold.
/// `min_excess` 0 gives [`cap`] (which is never below the mean for `c ≥ 1`).
/// The bound on every node's load is then the larger of the two.
pub fn spill_cap(
    factor: f64,
    min_excess: u64,
    total_load: u64,
    weight: u32,
    total_weight: u64,
) -> u64 {
    let relative = cap(factor, total_load, weight, total_weight);
    if weight == 0 || total_weight == 0 {
        return relative;
    }
    let absolute = (mean(total_load, weight, total_weight) + min_excess as f64).ceil();
    let absolute = if absolute >= u64::MAX as f64 {
        u64::MAX
    } else {
        absolute as u64
    };
    relative.max(absolute)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::h64;
    use crate::placement::ring::Ring;
    use crate::placement::{Node, NodeSet, Scheme};

    #[test]
    fn cap_formula_and_edges() {
        assert_eq!(cap(1.25, 99, 1, 4), 32); // 1.25·100/4 = 31.25
        assert_eq!(cap(1.0, 9, 1, 10), 1);
        assert_eq!(cap(1.10, 99_999, 1, 10), 11_000); // float noise must not add one
        assert_eq!(cap(1.0, 0, 1, 1000), 1); // a weighted node always fits one
        assert_eq!(cap(2.0, 10, 0, 5), 0);
        assert_eq!(cap(1.0, 10, 1, 0), 0);
        assert_eq!(cap(f64::INFINITY, 10, 1, 1), u64::MAX);
        assert_eq!(cap(1.0, u64::MAX, u32::MAX, 1), u64::MAX);
    }

    #[test]
    fn spill_cap_is_the_larger_of_the_relative_and_the_absolute_bound() {
        // 3 equal nodes, 29 active + this one: mean 10, relative cap 13.
        assert_eq!(spill_cap(1.25, 0, 29, 1, 3), cap(1.25, 29, 1, 3));
        assert_eq!(spill_cap(1.25, 0, 29, 1, 3), 13);
        assert_eq!(spill_cap(1.25, 8, 29, 1, 3), 18);
        // Under heavy load the relative bound is the larger one.
        assert_eq!(spill_cap(1.25, 8, 299, 1, 3), 125);
        assert_eq!(spill_cap(1.25, 8, 10, 0, 3), 0);
        assert_eq!(spill_cap(1.0, u64::MAX, 10, 1, 3), u64::MAX);
        assert!((mean(29, 1, 3) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn factor_validation() {
        assert_eq!(check_factor(1.0), Ok(1.0));
        assert_eq!(check_factor(1.25), Ok(1.25));
        for bad in [0.99, -1.0, f64::INFINITY] {
            assert_eq!(check_factor(bad), Err(PlacementError::BadLoadFactor(bad)));
        }
        assert!(check_factor(f64::NAN).is_err());
    }

    #[test]
    fn loads_never_exceed_their_cap() {
        let set = NodeSet::new([
            Node::new("a", 1),
            Node::new("b", 1),
            Node::new("c", 2),
            Node::new("d", 2),
            Node::new("e", 0),
        ])
        .unwrap();
        let ring = Ring::new(&set, 10).unwrap();
        let weights: Vec<u32> = set.nodes().iter().map(|n| n.weight).collect();
        let total_weight = set.total_weight();
        for factor in [1.0, 1.1, 1.25, 2.0] {
            let mut loads = vec![0u64; set.len()];
            let mut total = 0u64;
            let mut moved = 0;
            for k in 0..20_000u64 {
                // Three keys in four are one hot key: more than any node's cap
                // (at most 2 · 2/6 of the total), so the caps must bind.
                let key = if k % 4 == 0 { h64(&k.to_le_bytes()) } else { 7 };
                let has_room = |i: usize| loads[i] < cap(factor, total, weights[i], total_weight);
                let index = ring
                    .candidates(key)
                    .find(|&i| has_room(i))
                    .expect("caps sum above the total, so someone has room");
                moved += usize::from(ring.candidates(key).next() != Some(index));
                loads[index] += 1;
                total += 1;
                for (i, &l) in loads.iter().enumerate() {
                    let c = cap(factor, total - 1, weights[i], total_weight);
                    assert!(l <= c, "factor {factor}: node {i} at {l} > cap {c}");
                }
            }
            assert_eq!(loads[4], 0, "weight 0 takes nothing");
            assert!(moved > 0, "factor {factor}: caps never bound");
        }
    }
}
