//! Running the experiment: place every key before and after the change with
//! each scheme, and measure what moved and how evenly the keys (and their
//! load) spread. Pure and deterministic; `--json` prints the [`Report`] as is.

use serde::Serialize;

use super::experiment::{Change, Experiment, Hot, Key, Pool, plain_keys, salted_keys};
use super::place::{Placed, SchemeId, place_all};
use super::{REPLICA_POINTS, SimulateError};
use magpie_core::placement::maglev;
use magpie_core::placement::ring::Ring;

/// What happened to the pool, as `--json` writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Add,
    Remove,
}

/// Per-node sums over `pool`, in the pool's numeric order.
fn per_node(pool: &Pool, owners: &[u32], amount: impl Fn(usize) -> f64) -> Vec<f64> {
    let size = pool.ids.iter().max().map_or(0, |&m| m as usize + 1);
    let mut sums = vec![0.0; size];
    for (k, &owner) in owners.iter().enumerate() {
        if let Some(s) = sums.get_mut(owner as usize) {
            *s += amount(k);
        }
    }
    pool.ids.iter().map(|&id| sums[id as usize]).collect()
}

/// The largest per-node amount over the mean per node.
pub(super) fn peak(sums: &[f64]) -> f64 {
    let total: f64 = sums.iter().sum();
    let max = sums.iter().copied().fold(0.0, f64::max);
    if total == 0.0 {
        0.0
    } else {
        max / (total / sums.len() as f64)
    }
}

/// The whole report; `--json` prints it as is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub keys: u64,
    pub nodes_before: usize,
    pub nodes_after: usize,
    /// A node joined (`add`) or left (`remove`).
    pub change: ChangeKind,
    /// The node that joined or left.
    pub node: String,
    pub rows: Vec<Row>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hot: Option<Hot>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub salt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicaReport>,
    /// Things a caller should tell the user (e.g. a sparse Maglev table).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One scheme's results. Fractions are unrounded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub scheme: SchemeId,
    /// Share of keys whose owner changed.
    pub moved: f64,
    /// On a join: every moved key went to the new node. On a removal: only the
    /// removed node's keys moved.
    pub only_to_new: bool,
    /// Busiest node's key count over keys / nodes, before and after.
    pub peak_before: f64,
    pub peak_after: f64,
    /// `--remove`: how many of the removed node's keys each node received.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub went_to: Option<Vec<Received>>,
    /// `--weight`: whether the scheme takes weights into account at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uses_weights: Option<bool>,
    /// `--weight`: what each weighted node received.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<WeightShare>,
    /// `--hot`: busiest node's request load over the mean load.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_peak_before: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_peak_after: Option<f64>,
    /// `--salt`: the same, with hot keys split into sub-keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub salted_load_peak_before: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub salted_load_peak_after: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Received {
    pub node: String,
    pub keys: u64,
}

/// A weighted node's keys; `*_units` is its keys over the pool's keys per unit
/// of weight, so a scheme that honours weights shows about `weight` there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightShare {
    pub node: String,
    pub weight: u32,
    pub keys_before: Option<u64>,
    pub units_before: Option<f64>,
    pub keys_after: Option<u64>,
    pub units_after: Option<f64>,
}

/// `--replicas R --zones Z` on the 100-point ring of the pool before the change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaReport {
    pub replicas: u32,
    pub zones: u32,
    /// Share of keys whose replica set the zone rule changed.
    pub changed: f64,
    pub changed_keys: u64,
    /// Busiest node's replica count over the mean, without and with zones.
    pub peak_plain: f64,
    pub peak_zoned: f64,
}

/// Runs the experiment. Pure: no I/O, deterministic.
pub fn run(experiment: &Experiment) -> Result<Report, SimulateError> {
    let (before, after) = experiment.pools()?;
    let keys = plain_keys(experiment);
    let salted = match (experiment.hot, experiment.salt) {
        (Some(hot), Some(salt)) => Some(salted_keys(&keys, hot, salt)),
        _ => None,
    };
    let warnings = sparse_warnings(&[&before, &after]);
    let trial = Trial {
        experiment,
        before: &before,
        after: &after,
        keys: &keys,
        salted: salted.as_deref(),
    };
    let rows = trial.rows()?;
    let replicas = match experiment.replicas {
        Some((r, z)) => Some(replica_report(&before, &keys, r, z)?),
        None => None,
    };
    let (change, node) = match experiment.change {
        Change::Add(n) => (ChangeKind::Add, n),
        Change::Remove(n) => (ChangeKind::Remove, n),
    };
    Ok(Report {
        keys: experiment.keys,
        nodes_before: before.ids.len(),
        nodes_after: after.ids.len(),
        change,
        node: node.to_string(),
        rows,
        hot: experiment.hot,
        salt: experiment.salt,
        replicas,
        warnings,
    })
}

/// Maglev's sparse-table warnings for the pools, each once.
fn sparse_warnings(pools: &[&Pool]) -> Vec<String> {
    let mut warnings = Vec::new();
    for pool in pools {
        if let Some(w) = maglev::sparse_warning(maglev::DEFAULT_TABLE_SIZE, pool.set.len())
            && !warnings.contains(&w)
        {
            warnings.push(w);
        }
    }
    warnings
}

/// What every scheme's row is measured on: the experiment, its pools before
/// and after the change, its keys and, with `--salt`, the salted keys.
struct Trial<'a> {
    experiment: &'a Experiment,
    before: &'a Pool,
    after: &'a Pool,
    keys: &'a [Key],
    salted: Option<&'a [Key]>,
}

impl Trial<'_> {
    /// Places the keys (and the salted keys) with every scheme; one row per
    /// scheme, in [`SchemeId::ALL`] order.
    fn rows(&self) -> Result<Vec<Row>, SimulateError> {
        let placed = place_all(self.before, self.after, self.keys)?;
        let salted_placed = match self.salted {
            Some(s) => place_all(self.before, self.after, s)?,
            None => Vec::new(),
        };
        let mut salted_placed = salted_placed.into_iter();
        Ok(SchemeId::ALL
            .into_iter()
            .zip(placed)
            .map(|(scheme, placed)| self.row(scheme, placed, salted_placed.next()))
            .collect())
    }

    /// One scheme's row from its placement of the keys, `(a, b)`, and of the
    /// salted keys.
    fn row(&self, scheme: SchemeId, (a, b): Placed, salted: Option<Placed>) -> Row {
        let count = self.keys.len() as f64;
        let moved: Vec<usize> = (0..self.keys.len()).filter(|&k| a[k] != b[k]).collect();
        let counts_before = per_node(self.before, &a, |_| 1.0);
        let counts_after = per_node(self.after, &b, |_| 1.0);
        let (load_peak_before, load_peak_after) = match self.experiment.hot {
            Some(_) => (
                Some(load_peak(self.before, &a, self.keys)),
                Some(load_peak(self.after, &b, self.keys)),
            ),
            None => (None, None),
        };
        let (salted_load_peak_before, salted_load_peak_after) = match (self.salted, salted) {
            (Some(s), Some((sa, sb))) => (
                Some(load_peak(self.before, &sa, s)),
                Some(load_peak(self.after, &sb, s)),
            ),
            _ => (None, None),
        };
        let weighted = !self.experiment.weights.is_empty();
        Row {
            scheme,
            moved: moved.len() as f64 / count,
            only_to_new: only_minimum_moved(self.experiment.change, &moved, &a, &b),
            peak_before: peak(&counts_before),
            peak_after: peak(&counts_after),
            went_to: self.went_to(&a, &b),
            uses_weights: weighted.then_some(scheme.uses_weights()),
            weights: self.weight_shares(&counts_before, &counts_after),
            load_peak_before,
            load_peak_after,
            salted_load_peak_before,
            salted_load_peak_after,
        }
    }

    /// `--remove`: how many of the removed node's keys each node after the
    /// change received; `None` on a join.
    fn went_to(&self, a: &[u32], b: &[u32]) -> Option<Vec<Received>> {
        let Change::Remove(r) = self.experiment.change else {
            return None;
        };
        let ids = &self.after.ids;
        let mut got = vec![0u64; ids.len()];
        for (k, &owner) in a.iter().enumerate() {
            if owner == r
                && let Some(j) = ids.iter().position(|&id| id == b[k])
            {
                got[j] += 1;
            }
        }
        Some(
            ids.iter()
                .zip(got)
                .map(|(id, keys)| Received {
                    node: id.to_string(),
                    keys,
                })
                .collect(),
        )
    }

    /// `--weight`: each weighted node's keys before and after, from the
    /// per-node key counts of both pools.
    fn weight_shares(&self, counts_before: &[f64], counts_after: &[f64]) -> Vec<WeightShare> {
        let count = self.keys.len() as f64;
        let side = |pool: &Pool, counts: &[f64], node: u32| {
            pool.ids.iter().position(|&id| id == node).map(|j| {
                let per_unit = count / pool.total_weight() as f64;
                (counts[j] as u64, counts[j] / per_unit)
            })
        };
        self.experiment
            .weights
            .iter()
            .map(|&(node, weight)| {
                let b4 = side(self.before, counts_before, node);
                let af = side(self.after, counts_after, node);
                WeightShare {
                    node: node.to_string(),
                    weight,
                    keys_before: b4.map(|x| x.0),
                    units_before: b4.map(|x| x.1),
                    keys_after: af.map(|x| x.0),
                    units_after: af.map(|x| x.1),
                }
            })
            .collect()
    }
}

/// Whether only the least possible moved: on a join every moved key went to
/// the new node, on a removal every moved key was the removed node's.
/// `moved` lists the keys whose owner changed from `a` to `b`.
fn only_minimum_moved(change: Change, moved: &[usize], a: &[u32], b: &[u32]) -> bool {
    match change {
        Change::Add(n) => moved.iter().all(|&k| b[k] == n),
        Change::Remove(r) => moved.iter().all(|&k| a[k] == r),
    }
}

/// The busiest node's request load over the mean, `owners[k]` owning `keys[k]`.
fn load_peak(pool: &Pool, owners: &[u32], keys: &[Key]) -> f64 {
    peak(&per_node(pool, owners, |k| keys[k].load))
}

/// Walks the 100-point ring clockwise from each key's point, taking the next
/// `r` distinct nodes, then again requiring distinct zones (`node mod z`).
fn replica_report(
    pool: &Pool,
    keys: &[Key],
    r: u32,
    z: u32,
) -> Result<ReplicaReport, SimulateError> {
    let ring = Ring::new(&pool.set, REPLICA_POINTS)?;
    let points = ring.points();
    let r = r as usize;
    let size = pool.ids.iter().max().map_or(0, |&m| m as usize + 1);
    let (mut plain_load, mut zoned_load) = (vec![0.0; size], vec![0.0; size]);
    let mut changed = 0u64;
    let mut plain: Vec<u32> = Vec::with_capacity(r);
    let mut zoned: Vec<u32> = Vec::with_capacity(r);
    for key in keys {
        plain.clear();
        zoned.clear();
        let start = ring.point_for(key.hash);
        // Validation guarantees r weighted nodes in r distinct zones, so one
        // lap fills both lists.
        for d in 0..points.len() {
            let node = pool.number_of[points[(start + d) % points.len()].1 as usize];
            if plain.len() < r && !plain.contains(&node) {
                plain.push(node);
            }
            if zoned.len() < r && !zoned.iter().any(|&x| x % z == node % z) {
                zoned.push(node);
            }
            if plain.len() == r && zoned.len() == r {
                break;
            }
        }
        for &n in &plain {
            plain_load[n as usize] += 1.0;
        }
        for &n in &zoned {
            zoned_load[n as usize] += 1.0;
        }
        let mut sorted_plain = plain.clone();
        sorted_plain.sort_unstable();
        let mut sorted_zoned = zoned.clone();
        sorted_zoned.sort_unstable();
        changed += u64::from(sorted_plain != sorted_zoned);
    }
    let only_pool =
        |loads: &[f64]| -> Vec<f64> { pool.ids.iter().map(|&id| loads[id as usize]).collect() };
    Ok(ReplicaReport {
        replicas: r as u32,
        zones: z,
        changed: changed as f64 / keys.len() as f64,
        changed_keys: changed,
        peak_plain: peak(&only_pool(&plain_load)),
        peak_zoned: peak(&only_pool(&zoned_load)),
    })
}
