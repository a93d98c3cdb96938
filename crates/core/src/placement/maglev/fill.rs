//! Filling a Maglev table: the rounds, turns and preference walks the
//! [module docs](super) define, made fast. Each turn takes the node's next
//! free preferred slot; while many slots are free that is a walk over a
//! bitmap of taken slots, and once few are left it is a search of the list
//! of free slots for the one the walk would reach first. Both give exactly
//! the slot a one-probe-at-a-time walk gives.

use super::EMPTY;
use crate::hash::h64_many;
use crate::placement::NodeSet;

/// Slot → node index for `nodes` with the given quotas (summing to `m`).
pub(super) fn fill(nodes: &NodeSet, quotas: &[u64], m: u64) -> Vec<u32> {
    // All counts and slots are below M ≤ 2^24.
    let q_max = quotas.iter().copied().max().unwrap_or(0) as u32;
    let mut fillers = fillers(nodes, quotas, m, q_max);
    let m32 = m as u32;
    let mut table = vec![EMPTY; m as usize];
    // Which slots are taken, one bit each: 8 KiB at M = 65537, so the
    // probes (about M·ln M of them in a plain walk) hit L1, not the table.
    let mut taken = vec![0u64; (m as usize).div_ceil(64)];
    let mut free = m;
    // A walk costs about M / F probes once F slots are free (half of all
    // probes come in the last √M turns); the search of the free list costs
    // F steps. So walk while F is large, then search.
    let tail = m.isqrt();
    let mut free_list: Vec<u32> = Vec::new();
    for _round in 0..q_max {
        for f in fillers.iter_mut() {
            f.credit += f.quota;
            if f.credit < q_max {
                continue;
            }
            f.credit -= q_max;
            // Invariant: this node has quota left, so the table is not full
            // and its full-cycle walk reaches a free slot.
            let slot = if free > tail {
                next_free(&taken, f.next, f.skip, f.skip2, m32)
            } else {
                // Empty only on entering the tail: the last slot taken ends
                // the fill.
                if free_list.is_empty() {
                    free_list = free_slots(&taken, m32);
                }
                if f.inverse.0 == 0 {
                    let inv = inverse_mod(u64::from(f.skip), m);
                    f.inverse = (inv as u32, ((inv << 32) / m) as u32);
                }
                let (at, slot) = earliest_free(&free_list, f.next, f.inverse, m32);
                free_list.swap_remove(at);
                slot
            };
            taken[slot as usize / 64] |= 1 << (slot % 64);
            table[slot as usize] = f.index;
            f.next = advance(slot, f.skip, m32);
            free -= 1;
        }
    }
    table
}

/// One weighted node's state while filling: its node index, next preferred
/// slot, skip, `2 · skip mod M` (the stride of each of the two probe
/// streams), quota and turn credit. 32 bytes: 1000 nodes' fillers and the
/// taken bitmap fit in L1 together.
struct Filler {
    index: u32,
    next: u32,
    skip: u32,
    skip2: u32,
    quota: u32,
    credit: u32,
    /// `skip⁻¹ mod M` and its Shoup constant `⌊skip⁻¹ · 2³² / M⌋`, set on
    /// the node's first turn in the tail (a skip's inverse is never 0).
    inverse: (u32, u32),
}

/// The fillers of the nodes with a quota, in name order; the name hashes are
/// computed together ([`h64_many`]).
fn fillers(nodes: &NodeSet, quotas: &[u64], m: u64, q_max: u32) -> Vec<Filler> {
    let weighted: Vec<usize> = (0..quotas.len()).filter(|&i| quotas[i] > 0).collect();
    let mut text = Vec::new();
    let mut ends = Vec::with_capacity(weighted.len());
    for &i in &weighted {
        text.extend_from_slice(nodes.nodes()[i].name.as_bytes());
        text.extend_from_slice(b"|maglev");
        ends.push(text.len());
    }
    let mut hashes = Vec::with_capacity(weighted.len());
    let starts = std::iter::once(0).chain(ends.iter().copied());
    h64_many(starts.zip(&ends).map(|(a, &b)| &text[a..b]), &mut hashes);
    weighted
        .iter()
        .zip(&hashes)
        .map(|(&i, &h)| {
            let skip = (h & 0xffff_ffff) % (m - 1) + 1;
            Filler {
                index: i as u32,
                next: ((h >> 32) % m) as u32,
                skip: skip as u32,
                skip2: ((2 * skip) % m) as u32,
                quota: quotas[i] as u32,
                // Starting one short of a full turn makes the cumulative
                // count ceil(q·r/q_max): equal quotas take one slot per round
                // from the first round on, as in the paper.
                credit: q_max.saturating_sub(1),
                inverse: (0, 0),
            }
        })
        .collect()
}

/// `(pos + step) mod m` for `pos < m` and `step < m`, without a division.
///
/// Comparing `pos` against `m − step` (loop-invariant for a walk) rather than
/// adding first and comparing the sum keeps the dependency chain from one
/// position to the next at a compare and a conditional move; the build's
/// probes are bound by that chain.
#[inline]
fn advance(pos: u32, step: u32, m: u32) -> u32 {
    let back = m - step;
    if pos >= back { pos - back } else { pos + step }
}

/// `a⁻¹ mod m` for a prime `m` and `0 < a < m` (extended Euclid).
fn inverse_mod(a: u64, m: u64) -> u64 {
    let (mut r0, mut r1) = (m as i64, a as i64);
    let (mut t0, mut t1) = (0i64, 1i64);
    while r1 != 0 {
        let q = r0 / r1;
        (r0, r1) = (r1, r0 - q * r1);
        (t0, t1) = (t1, t0 - q * t1);
    }
    t0.rem_euclid(m as i64) as u64
}

/// Every free slot, in no particular order.
fn free_slots(taken: &[u64], m: u32) -> Vec<u32> {
    let mut free = Vec::new();
    for (w, &bits) in taken.iter().enumerate() {
        let mut open = !bits;
        while open != 0 {
            let slot = w as u32 * 64 + open.trailing_zeros();
            if slot >= m {
                break;
            }
            free.push(slot);
            open &= open - 1;
        }
    }
    free
}

/// Of the (non-empty) free slots, the one the walk `start, start + skip, …`
/// reaches first, and its position in `free`. Slot `x` is step
/// `k = (x − start) · skip⁻¹ mod m` of that walk; distinct slots have
/// distinct steps, so the smallest `k` is exactly the slot a one-at-a-time
/// walk would stop at. `(inv, shoup) = (skip⁻¹, ⌊skip⁻¹ · 2³² / m⌋)` turns
/// the reduction into multiplications (Shoup's method; all values < 2²⁴).
fn earliest_free(free: &[u32], start: u32, (inv, shoup): (u32, u32), m: u32) -> (usize, u32) {
    let (inv, shoup, m64) = (u64::from(inv), u64::from(shoup), u64::from(m));
    let mut best = (u64::MAX, 0);
    for (at, &x) in free.iter().enumerate() {
        let d = u64::from(if x >= start {
            x - start
        } else {
            x + (m - start)
        });
        let q = (d * shoup) >> 32;
        let r = d * inv - q * m64;
        let k = if r >= m64 { r - m64 } else { r };
        if k < best.0 {
            best = (k, at);
        }
    }
    (best.1, free[best.1])
}

/// The first free slot on the walk `start, start + skip, start + 2·skip, …`
/// (mod `m`), given `skip2 = 2·skip mod m`.
///
/// The walk is split into two streams of stride `2·skip`: `a` takes the even
/// steps and `b` the odd ones, and `a` is tested before `b` each time, so the
/// slots are still tested in walk order and the first free one wins, exactly
/// as in a one-slot-at-a-time walk. The two position chains are independent,
/// so the CPU computes them in parallel: this roughly doubles probe
/// throughput, which is most of a build's cost.
///
/// The caller guarantees a free slot exists; since `m` is prime and
/// `1 ≤ skip < m`, the walk visits every slot within `m` steps.
fn next_free(taken: &[u64], start: u32, skip: u32, skip2: u32, m: u32) -> u32 {
    let is_free = |slot: u32| taken[slot as usize / 64] & (1 << (slot % 64)) == 0;
    let mut a = start;
    let mut b = advance(start, skip, m);
    loop {
        if is_free(a) {
            return a;
        }
        if is_free(b) {
            return b;
        }
        a = advance(a, skip2, m);
        b = advance(b, skip2, m);
    }
}
