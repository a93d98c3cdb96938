//! Maglev hashing (Eisenbud et al., NSDI 2016): magpie's default placement.
//!
//! A lookup table of prime size M maps every slot to a node index; a key hash
//! picks one slot. The table is rebuilt only when the configured pool changes
//! (never on health changes), and every instance with the same pool builds the
//! identical table, because nodes are taken in [`NodeSet`] (name) order and
//! each node's preferences come from `h64` of its name alone.
//!
//! # Preferences
//!
//! Node `n` walks the table in the order `offset, offset + skip, offset + 2·skip, …`
//! (mod M). With `h = h64("{n}|maglev")`:
//!
//! - `offset = (h >> 32) mod M` (the high half)
//! - `skip   = (h & 0xffff_ffff) mod (M − 1) + 1` (the low half)
//!
//! One hash per node rather than the paper's two: BLAKE2b is the costliest
//! part of building a table for 1000 nodes, and each 32-bit half is still
//! uniform enough (bias below M / 2^32 ≤ 0.4% at the largest M).
//!
//! Because M is prime and `1 ≤ skip < M`, that walk visits every slot exactly
//! once, so a node with quota left always finds a free slot.
//!
//! # Weights become exact entry counts
//!
//! Node `i` gets the quota `q_i = floor(M · w_i / W)`; the slots left over (fewer
//! than the number of weighted nodes) go one each to the largest remainders
//! `M · w_i mod W`, ties broken by name order. So weights 1 and 2 at M = 65537
//! give exactly 21,846 and 43,691 slots, and equal weights differ by at most one.
//! Weight 0 gets no slots (the node drains; it is never a candidate).
//!
//! The table is filled in rounds `r = 1 ..= q_max`: by the end of round `r`,
//! node `i` has taken `ceil(q_i · r / q_max)` slots (a Bresenham-style credit
//! counter, no division), each time its next free preferred slot. With equal
//! quotas this is exactly the paper's round-robin; with unequal weights the
//! heavier nodes take their turns evenly spread over the rounds instead of
//! all at the end. Cost: `O(N · q_max)` turns plus the preference probes;
//! the `fill` module finds each turn's slot without changing which slot it is.
//!
//! # Lookup
//!
//! The slot for a key hash `k` is `(k · M) >> 64` (a 128-bit multiply-shift,
//! Lemire's "fast range") rather than `k mod M`: it avoids a 64-bit division on
//! the hot path and is just as uniform for a uniform `k`, since it uses the high
//! bits of the hash. Candidates are the slot's owner, then the distinct owners of
//! the following slots (wrapping), at most `MAX_CANDIDATES` of them, and a walk
//! never passes more than one full table.

mod fill;

use super::walk::Walk;
use super::{NodeSet, PlacementError, Scheme};

/// The table size magpie uses unless told otherwise (the paper's small size).
pub const DEFAULT_TABLE_SIZE: u64 = 65537;

/// The largest table accepted; it lives with the other limits config shares.
pub use super::limits::MAX_TABLE_SIZE;

/// Marks a slot nobody has claimed yet while filling. Node indices are always
/// below this because a `NodeSet` that large could not be built into a table
/// of at most [`MAX_TABLE_SIZE`] slots.
const EMPTY: u32 = u32::MAX;

/// Deterministic primality test for any `u64` (Miller–Rabin with the first
/// twelve primes as bases, which is exact below 3.3 · 10^24).
pub fn is_prime(n: u64) -> bool {
    const BASES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
    if n < 2 {
        return false;
    }
    for p in BASES {
        if n.is_multiple_of(p) {
            return n == p;
        }
    }
    let mut d = n - 1;
    let mut s = 0;
    while d.is_multiple_of(2) {
        d /= 2;
        s += 1;
    }
    let mul = |a: u64, b: u64| ((u128::from(a) * u128::from(b)) % u128::from(n)) as u64;
    let pow = |mut base: u64, mut exp: u64| {
        let mut acc = 1u64;
        while exp > 0 {
            if exp & 1 == 1 {
                acc = mul(acc, base);
            }
            base = mul(base, base);
            exp >>= 1;
        }
        acc
    };
    'bases: for a in BASES {
        let mut x = pow(a, d);
        if x == 1 || x == n - 1 {
            continue;
        }
        for _ in 1..s {
            x = mul(x, x);
            if x == n - 1 {
                continue 'bases;
            }
        }
        return false;
    }
    true
}

/// A warning for callers to log when the table is too small for the pool:
/// below 100 slots per node, shares get uneven and more keys move on a change.
/// Placement never logs; the caller decides where this goes.
pub fn sparse_warning(table_size: u64, nodes: usize) -> Option<String> {
    let wanted = 100u64.saturating_mul(nodes as u64);
    (table_size < wanted).then(|| {
        format!(
            "maglev table size {table_size} is below 100 slots per node for {nodes} nodes \
             (at least {wanted} recommended): expect uneven shares and extra disruption"
        )
    })
}

/// A built Maglev lookup table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Maglev {
    /// Slot → node index (into the `NodeSet` it was built from). Every slot is
    /// owned once the build returns.
    table: Vec<u32>,
    /// How many nodes own at least one slot: a candidate walk stops once it has
    /// met them all, instead of scanning the whole table.
    owners: usize,
    /// Slots per node index, kept from the build.
    counts: Vec<u64>,
}

impl Maglev {
    /// Builds the table for `nodes` with `table_size` slots (prime, at least the
    /// number of nodes, at most [`MAX_TABLE_SIZE`]).
    pub fn new(nodes: &NodeSet, table_size: u64) -> Result<Maglev, PlacementError> {
        if table_size > MAX_TABLE_SIZE {
            return Err(PlacementError::TableTooLarge(table_size));
        }
        if !is_prime(table_size) {
            return Err(PlacementError::TableSizeNotPrime(table_size));
        }
        if table_size < nodes.len() as u64 {
            return Err(PlacementError::TableTooSmall {
                size: table_size,
                nodes: nodes.len(),
            });
        }
        let m = table_size;
        let quotas = quotas(nodes, m);

        let table = fill::fill(nodes, &quotas, m);
        debug_assert!(table.iter().all(|&o| o != EMPTY));

        let owners = quotas.iter().filter(|&&q| q > 0).count();
        Ok(Maglev {
            table,
            owners,
            counts: quotas,
        })
    }

    /// Slot → node index.
    pub fn table(&self) -> &[u32] {
        &self.table
    }

    /// Slots owned by each node index (weight-0 nodes own none).
    pub fn slot_counts(&self) -> Vec<u64> {
        self.counts.clone()
    }

    pub fn table_size(&self) -> u64 {
        self.table.len() as u64
    }

    /// The slot a key hash falls in: `(key · M) >> 64`, see the module docs.
    #[inline]
    pub fn slot(&self, key: u64) -> usize {
        ((u128::from(key) * self.table.len() as u128) >> 64) as usize
    }
}

/// Largest-remainder quotas summing to exactly `m`, indexed like `nodes`.
fn quotas(nodes: &NodeSet, m: u64) -> Vec<u64> {
    // u64 is exact: M ≤ 2^24 and weights are u32, so M · w < 2^56, and the
    // total weight of any pool that fits in memory is far below 2^64.
    let total = nodes.total_weight();
    let mut quotas = Vec::with_capacity(nodes.len());
    let mut remainders = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.nodes().iter().enumerate() {
        let share = m * u64::from(node.weight);
        quotas.push(share / total);
        if node.weight > 0 {
            remainders.push((share % total, i));
        }
    }
    let left = (m - quotas.iter().sum::<u64>()) as usize;
    // Largest remainder first; equal remainders go to the earlier name. Only
    // which nodes are among the first `left` matters, not their order.
    let order = |a: &(u64, usize), b: &(u64, usize)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
    if left < remainders.len() {
        remainders.select_nth_unstable_by(left, order);
    }
    for &(_, i) in remainders.iter().take(left) {
        quotas[i] += 1;
    }
    quotas
}

/// Candidates for one key: the slot's owner, then new owners further on.
pub type MaglevCandidates<'a> = Walk<'a, u32>;

impl Scheme for Maglev {
    type Candidates<'a> = MaglevCandidates<'a>;

    fn candidates(&self, key: u64) -> MaglevCandidates<'_> {
        Walk::new(&self.table, self.slot(key), self.owners)
    }

    #[inline]
    fn primary(&self, key: u64) -> Option<usize> {
        Some(self.table[self.slot(key)] as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::{h64, h64_parts};
    use crate::placement::Node;

    fn numbered(n: usize) -> NodeSet {
        NodeSet::new((0..n).map(|i| Node::new(format!("backend-{i}"), 1))).unwrap()
    }

    #[test]
    fn primes() {
        let small: Vec<u64> = (0..30).filter(|&n| is_prime(n)).collect();
        assert_eq!(small, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert!(is_prime(65537));
        assert!(is_prime(655373));
        assert!(!is_prime(65535));
        assert!(!is_prime(65537 * 65539));
        assert!(is_prime(18446744073709551557)); // largest u64 prime
        assert!(!is_prime(3215031751)); // strong pseudoprime to bases 2, 3, 5, 7
    }

    #[test]
    fn rejects_bad_table_sizes() {
        let set = numbered(5);
        assert_eq!(
            Maglev::new(&set, 65536),
            Err(PlacementError::TableSizeNotPrime(65536))
        );
        assert_eq!(
            Maglev::new(&set, 3),
            Err(PlacementError::TableTooSmall { size: 3, nodes: 5 })
        );
        assert_eq!(
            Maglev::new(&set, 4294967291),
            Err(PlacementError::TableTooLarge(4294967291))
        );
        assert!(Maglev::new(&set, 5).is_ok());
    }

    #[test]
    fn sparse_warning_below_100_per_node() {
        assert!(sparse_warning(65537, 655).is_none());
        let msg = sparse_warning(65537, 656).unwrap();
        assert!(msg.contains("65537") && msg.contains("656"), "{msg}");
    }

    #[test]
    fn equal_weights_differ_by_at_most_one() {
        for n in [1, 3, 10, 100, 1000] {
            let m = Maglev::new(&numbered(n), DEFAULT_TABLE_SIZE).unwrap();
            let counts = m.slot_counts();
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(hi - lo <= 1, "n={n}: {lo}..{hi}");
            // The counts reported are the counts in the table.
            let mut actual = vec![0u64; n];
            for &o in m.table() {
                actual[o as usize] += 1;
            }
            assert_eq!(actual, counts);
        }
    }

    #[test]
    fn weights_give_proportional_entry_counts() {
        let set = NodeSet::new([Node::new("a", 1), Node::new("b", 2)]).unwrap();
        let m = Maglev::new(&set, DEFAULT_TABLE_SIZE).unwrap();
        assert_eq!(m.slot_counts(), [21_846, 43_691]);
        let mut actual = [0u64; 2];
        for &o in m.table() {
            actual[o as usize] += 1;
        }
        assert_eq!(actual, [21_846, 43_691]);

        let set = NodeSet::new([
            Node::new("a", 1),
            Node::new("b", 3),
            Node::new("c", 0),
            Node::new("d", 6),
        ])
        .unwrap();
        let m = Maglev::new(&set, 655373).unwrap();
        let counts = m.slot_counts();
        assert_eq!(counts[2], 0, "weight 0 gets no slots");
        for (i, w) in [(0, 1.0), (1, 3.0), (3, 6.0)] {
            let exact = 655373.0 * w / 10.0;
            assert!((counts[i] as f64 - exact).abs() <= 1.0, "{counts:?}");
        }
        assert_eq!(counts.iter().sum::<u64>(), 655373);
        assert!((0..10_000u64).all(|k| m.candidates(h64(&k.to_be_bytes())).all(|c| c != 2)));
    }

    #[test]
    fn input_order_does_not_change_the_table() {
        let nodes: Vec<Node> = (0..37)
            .map(|i| Node::new(format!("n{i}"), 1 + i % 3))
            .collect();
        let mut shuffled = nodes.clone();
        shuffled.reverse();
        shuffled.swap(3, 20);
        shuffled.rotate_left(11);
        let a = Maglev::new(&NodeSet::new(nodes).unwrap(), DEFAULT_TABLE_SIZE).unwrap();
        let b = Maglev::new(&NodeSet::new(shuffled).unwrap(), DEFAULT_TABLE_SIZE).unwrap();
        assert_eq!(a.table(), b.table());
    }

    /// Share of slots whose owner (by name) differs between two tables.
    fn changed_share(a: &Maglev, a_set: &NodeSet, b: &Maglev, b_set: &NodeSet) -> f64 {
        let changed = a
            .table()
            .iter()
            .zip(b.table())
            .filter(|(x, y)| a_set.nodes()[**x as usize].name != b_set.nodes()[**y as usize].name)
            .count();
        changed as f64 / a.table().len() as f64
    }

    #[test]
    fn adding_or_removing_one_node_moves_few_slots() {
        for n in [10usize, 100] {
            let small = numbered(n);
            let big = numbered(n + 1);
            let a = Maglev::new(&small, DEFAULT_TABLE_SIZE).unwrap();
            let b = Maglev::new(&big, DEFAULT_TABLE_SIZE).unwrap();
            let share = changed_share(&a, &small, &b, &big);
            let bound = 1.0 / (n as f64 + 1.0) + 0.02;
            eprintln!(
                "maglev disruption n={n} -> {}: {share:.5} (bound {bound:.5})",
                n + 1
            );
            assert!(share < bound, "n={n}: {share} >= {bound}");
            // The minimum possible is the new node's own share.
            assert!(share >= 1.0 / (n as f64 + 1.0) - 0.001, "n={n}: {share}");

            // Removing one node from the middle of the name order.
            let fewer = NodeSet::new(
                small
                    .nodes()
                    .iter()
                    .filter(|x| x.name != "backend-3")
                    .cloned(),
            )
            .unwrap();
            let c = Maglev::new(&fewer, DEFAULT_TABLE_SIZE).unwrap();
            let share = changed_share(&a, &small, &c, &fewer);
            eprintln!("maglev disruption n={n} -> {}: {share:.5}", n - 1);
            assert!(share < 1.0 / n as f64 + 0.02, "n={n} remove: {share}");
        }
    }

    #[test]
    fn candidates_are_distinct_bounded_and_start_at_the_slot_owner() {
        for n in [1usize, 3, 10, 100] {
            let m = Maglev::new(&numbered(n), DEFAULT_TABLE_SIZE).unwrap();
            for k in 0..300u64 {
                let key = h64(&k.to_be_bytes());
                let c: Vec<usize> = m.candidates(key).collect();
                assert_eq!(c.len(), n.min(crate::placement::MAX_CANDIDATES), "n={n}");
                assert_eq!(c[0], m.table()[m.slot(key)] as usize);
                assert_eq!(m.primary(key), Some(c[0]));
                let mut sorted = c.clone();
                sorted.sort();
                sorted.dedup();
                assert_eq!(sorted.len(), c.len(), "duplicates: {c:?}");
            }
        }
        // The extremes of the hash space map inside the table.
        let m = Maglev::new(&numbered(3), 7).unwrap();
        assert_eq!(m.slot(0), 0);
        assert_eq!(m.slot(u64::MAX), 6);
    }

    /// The table as the module docs define it, filled one probe at a time
    /// with `%`: the optimised fill must give exactly this.
    fn reference_table(nodes: &NodeSet, m: u64) -> Vec<u32> {
        let quotas = quotas(nodes, m);
        let q_max = *quotas.iter().max().unwrap();
        let mut walks: Vec<(u32, u64, u64, u64, u64)> = nodes
            .nodes()
            .iter()
            .zip(&quotas)
            .enumerate()
            .filter(|(_, (_, q))| **q > 0)
            .map(|(i, (node, &q))| {
                let h = h64_parts(&[node.name.as_bytes(), b"|maglev"]);
                let skip = (h & 0xffff_ffff) % (m - 1) + 1;
                (i as u32, (h >> 32) % m, skip, q, 0)
            })
            .collect();
        let mut table = vec![EMPTY; m as usize];
        for round in 1..=q_max {
            for (index, next, skip, quota, taken) in walks.iter_mut() {
                // Cumulative turns by the end of this round: ceil(q·r/q_max).
                if *taken == (*quota * round).div_ceil(q_max) {
                    continue;
                }
                while table[*next as usize] != EMPTY {
                    *next = (*next + *skip) % m;
                }
                table[*next as usize] = *index;
                *next = (*next + *skip) % m;
                *taken += 1;
            }
        }
        table
    }

    #[test]
    fn fill_matches_the_one_probe_at_a_time_definition() {
        let weighted =
            NodeSet::new((0..23).map(|i| Node::new(format!("w{i}"), [0, 1, 2, 5, 13][i % 5])))
                .unwrap();
        for (set, m) in [
            (numbered(1), 2),
            (numbered(2), 2),
            (numbered(2), 3),
            (numbered(3), 7),
            (numbered(7), 7),
            (numbered(10), 101),
            (numbered(100), DEFAULT_TABLE_SIZE),
            (numbered(1000), DEFAULT_TABLE_SIZE),
            (weighted.clone(), 257),
            (weighted, DEFAULT_TABLE_SIZE),
        ] {
            let built = Maglev::new(&set, m).unwrap();
            assert!(
                built.table() == reference_table(&set, m),
                "n={} m={m}",
                set.len()
            );
        }
    }

    #[test]
    fn golden_keys() {
        let set = NodeSet::new((0..10).map(|i| Node::new(i.to_string(), 1))).unwrap();
        let m = Maglev::new(&set, DEFAULT_TABLE_SIZE).unwrap();
        let got: Vec<&str> = ["user:0", "user:1", "user:42", "user:99999", "session-abc"]
            .iter()
            .map(|k| {
                set.nodes()[m.primary(h64(k.as_bytes())).unwrap()]
                    .name
                    .as_str()
            })
            .collect();
        // Cross-checked with an independent Python transcription of this
        // build (quotas, turns, preferences) over hashlib.blake2b.
        assert_eq!(got, GOLDEN);
    }
    const GOLDEN: [&str; 5] = ["0", "3", "3", "9", "7"];
}
