//! Placing every key with each of the lab's schemes. Where the library
//! scheme is the convention (ring points, Maglev, jump, mod N, bounded caps,
//! rendezvous ranking), the lab calls the library, so it measures the code
//! that routes traffic.

use serde::Serialize;

use super::experiment::{Key, Pool};
use super::{BOUNDED_FACTOR, BOUNDED_POINTS, SimulateError};
use crate::hash::h64_parts;
use crate::placement::Scheme;
use crate::placement::bounded;
use crate::placement::jump::Jump;
use crate::placement::maglev::{self, Maglev};
use crate::placement::modn::ModN;
use crate::placement::rendezvous::Rank;
use crate::placement::ring::Ring;

/// The lab's schemes, in the order of the table and of `rows` in `--json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemeId {
    ModN,
    Ring1,
    Ring10,
    Ring100,
    Ring1000,
    Rendezvous,
    Jump,
    BoundedRing,
    Maglev,
}

impl SchemeId {
    pub const ALL: [SchemeId; 9] = [
        SchemeId::ModN,
        SchemeId::Ring1,
        SchemeId::Ring10,
        SchemeId::Ring100,
        SchemeId::Ring1000,
        SchemeId::Rendezvous,
        SchemeId::Jump,
        SchemeId::BoundedRing,
        SchemeId::Maglev,
    ];

    /// The id in the table and in `--json`.
    pub const fn as_str(self) -> &'static str {
        match self {
            SchemeId::ModN => "mod-n",
            SchemeId::Ring1 => "ring-1",
            SchemeId::Ring10 => "ring-10",
            SchemeId::Ring100 => "ring-100",
            SchemeId::Ring1000 => "ring-1000",
            SchemeId::Rendezvous => "rendezvous",
            SchemeId::Jump => "jump",
            SchemeId::BoundedRing => "bounded-ring",
            SchemeId::Maglev => "maglev",
        }
    }

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

impl std::fmt::Display for SchemeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
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
        SchemeId::Rendezvous => place_rendezvous(pool, keys),
        SchemeId::BoundedRing => place_bounded(pool, keys)?,
    })
}

/// The lab's rendezvous: the node with the highest rank for
/// `h64("{n}|{key}")`, ties to the earlier node number. The ranking rule is
/// the library's ([`Rank`]): the hash itself when every weighted node has
/// the same weight, else the logarithmic method's score of that hash; only
/// the per-node hash (by node number, the lab's convention) is the lab's own.
fn place_rendezvous(pool: &Pool, keys: &[Key]) -> Vec<u32> {
    let names: Vec<String> = pool.ids.iter().map(|id| format!("{id}|")).collect();
    let positive: Vec<u32> = pool.weights.iter().copied().filter(|&w| w > 0).collect();
    let uniform = positive.windows(2).all(|w| w[0] == w[1]);
    keys.iter()
        .map(|key| {
            let mut best: Option<(Rank, u32)> = None;
            for (j, name) in names.iter().enumerate() {
                let w = pool.weights[j];
                if w == 0 {
                    continue;
                }
                let h = h64_parts(&[name.as_bytes(), key.text.as_bytes()]);
                let rank = Rank::of(w, h, uniform);
                // Strictly higher wins, so a tie stays with the earlier node.
                if best.is_none_or(|(b, _)| rank.beats(b)) {
                    best = Some((rank, pool.ids[j]));
                }
            }
            best.map_or(u32::MAX, |b| b.1)
        })
        .collect()
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
            let index = match bounded::pick_by(ring.candidates(key.hash), |i| loads[i] < caps[i]) {
                Some(p) => p.index,
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
