//! Placing every key with each of the lab's schemes. Where the library
//! scheme is the convention (ring points, Maglev, jump, mod N, bounded caps,
//! rendezvous ranking), the lab calls the library, so it measures the code
//! that routes traffic.

use serde::Serialize;

use super::experiment::{Key, Pool};
use super::{BOUNDED_FACTOR, BOUNDED_POINTS, SimulateError};
use magpie_core::hash::h64_many;
use magpie_core::labels;
use magpie_core::placement::Scheme;
use magpie_core::placement::bounded;
use magpie_core::placement::jump::Jump;
use magpie_core::placement::maglev::{self, Maglev};
use magpie_core::placement::modn::ModN;
use magpie_core::placement::rendezvous::Rank;
use magpie_core::placement::ring::Ring;

labels! {
    /// The lab's schemes, in the order of the table and of `rows` in
    /// `--json`; each with its id there.
    pub enum SchemeId {
        ModN => "mod-n",
        Ring1 => "ring-1",
        Ring10 => "ring-10",
        Ring100 => "ring-100",
        Ring1000 => "ring-1000",
        Rendezvous => "rendezvous",
        Jump => "jump",
        BoundedRing => "bounded-ring",
        Maglev => "maglev",
    }
}

impl SchemeId {
    /// Whether the scheme gives a heavier node more keys at all.
    pub fn uses_weights(self) -> bool {
        !matches!(self, SchemeId::ModN | SchemeId::Jump)
    }
}

impl Serialize for SchemeId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl PartialEq<&str> for SchemeId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Places every key on `pool` with `scheme`; returns node numbers.
pub(super) fn place(
    scheme: SchemeId,
    pool: &Pool,
    keys: &[Key],
) -> Result<Vec<u32>, SimulateError> {
    let by_scheme = |s: &dyn Fn(u64) -> Option<usize>| -> Vec<u32> {
        keys.iter()
            .map(|k| s(k.hash).map_or(u32::MAX, |i| pool.number_of[i]))
            .collect()
    };
    Ok(match scheme {
        SchemeId::ModN => {
            let m = ModN::new(pool.len())?;
            keys.iter()
                .map(|k| m.primary(k.hash).map_or(u32::MAX, |i| pool.ids[i]))
                .collect()
        }
        SchemeId::Jump => {
            let j = Jump::new(pool.len())?;
            keys.iter()
                .map(|k| j.primary(k.hash).map_or(u32::MAX, |i| pool.ids[i]))
                .collect()
        }
        SchemeId::Ring1 | SchemeId::Ring10 | SchemeId::Ring100 | SchemeId::Ring1000 => {
            let points = match scheme {
                SchemeId::Ring1 => 1,
                SchemeId::Ring10 => 10,
                SchemeId::Ring100 => 100,
                _ => 1000,
            };
            let ring = Ring::for_lab(&pool.set, points)?;
            by_scheme(&|h| ring.primary(h))
        }
        SchemeId::Maglev => {
            let m = Maglev::new(&pool.set, maglev::DEFAULT_TABLE_SIZE)?;
            by_scheme(&|h| m.primary(h))
        }
        SchemeId::Rendezvous => place_rendezvous(&[pool], keys).pop().unwrap_or_default(),
        SchemeId::BoundedRing => place_bounded(pool, keys)?,
    })
}

/// Node numbers per key on the pool before and after the change.
pub(super) type Placed = (Vec<u32>, Vec<u32>);

/// Places every key on both pools with every scheme, the independent pieces
/// side by side ([`parallel`](super::parallel)); `(before, after)` node
/// numbers per scheme, in [`SchemeId::ALL`] order. The same as calling
/// [`place`] for each scheme and pool.
pub(super) fn place_all(
    before: &Pool,
    after: &Pool,
    keys: &[Key],
) -> Result<Vec<Placed>, SimulateError> {
    enum Job<'a> {
        Side(SchemeId, &'a Pool),
        /// Rendezvous for a range of keys, on both pools at once: a node's
        /// hash for a key does not depend on the pool.
        Rendezvous(std::ops::Range<usize>),
    }
    enum Done {
        Side(Result<Vec<u32>, SimulateError>),
        Rendezvous(Vec<Vec<u32>>),
    }
    // Longest first: the dense rings and bounded-ring's walk, then the
    // rest; rendezvous, the most hashing by far, comes last in chunks small
    // enough to even out the workers' finishing times.
    let order = [
        SchemeId::Ring1000,
        SchemeId::BoundedRing,
        SchemeId::Ring100,
        SchemeId::Maglev,
        SchemeId::Ring10,
        SchemeId::Jump,
        SchemeId::Ring1,
        SchemeId::ModN,
    ];
    let mut jobs: Vec<Job> = order
        .iter()
        .flat_map(|&id| [Job::Side(id, before), Job::Side(id, after)])
        .collect();
    let chunk = keys.len().div_ceil(32).max(1024);
    jobs.extend(
        (0..keys.len())
            .step_by(chunk)
            .map(|start| Job::Rendezvous(start..keys.len().min(start + chunk))),
    );
    let done = super::parallel::map(jobs, |job| match job {
        Job::Side(id, pool) => Done::Side(place(id, pool, keys)),
        Job::Rendezvous(range) => {
            Done::Rendezvous(place_rendezvous(&[before, after], &keys[range]))
        }
    });
    let mut sides = Vec::new();
    let (mut rv_before, mut rv_after) = (Vec::new(), Vec::new());
    for d in done {
        match d {
            Done::Side(owners) => sides.push(owners?),
            Done::Rendezvous(pair) => {
                let mut pair = pair.into_iter();
                rv_before.extend(pair.next().into_iter().flatten());
                rv_after.extend(pair.next().into_iter().flatten());
            }
        }
    }
    let mut placed: Vec<(SchemeId, Placed)> =
        order.iter().copied().zip(sides_in_pairs(sides)).collect();
    placed.push((SchemeId::Rendezvous, (rv_before, rv_after)));
    Ok(SchemeId::ALL
        .iter()
        .map(|id| {
            placed
                .iter_mut()
                .find(|(x, _)| x == id)
                .map(|(_, p)| std::mem::take(p))
                .unwrap_or_default()
        })
        .collect())
}

/// `[a0, b0, a1, b1, …]` as `[(a0, b0), (a1, b1), …]`.
fn sides_in_pairs(sides: Vec<Vec<u32>>) -> Vec<Placed> {
    let mut sides = sides.into_iter();
    std::iter::from_fn(|| Some((sides.next()?, sides.next()?))).collect()
}

/// The lab's rendezvous, on several pools at once: for each pool, the node
/// with the highest rank for `h64("{n}|{key}")`, ties to the earlier node
/// number. The ranking rule is the library's ([`Rank`]): the hash itself
/// when every weighted node has the same weight, else the logarithmic
/// method's score of that hash; only the per-node hash (by node number, the
/// lab's convention) is the lab's own. Each (node, key) is hashed once
/// whatever the number of pools, and many at a time ([`h64_many`]).
fn place_rendezvous(pools: &[&Pool], keys: &[Key]) -> Vec<Vec<u32>> {
    let weighted = |p: &'_ Pool| -> Vec<(u32, u32)> {
        p.ids
            .iter()
            .zip(&p.weights)
            .filter(|(_, w)| **w > 0)
            .map(|(&id, &w)| (id, w))
            .collect()
    };
    // Every weighted node of any pool, ascending; a node's weight is the
    // same in every pool.
    let mut union: Vec<u32> = pools
        .iter()
        .flat_map(|p| weighted(p))
        .map(|(id, _)| id)
        .collect();
    union.sort_unstable();
    union.dedup();
    if union.is_empty() {
        return pools.iter().map(|_| vec![u32::MAX; keys.len()]).collect();
    }
    let names: Vec<String> = union.iter().map(|id| format!("{id}|")).collect();
    // Per pool: (position in `union`, weight, node number) in pool order,
    // and whether its weighted nodes all weigh the same.
    type Members = Vec<(usize, u32, u32)>;
    let ranked: Vec<(Members, bool)> = pools
        .iter()
        .map(|p| {
            let members = weighted(p);
            let uniform = members.windows(2).all(|w| w[0].1 == w[1].1);
            let members = members
                .into_iter()
                .map(|(id, w)| (union.partition_point(|&u| u < id), w, id))
                .collect();
            (members, uniform)
        })
        .collect();
    let mut owners: Vec<Vec<u32>> = pools
        .iter()
        .map(|_| Vec::with_capacity(keys.len()))
        .collect();
    let (mut text, mut ends, mut hashes) = (Vec::new(), Vec::new(), Vec::new());
    for batch in keys.chunks(64) {
        text.clear();
        ends.clear();
        hashes.clear();
        for key in batch {
            for name in &names {
                text.extend_from_slice(name.as_bytes());
                text.extend_from_slice(key.text.as_bytes());
                ends.push(text.len());
            }
        }
        let starts = std::iter::once(0).chain(ends.iter().copied());
        h64_many(starts.zip(&ends).map(|(a, &b)| &text[a..b]), &mut hashes);
        for row in hashes.chunks(names.len()) {
            for ((members, uniform), out) in ranked.iter().zip(owners.iter_mut()) {
                let mut best: Option<(Rank, u32)> = None;
                for &(at, w, id) in members {
                    let rank = Rank::of(w, row[at], *uniform);
                    // Strictly higher wins, so a tie stays with the earlier node.
                    if best.is_none_or(|(b, _)| rank.beats(b)) {
                        best = Some((rank, id));
                    }
                }
                out.push(best.map_or(u32::MAX, |b| b.1));
            }
        }
    }
    owners
}

/// bounded-ring: keys in index order on the 100-point ring, each node capped at
/// `ceil(c · keys · w / W)` keys; a key whose node is full walks clockwise to
/// the next node below its cap.
fn place_bounded(pool: &Pool, keys: &[Key]) -> Result<Vec<u32>, SimulateError> {
    let ring = Ring::for_lab(&pool.set, BOUNDED_POINTS)?;
    let total_weight = pool.set.total_weight();
    let caps: Vec<u64> = pool
        .set
        .nodes()
        .iter()
        // cap(c, T, w, W) = ceil(c · (T + 1) · w / W): T + 1 = keys gives the
        // static cap.
        .map(|n| {
            bounded::cap(
                BOUNDED_FACTOR,
                keys.len() as u64 - 1,
                n.weight,
                total_weight,
            )
        })
        .collect();
    let mut loads = vec![0u64; pool.set.len()];
    let points = ring.points();
    Ok(keys
        .iter()
        .map(|key| {
            let index = match ring.candidates(key.hash).find(|&i| loads[i] < caps[i]) {
                Some(index) => index,
                // Only past MAX_CANDIDATES distinct nodes: keep walking points.
                None => {
                    let start = ring.point_for(key.hash);
                    (0..points.len())
                        .map(|d| points[(start + d) % points.len()].1 as usize)
                        .find(|&i| loads[i] < caps[i])
                        // The caps sum to at least the key count, so some node
                        // has room; the primary is a safe fallback regardless.
                        .unwrap_or(points[start].1 as usize)
                }
            };
            loads[index] += 1;
            pool.number_of[index]
        })
        .collect())
}
