//! The placement lab behind `magpie simulate`.
//!
//! It reproduces the classic consistent-hashing experiment: place keys
//! `user:0 … user:{K−1}` on nodes `0 … N−1`, let node `N` join (or one node
//! leave), and measure for each scheme the share of keys that changed owner,
//! whether every moved key went to the new node, and the busiest node's key
//! count over the mean, before and after. Options add the usual follow-up
//! questions: weights, hot keys, salting, replicas across zones.
//!
//! The conventions are fixed so results compare with other implementations of
//! the same experiment (README lists them): key hash = `h64(key text)`;
//! mod N and jump number the nodes `0 … N−1` numerically; rendezvous takes the
//! largest `h64("{n}|{key}")`, ties to the earlier node. Where the library
//! scheme is the convention (ring points, Maglev, jump, mod N, bounded caps),
//! the lab calls the library, so it measures the code that routes traffic.
//! Node indices of a [`NodeSet`] follow *name* order ("0", "1", "10", "2", …);
//! the lab always translates them back to node numbers.
//!
//! [`run`] is pure (no I/O); [`main`] parses, runs and prints.

use std::io::Write as _;

use serde::Serialize;

use crate::hash::{h64, h64_parts};
use crate::placement::bounded;
use crate::placement::jump::Jump;
use crate::placement::maglev::{self, Maglev};
use crate::placement::modn::ModN;
use crate::placement::rendezvous::{log_score, unit_interval};
use crate::placement::ring::Ring;
use crate::placement::{Node, NodeSet, PlacementError, Scheme};

/// The schemes, in the order of the table and of `rows` in `--json`.
pub const SCHEMES: [&str; 9] = [
    "mod-n",
    "ring-1",
    "ring-10",
    "ring-100",
    "ring-1000",
    "rendezvous",
    "jump",
    "bounded-ring",
    "maglev",
];

/// bounded-ring's factor c and its points per node.
pub const BOUNDED_FACTOR: f64 = 1.10;
const BOUNDED_POINTS: u32 = 100;
/// The ring the `--replicas` walk uses.
const REPLICA_POINTS: u32 = 100;

const MAX_KEYS: u64 = 10_000_000;
const MAX_NODES: u32 = 1000;
/// ring-1000 gives a node 1000 · weight points; this keeps rings in memory.
const MAX_WEIGHT: u32 = 100;
const MAX_SALT: u32 = 1000;

/// `magpie simulate`'s options.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SimulateArgs {
    /// Number of keys, named user:0 … user:{N-1}.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Nodes before the change, named 0 … N-1; node N then joins.
    #[arg(long, default_value_t = 10)]
    pub nodes: u32,
    /// Remove this node instead of adding one; reports where its keys went.
    #[arg(long, value_name = "NODE")]
    pub remove: Option<String>,
    /// Give NODE the weight W (others weigh 1); repeatable.
    #[arg(long, value_name = "NODE=W")]
    pub weight: Vec<String>,
    /// Keys whose index is divisible by round(1/FRACTION) carry FACTOR times
    /// the request load; reports the peak request load over the mean.
    #[arg(long, value_name = "FRACTION:FACTOR")]
    pub hot: Option<String>,
    /// Split each hot key into K sub-keys `{key}#s{i}` (needs --hot).
    #[arg(long, value_name = "K")]
    pub salt: Option<u32>,
    /// Place R replicas per key on the 100-point ring (needs --zones).
    #[arg(long, value_name = "R")]
    pub replicas: Option<u32>,
    /// Put node i in zone i mod Z and require distinct zones (needs --replicas).
    #[arg(long, value_name = "Z")]
    pub zones: Option<u32>,
    /// Print the report as JSON, with unrounded fractions.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("--keys must be from 1 to {MAX_KEYS}, got {0}")]
    Keys(u64),
    #[error("--nodes must be from 1 to {MAX_NODES}, got {0}")]
    Nodes(u32),
    #[error("{option} {value:?}: no such node (nodes are 0 … {last})")]
    NoSuchNode {
        option: &'static str,
        value: String,
        last: u32,
    },
    #[error("--remove needs at least 2 nodes")]
    RemoveLast,
    #[error("--weight {0:?}: expected NODE=W with W from 0 to {MAX_WEIGHT}, e.g. 3=2")]
    Weight(String),
    #[error("--weight given twice for node {0}")]
    WeightTwice(u32),
    #[error(
        "--hot {0:?}: expected FRACTION:FACTOR with 0 < FRACTION <= 1 and FACTOR >= 1, e.g. 0.01:100"
    )]
    Hot(String),
    #[error("--salt needs --hot")]
    SaltWithoutHot,
    #[error("--salt must be from 1 to {MAX_SALT}, got {0}")]
    Salt(u32),
    #[error("--replicas and --zones go together")]
    ReplicasWithoutZones,
    #[error("--replicas {replicas}: must be from 1 to the {nodes} weighted nodes")]
    Replicas { replicas: u32, nodes: usize },
    #[error(
        "--zones {zones}: {replicas} replicas in distinct zones need {replicas} zones holding weighted nodes, only {populated} do"
    )]
    Zones {
        zones: u32,
        replicas: u32,
        populated: usize,
    },
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("cannot write the report: {0}")]
    Output(#[from] std::io::Error),
    #[error("cannot encode the report: {0}")]
    Json(#[from] serde_json::Error),
}

/// What happens to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Node `n` joins (always the next number).
    Add(u32),
    /// Node `n` leaves.
    Remove(u32),
}

/// Hot keys: every `every`-th key index (0 included) carries `factor` times
/// the request load of the others.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Hot {
    pub fraction: f64,
    pub factor: f64,
    pub every: u64,
}

/// A validated experiment; built by [`Experiment::from_args`].
#[derive(Debug, Clone, PartialEq)]
pub struct Experiment {
    keys: u64,
    nodes: u32,
    change: Change,
    /// (node number, weight), sorted by node; unlisted nodes weigh 1.
    weights: Vec<(u32, u32)>,
    hot: Option<Hot>,
    salt: Option<u32>,
    /// (replicas, zones).
    replicas: Option<(u32, u32)>,
}

impl Experiment {
    pub fn from_args(args: &SimulateArgs) -> Result<Experiment, SimulateError> {
        if !(1..=MAX_KEYS).contains(&args.keys) {
            return Err(SimulateError::Keys(args.keys));
        }
        if !(1..=MAX_NODES).contains(&args.nodes) {
            return Err(SimulateError::Nodes(args.nodes));
        }
        let change = match &args.remove {
            None => Change::Add(args.nodes),
            Some(text) => {
                let node = parse_node(text, args.nodes - 1, "--remove")?;
                if args.nodes < 2 {
                    return Err(SimulateError::RemoveLast);
                }
                Change::Remove(node)
            }
        };
        let last = match change {
            Change::Add(n) => n,
            Change::Remove(_) => args.nodes - 1,
        };
        let mut weights = Vec::new();
        for text in &args.weight {
            let (node, w) = text
                .split_once('=')
                .ok_or_else(|| SimulateError::Weight(text.clone()))?;
            let node = parse_node(node.trim(), last, "--weight")?;
            let w: u32 = w
                .trim()
                .parse()
                .ok()
                .filter(|w| *w <= MAX_WEIGHT)
                .ok_or_else(|| SimulateError::Weight(text.clone()))?;
            if weights.iter().any(|&(n, _)| n == node) {
                return Err(SimulateError::WeightTwice(node));
            }
            weights.push((node, w));
        }
        weights.sort_unstable();
        let hot = args.hot.as_deref().map(parse_hot).transpose()?;
        let salt = match (args.salt, hot) {
            (None, _) => None,
            (Some(_), None) => return Err(SimulateError::SaltWithoutHot),
            (Some(k), Some(_)) if !(1..=MAX_SALT).contains(&k) => {
                return Err(SimulateError::Salt(k));
            }
            (Some(k), Some(_)) => Some(k),
        };
        let replicas = match (args.replicas, args.zones) {
            (None, None) => None,
            (Some(r), Some(z)) => Some((r, z)),
            _ => return Err(SimulateError::ReplicasWithoutZones),
        };
        let experiment = Experiment {
            keys: args.keys,
            nodes: args.nodes,
            change,
            weights,
            hot,
            salt,
            replicas,
        };
        // Pool-level checks (all weights zero, replicas and zones) up front,
        // so a bad option fails before any work.
        let (before, _) = experiment.pools()?;
        if let Some((r, z)) = replicas {
            let weighted: Vec<u32> = before
                .ids
                .iter()
                .zip(&before.weights)
                .filter(|(_, w)| **w > 0)
                .map(|(id, _)| *id)
                .collect();
            if r == 0 || r as usize > weighted.len() {
                return Err(SimulateError::Replicas {
                    replicas: r,
                    nodes: weighted.len(),
                });
            }
            let mut zones: Vec<u32> = weighted.iter().map(|id| id % z.max(1)).collect();
            zones.sort_unstable();
            zones.dedup();
            if z == 0 || zones.len() < r as usize {
                return Err(SimulateError::Zones {
                    zones: z,
                    replicas: r,
                    populated: if z == 0 { 0 } else { zones.len() },
                });
            }
        }
        Ok(experiment)
    }

    fn weight_of(&self, node: u32) -> u32 {
        self.weights
            .iter()
            .find(|&&(n, _)| n == node)
            .map_or(1, |&(_, w)| w)
    }

    fn pools(&self) -> Result<(Pool, Pool), SimulateError> {
        let before: Vec<u32> = (0..self.nodes).collect();
        let after: Vec<u32> = match self.change {
            Change::Add(n) => (0..=n).collect(),
            Change::Remove(r) => before.iter().copied().filter(|&n| n != r).collect(),
        };
        Ok((Pool::new(self, before)?, Pool::new(self, after)?))
    }
}

fn parse_node(text: &str, last: u32, option: &'static str) -> Result<u32, SimulateError> {
    text.parse::<u32>()
        .ok()
        // Only canonical numbers name a node: "03" is not node 3.
        .filter(|n| *n <= last && n.to_string() == text)
        .ok_or_else(|| SimulateError::NoSuchNode {
            option,
            value: text.to_string(),
            last,
        })
}

fn parse_hot(text: &str) -> Result<Hot, SimulateError> {
    let bad = || SimulateError::Hot(text.to_string());
    let (fraction, factor) = text.split_once(':').ok_or_else(bad)?;
    let fraction: f64 = fraction.trim().parse().map_err(|_| bad())?;
    let factor: f64 = factor.trim().parse().map_err(|_| bad())?;
    let fraction_ok = fraction > 0.0 && fraction <= 1.0;
    let factor_ok = factor.is_finite() && factor >= 1.0;
    if !fraction_ok || !factor_ok {
        return Err(bad());
    }
    Ok(Hot {
        fraction,
        factor,
        every: (1.0 / fraction).round().max(1.0) as u64,
    })
}

/// One side of the change: node numbers in numeric order, their weights, and
/// the `NodeSet` (name order) the library schemes are built from.
#[derive(Debug)]
struct Pool {
    ids: Vec<u32>,
    weights: Vec<u32>,
    set: NodeSet,
    /// `NodeSet` index → node number.
    number_of: Vec<u32>,
}

impl Pool {
    fn new(experiment: &Experiment, ids: Vec<u32>) -> Result<Pool, SimulateError> {
        let weights: Vec<u32> = ids.iter().map(|&id| experiment.weight_of(id)).collect();
        let set = NodeSet::new(
            ids.iter()
                .zip(&weights)
                .map(|(id, &w)| Node::new(id.to_string(), w)),
        )?;
        // Names are the decimal numbers, so parsing them back cannot fail.
        let number_of = set
            .nodes()
            .iter()
            .map(|n| n.name.parse().unwrap_or(u32::MAX))
            .collect();
        Ok(Pool {
            ids,
            weights,
            set,
            number_of,
        })
    }

    fn len(&self) -> u32 {
        self.ids.len() as u32
    }

    fn total_weight(&self) -> u64 {
        self.weights.iter().map(|&w| u64::from(w)).sum()
    }
}

/// One key: its text, `h64` of the text, and the request load it carries.
#[derive(Debug, Clone)]
struct Key {
    text: String,
    hash: u64,
    load: f64,
}

fn plain_keys(experiment: &Experiment) -> Vec<Key> {
    (0..experiment.keys)
        .map(|i| {
            let text = format!("user:{i}");
            let load = match experiment.hot {
                Some(hot) if i % hot.every == 0 => hot.factor,
                _ => 1.0,
            };
            Key {
                hash: h64(text.as_bytes()),
                text,
                load,
            }
        })
        .collect()
}

/// The key list with every hot key split into `salt` sub-keys `{key}#s{i}`,
/// each carrying `factor / salt` of the load, in index order.
fn salted_keys(plain: &[Key], hot: Hot, salt: u32) -> Vec<Key> {
    let mut keys =
        Vec::with_capacity(plain.len() + plain.len() / hot.every as usize * salt as usize);
    for (i, key) in plain.iter().enumerate() {
        if !(i as u64).is_multiple_of(hot.every) {
            keys.push(key.clone());
            continue;
        }
        for s in 0..salt {
            let text = format!("{}#s{s}", key.text);
            keys.push(Key {
                hash: h64(text.as_bytes()),
                text,
                load: hot.factor / f64::from(salt),
            });
        }
    }
    keys
}

/// Places every key on `pool` with `scheme`; returns node numbers.
fn place(scheme: &str, pool: &Pool, keys: &[Key]) -> Result<Vec<u32>, SimulateError> {
    let by_scheme = |s: &dyn Fn(u64) -> Option<usize>| -> Vec<u32> {
        keys.iter()
            .map(|k| s(k.hash).map_or(u32::MAX, |i| pool.number_of[i]))
            .collect()
    };
    Ok(match scheme {
        "mod-n" => {
            let m = ModN::new(pool.len())?;
            keys.iter()
                .map(|k| m.primary(k.hash).map_or(u32::MAX, |i| pool.ids[i]))
                .collect()
        }
        "jump" => {
            let j = Jump::new(pool.len())?;
            keys.iter()
                .map(|k| j.primary(k.hash).map_or(u32::MAX, |i| pool.ids[i]))
                .collect()
        }
        "ring-1" | "ring-10" | "ring-100" | "ring-1000" => {
            let points = scheme["ring-".len()..].parse().unwrap_or(1);
            let ring = Ring::for_lab(&pool.set, points)?;
            by_scheme(&|h| ring.primary(h))
        }
        "maglev" => {
            let m = Maglev::new(&pool.set, maglev::DEFAULT_TABLE_SIZE)?;
            by_scheme(&|h| m.primary(h))
        }
        "rendezvous" => place_rendezvous(pool, keys),
        "bounded-ring" => place_bounded(pool, keys)?,
        other => unreachable!("unknown scheme {other}"),
    })
}

/// The lab's rendezvous: the largest `h64("{n}|{key}")`, ties to the earlier
/// node number. With unequal weights the score is the logarithmic method's
/// `-w / ln(u)` of that same hash, which ranks exactly like the hash itself
/// when the weights are equal.
fn place_rendezvous(pool: &Pool, keys: &[Key]) -> Vec<u32> {
    let names: Vec<String> = pool.ids.iter().map(|id| format!("{id}|")).collect();
    let positive: Vec<u32> = pool.weights.iter().copied().filter(|&w| w > 0).collect();
    let uniform = positive.windows(2).all(|w| w[0] == w[1]);
    keys.iter()
        .map(|key| {
            let mut best: Option<(f64, u64, u32)> = None;
            for (j, name) in names.iter().enumerate() {
                let w = pool.weights[j];
                if w == 0 {
                    continue;
                }
                let h = h64_parts(&[name.as_bytes(), key.text.as_bytes()]);
                let score = if uniform {
                    0.0
                } else {
                    log_score(w, unit_interval(h))
                };
                // Strictly greater wins, so a tie stays with the earlier node.
                let wins = match best {
                    None => true,
                    Some((_, bh, _)) if uniform => h > bh,
                    Some((s, _, _)) => score > s,
                };
                if wins {
                    best = Some((score, h, pool.ids[j]));
                }
            }
            best.map_or(u32::MAX, |b| b.2)
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
fn peak(sums: &[f64]) -> f64 {
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
    /// `"add"` or `"remove"`.
    pub change: &'static str,
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
    pub scheme: &'static str,
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
    let mut warnings = Vec::new();
    for pool in [&before, &after] {
        if let Some(w) = maglev::sparse_warning(maglev::DEFAULT_TABLE_SIZE, pool.set.len())
            && !warnings.contains(&w)
        {
            warnings.push(w);
        }
    }
    let count = keys.len() as f64;
    let mut rows = Vec::with_capacity(SCHEMES.len());
    for scheme in SCHEMES {
        let a = place(scheme, &before, &keys)?;
        let b = place(scheme, &after, &keys)?;
        let moved: Vec<usize> = (0..keys.len()).filter(|&k| a[k] != b[k]).collect();
        let only_to_new = match experiment.change {
            Change::Add(n) => moved.iter().all(|&k| b[k] == n),
            Change::Remove(r) => moved.iter().all(|&k| a[k] == r),
        };
        let counts_before = per_node(&before, &a, |_| 1.0);
        let counts_after = per_node(&after, &b, |_| 1.0);
        let went_to = match experiment.change {
            Change::Add(_) => None,
            Change::Remove(r) => {
                let mut got = vec![0u64; after.ids.len()];
                for (k, &owner) in a.iter().enumerate() {
                    if owner == r
                        && let Some(j) = after.ids.iter().position(|&id| id == b[k])
                    {
                        got[j] += 1;
                    }
                }
                Some(
                    after
                        .ids
                        .iter()
                        .zip(got)
                        .map(|(id, keys)| Received {
                            node: id.to_string(),
                            keys,
                        })
                        .collect(),
                )
            }
        };
        let weights = experiment
            .weights
            .iter()
            .map(|&(node, weight)| {
                let side = |pool: &Pool, counts: &[f64]| {
                    pool.ids.iter().position(|&id| id == node).map(|j| {
                        let per_unit = count / pool.total_weight() as f64;
                        (counts[j] as u64, counts[j] / per_unit)
                    })
                };
                let b4 = side(&before, &counts_before);
                let af = side(&after, &counts_after);
                WeightShare {
                    node: node.to_string(),
                    weight,
                    keys_before: b4.map(|x| x.0),
                    units_before: b4.map(|x| x.1),
                    keys_after: af.map(|x| x.0),
                    units_after: af.map(|x| x.1),
                }
            })
            .collect();
        let uses_weights =
            (!experiment.weights.is_empty()).then_some(!matches!(scheme, "mod-n" | "jump"));
        let load =
            |pool: &Pool, owners: &[u32], ks: &[Key]| peak(&per_node(pool, owners, |k| ks[k].load));
        let (load_peak_before, load_peak_after) = match experiment.hot {
            Some(_) => (
                Some(load(&before, &a, &keys)),
                Some(load(&after, &b, &keys)),
            ),
            None => (None, None),
        };
        let (salted_load_peak_before, salted_load_peak_after) = match &salted {
            Some(s) => {
                let sa = place(scheme, &before, s)?;
                let sb = place(scheme, &after, s)?;
                (Some(load(&before, &sa, s)), Some(load(&after, &sb, s)))
            }
            None => (None, None),
        };
        rows.push(Row {
            scheme,
            moved: moved.len() as f64 / count,
            only_to_new,
            peak_before: peak(&counts_before),
            peak_after: peak(&counts_after),
            went_to,
            uses_weights,
            weights,
            load_peak_before,
            load_peak_after,
            salted_load_peak_before,
            salted_load_peak_after,
        });
    }
    let replicas = match experiment.replicas {
        Some((r, z)) => Some(replica_report(&before, &keys, r, z)?),
        None => None,
    };
    let (change, node) = match experiment.change {
        Change::Add(n) => ("add", n),
        Change::Remove(n) => ("remove", n),
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

fn pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

/// The human-readable report.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let last_key = report.keys - 1;
    let what = match report.change {
        "add" => format!("node {} joins", report.node),
        _ => format!("node {} leaves", report.node),
    };
    out.push_str(&format!(
        "{} keys (user:0 … user:{last_key}) on {} nodes, then {what}\n\n",
        report.keys, report.nodes_before
    ));
    let minimal = if report.change == "add" {
        "only to new"
    } else {
        "only its keys"
    };
    out.push_str(&format!(
        "{:<13} {:>8}  {:<13} {:>15} {:>14}\n",
        "scheme", "moved", minimal, "max/mean before", "max/mean after"
    ));
    for row in &report.rows {
        out.push_str(&format!(
            "{:<13} {:>8}  {:<13} {:>15.3} {:>14.3}\n",
            row.scheme,
            pct(row.moved),
            if row.only_to_new { "yes" } else { "no" },
            row.peak_before,
            row.peak_after
        ));
    }
    if report.change == "remove" {
        out.push_str(&format!(
            "\nwhere node {}'s keys went (keys per receiving node)\n",
            report.node
        ));
        if let Some(first) = report.rows.first().and_then(|r| r.went_to.as_ref()) {
            out.push_str(&format!("{:<13}", "scheme"));
            for r in first {
                out.push_str(&format!(" {:>6}", r.node));
            }
            out.push('\n');
        }
        for row in &report.rows {
            out.push_str(&format!("{:<13}", row.scheme));
            for r in row.went_to.iter().flatten() {
                out.push_str(&format!(" {:>6}", r.keys));
            }
            out.push('\n');
        }
    }
    if report.rows.iter().any(|r| !r.weights.is_empty()) {
        out.push_str("\nweighted nodes: keys, and keys over the pool's keys per unit of weight (a weight-W node should show about W)\n");
        for row in &report.rows {
            let mut line = format!("{:<13}", row.scheme);
            for w in &row.weights {
                let side = |k: Option<u64>, u: Option<f64>| match (k, u) {
                    (Some(k), Some(u)) => format!("{k} keys = {u:.2}x"),
                    _ => "absent".to_string(),
                };
                line.push_str(&format!(
                    "  node {} (w={}): before {}, after {}",
                    w.node,
                    w.weight,
                    side(w.keys_before, w.units_before),
                    side(w.keys_after, w.units_after)
                ));
            }
            if row.uses_weights == Some(false) {
                line.push_str("  (ignores weights)");
            }
            out.push_str(&line);
            out.push('\n');
        }
    }
    if let Some(hot) = report.hot {
        out.push_str(&format!(
            "\nhot keys: every {}th key (fraction {}) carries {}x load; peak request load over the mean\n",
            hot.every, hot.fraction, hot.factor
        ));
        let salted = report.salt.map(|k| format!("salted into {k}"));
        out.push_str(&format!(
            "{:<13} {:>12} {:>12}",
            "scheme", "before", "after"
        ));
        if let Some(s) = &salted {
            out.push_str(&format!("   {s}: {:>8} {:>8}", "before", "after"));
        }
        out.push('\n');
        for row in &report.rows {
            out.push_str(&format!(
                "{:<13} {:>12.3} {:>12.3}",
                row.scheme,
                row.load_peak_before.unwrap_or(0.0),
                row.load_peak_after.unwrap_or(0.0)
            ));
            if let (Some(s), Some(b), Some(a)) = (
                &salted,
                row.salted_load_peak_before,
                row.salted_load_peak_after,
            ) {
                out.push_str(&format!("   {:>w$} {b:>8.3} {a:>8.3}", "", w = s.len() + 1));
            }
            out.push('\n');
        }
    }
    if let Some(rep) = &report.replicas {
        out.push_str(&format!(
            "\nreplicas: {} per key on ring-100 over the {} nodes before, zone = node mod {}\n\
             zone rule changed the replica set of {} keys ({}); max/mean replicas per node {:.3} plain, {:.3} zoned\n",
            rep.replicas,
            report.nodes_before,
            rep.zones,
            rep.changed_keys,
            pct(rep.changed),
            rep.peak_plain,
            rep.peak_zoned
        ));
    }
    out
}

/// `magpie simulate`: validate, run, print the table or JSON; warnings go to
/// stderr. A closed stdout (`| head`) ends the command quietly.
pub fn main(args: &SimulateArgs) -> Result<(), SimulateError> {
    let experiment = Experiment::from_args(args)?;
    let report = run(&experiment)?;
    let mut stderr = std::io::stderr().lock();
    for w in &report.warnings {
        writeln!(stderr, "warning: {w}")?;
    }
    let text = if args.json {
        let mut json = serde_json::to_string_pretty(&report)?;
        json.push('\n');
        json
    } else {
        render(&report)
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(keys: u64) -> SimulateArgs {
        SimulateArgs {
            keys,
            nodes: 10,
            ..SimulateArgs::default()
        }
    }

    fn report(a: &SimulateArgs) -> Report {
        run(&Experiment::from_args(a).unwrap()).unwrap()
    }

    fn row<'a>(r: &'a Report, scheme: &str) -> &'a Row {
        r.rows.iter().find(|x| x.scheme == scheme).unwrap()
    }

    #[test]
    fn default_experiment_shows_the_classic_result() {
        let r = report(&args(20_000));
        assert_eq!((r.keys, r.nodes_before, r.nodes_after), (20_000, 10, 11));
        assert_eq!(r.rows.iter().map(|x| x.scheme).collect::<Vec<_>>(), SCHEMES);
        let ideal = 1.0 / 11.0;
        let m = row(&r, "mod-n");
        assert!(
            (m.moved - 10.0 / 11.0).abs() < 0.02,
            "mod-n moved {}",
            m.moved
        );
        assert!(!m.only_to_new);
        for s in ["ring-100", "ring-1000", "rendezvous", "jump", "maglev"] {
            let x = row(&r, s);
            assert!((x.moved - ideal).abs() < 0.02, "{s} moved {}", x.moved);
        }
        for s in [
            "ring-1",
            "ring-10",
            "ring-100",
            "ring-1000",
            "rendezvous",
            "jump",
        ] {
            assert!(row(&r, s).only_to_new, "{s}");
        }
        // More points, better balance; bounded-ring keeps its cap.
        assert!(row(&r, "ring-1").peak_before > row(&r, "ring-1000").peak_before);
        assert!(row(&r, "ring-1000").peak_before < 1.1);
        let b = row(&r, "bounded-ring");
        assert!(
            b.peak_before <= 1.10 + 1e-9 && b.peak_after <= 1.10 + 1e-9,
            "{b:?}"
        );
        assert!(row(&r, "maglev").peak_before < 1.05);
        assert!(r.warnings.is_empty());
    }

    #[test]
    fn keys_option_sets_the_key_count() {
        let r = report(&args(3_000));
        assert_eq!(r.keys, 3_000);
        // Fractions are whole keys out of 3000.
        for x in &r.rows {
            let moved = x.moved * 3_000.0;
            assert!((moved - moved.round()).abs() < 1e-6, "{x:?}");
        }
        assert!(render(&r).contains("3000 keys (user:0 … user:2999)"));
        assert!(matches!(
            Experiment::from_args(&args(0)),
            Err(SimulateError::Keys(0))
        ));
    }

    #[test]
    fn nodes_option_sets_the_pool_size() {
        let r = report(&SimulateArgs {
            nodes: 40,
            ..args(10_000)
        });
        assert_eq!(
            (r.nodes_before, r.nodes_after, r.node.as_str()),
            (40, 41, "40")
        );
        assert!((row(&r, "mod-n").moved - 40.0 / 41.0).abs() < 0.02);
        assert!((row(&r, "jump").moved - 1.0 / 41.0).abs() < 0.01);
        assert!(row(&r, "jump").only_to_new);
        for bad in [0, MAX_NODES + 1] {
            let a = SimulateArgs {
                nodes: bad,
                ..args(10)
            };
            assert!(matches!(
                Experiment::from_args(&a),
                Err(SimulateError::Nodes(_))
            ));
        }
    }

    #[test]
    fn remove_option_reports_where_the_keys_went() {
        let a = SimulateArgs {
            remove: Some("3".into()),
            ..args(10_000)
        };
        let r = report(&a);
        assert_eq!((r.nodes_before, r.nodes_after, r.change), (10, 9, "remove"));
        for x in &r.rows {
            let went = x.went_to.as_ref().unwrap();
            assert_eq!(went.len(), 9);
            assert!(went.iter().all(|w| w.node != "3"));
            let received: u64 = went.iter().map(|w| w.keys).sum();
            // Every key node 3 held went somewhere, and nothing else counts.
            let held = (x.moved * 10_000.0).round() as u64;
            if x.only_to_new {
                assert_eq!(received, held, "{}", x.scheme);
            } else {
                assert!(received <= held, "{}", x.scheme);
            }
        }
        // Names, not positions: ring and rendezvous move only node 3's keys;
        // jump renumbers buckets 4..9 and moves far more.
        for s in ["ring-100", "ring-1000", "rendezvous"] {
            let x = row(&r, s);
            assert!(x.only_to_new, "{s}");
            assert!((x.moved - 0.1).abs() < 0.02, "{s} {}", x.moved);
        }
        assert!(!row(&r, "jump").only_to_new);
        assert!(row(&r, "jump").moved > 0.3);
        assert!(row(&r, "maglev").moved < 0.1 + 0.02);
        // Rendezvous spreads the removed keys over all survivors.
        let went = row(&r, "rendezvous").went_to.as_ref().unwrap();
        assert!(went.iter().all(|w| w.keys > 50), "{went:?}");
        assert!(render(&r).contains("where node 3's keys went"));

        for bad in ["10", "03", "x", "-1"] {
            let a = SimulateArgs {
                remove: Some(bad.into()),
                ..args(10)
            };
            assert!(
                matches!(
                    Experiment::from_args(&a),
                    Err(SimulateError::NoSuchNode { .. })
                ),
                "{bad}"
            );
        }
        let one = SimulateArgs {
            nodes: 1,
            remove: Some("0".into()),
            ..args(10)
        };
        assert!(matches!(
            Experiment::from_args(&one),
            Err(SimulateError::RemoveLast)
        ));
    }

    #[test]
    fn weight_option_gives_a_heavier_node_more_keys() {
        let a = SimulateArgs {
            weight: vec!["3=2".into()],
            ..args(20_000)
        };
        let r = report(&a);
        for s in ["ring-1000", "rendezvous", "maglev", "bounded-ring"] {
            let x = row(&r, s);
            assert_eq!(x.uses_weights, Some(true));
            let w = &x.weights[0];
            assert_eq!((w.node.as_str(), w.weight), ("3", 2));
            let units = w.units_before.unwrap();
            assert!((units - 2.0).abs() < 0.15, "{s}: {units}");
            assert!((w.units_after.unwrap() - 2.0).abs() < 0.15, "{s}");
        }
        let m = row(&r, "mod-n");
        assert_eq!(m.uses_weights, Some(false));
        // mod N ignores the weight: node 3 gets a plain 1/10, i.e. 1.1 units of 11.
        assert!((m.weights[0].units_before.unwrap() - 1.1).abs() < 0.1);
        assert!(render(&r).contains("(ignores weights)"));

        // The joining node can be weighted too, and weight 0 drains a node.
        let a = SimulateArgs {
            weight: vec!["10=2".into(), "0=0".into()],
            ..args(5_000)
        };
        let r = report(&a);
        let x = row(&r, "maglev");
        assert_eq!(x.weights[1].node, "10");
        assert_eq!(x.weights[1].keys_before, None);
        assert_eq!(x.weights[0].keys_before, Some(0));

        for bad in ["3", "3=x", "3=-1", "3=101", "11=2", "x=1"] {
            let a = SimulateArgs {
                weight: vec![bad.into()],
                ..args(10)
            };
            assert!(Experiment::from_args(&a).is_err(), "{bad}");
        }
        let twice = SimulateArgs {
            weight: vec!["1=2".into(), "1=3".into()],
            ..args(10)
        };
        assert!(matches!(
            Experiment::from_args(&twice),
            Err(SimulateError::WeightTwice(1))
        ));
        let all_zero = SimulateArgs {
            nodes: 1,
            remove: None,
            weight: vec!["0=0".into(), "1=0".into()],
            ..args(10)
        };
        assert!(matches!(
            Experiment::from_args(&all_zero),
            Err(SimulateError::Placement(PlacementError::AllWeightsZero))
        ));
    }

    #[test]
    fn hot_option_reports_request_load() {
        // Factor 1: request load is the key count.
        let flat = report(&SimulateArgs {
            hot: Some("0.01:1".into()),
            ..args(5_000)
        });
        for x in &flat.rows {
            assert!((x.load_peak_before.unwrap() - x.peak_before).abs() < 1e-9);
            assert!((x.load_peak_after.unwrap() - x.peak_after).abs() < 1e-9);
        }
        let hot = report(&SimulateArgs {
            hot: Some("0.01:100".into()),
            ..args(10_000)
        });
        assert_eq!(hot.hot.unwrap().every, 100);
        // 100 hot keys carry about half the load: a few of them decide the
        // peak, and even the best-balanced schemes get visibly uneven.
        for s in ["ring-1000", "rendezvous", "maglev"] {
            let x = row(&hot, s);
            assert!(
                x.load_peak_before.unwrap() > x.peak_before + 0.05,
                "{s}: {x:?}"
            );
        }
        // Caps on key counts do not cap request load.
        let b = row(&hot, "bounded-ring");
        assert!(b.peak_before <= BOUNDED_FACTOR + 1e-9);
        assert!(b.load_peak_before.unwrap() > BOUNDED_FACTOR + 0.02, "{b:?}");
        assert!(render(&hot).contains("hot keys: every 100th key"));
        for bad in ["0:5", "0.5", "2:3", "0.1:0.5", "x:1", "0.1:inf"] {
            let a = SimulateArgs {
                hot: Some(bad.into()),
                ..args(10)
            };
            assert!(
                matches!(Experiment::from_args(&a), Err(SimulateError::Hot(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn salt_option_spreads_hot_keys() {
        let a = SimulateArgs {
            hot: Some("0.01:1000".into()),
            salt: Some(16),
            ..args(10_000)
        };
        let r = report(&a);
        assert_eq!(r.salt, Some(16));
        for s in ["ring-1000", "rendezvous", "jump", "maglev"] {
            let x = row(&r, s);
            let (plain, salted) = (
                x.load_peak_before.unwrap(),
                x.salted_load_peak_before.unwrap(),
            );
            assert!(salted < plain - 0.1, "{s}: {plain} -> {salted}");
            assert!(
                x.salted_load_peak_after.unwrap() < x.load_peak_after.unwrap(),
                "{s}"
            );
        }
        // Salting replaces each hot key by K sub-keys with the same total load.
        let e = Experiment::from_args(&a).unwrap();
        let plain = plain_keys(&e);
        let salted = salted_keys(&plain, e.hot.unwrap(), 16);
        assert_eq!(salted.len(), 10_000 + 100 * 15);
        let sum = |ks: &[Key]| ks.iter().map(|k| k.load).sum::<f64>();
        assert!((sum(&plain) - sum(&salted)).abs() < 1e-6);
        assert_eq!(salted[0].text, "user:0#s0");
        assert_eq!(salted[16].text, "user:1");

        let no_hot = SimulateArgs {
            salt: Some(4),
            ..args(10)
        };
        assert!(matches!(
            Experiment::from_args(&no_hot),
            Err(SimulateError::SaltWithoutHot)
        ));
        let zero = SimulateArgs {
            salt: Some(0),
            hot: Some("0.1:2".into()),
            ..args(10)
        };
        assert!(matches!(
            Experiment::from_args(&zero),
            Err(SimulateError::Salt(0))
        ));
    }

    #[test]
    fn replicas_and_zones_option() {
        let with = |r: u32, z: u32| SimulateArgs {
            replicas: Some(r),
            zones: Some(z),
            ..args(10_000)
        };
        // Two zones by parity: a plain pair lands in one zone about 4 times
        // in 9, and the zone rule must then change it.
        let rep = report(&with(2, 2)).replicas.unwrap();
        assert!((rep.changed - 4.0 / 9.0).abs() < 0.05, "{rep:?}");
        // One zone per node: the rule never changes anything.
        let rep = report(&with(3, 10)).replicas.unwrap();
        assert_eq!(rep.changed_keys, 0);
        assert_eq!(rep.peak_plain, rep.peak_zoned);
        assert!(render(&report(&with(2, 5))).contains("zone rule changed the replica set"));

        for (r, z) in [(0, 2), (11, 20), (3, 2), (2, 0)] {
            assert!(Experiment::from_args(&with(r, z)).is_err(), "{r} {z}");
        }
        let alone = SimulateArgs {
            replicas: Some(2),
            ..args(10)
        };
        assert!(matches!(
            Experiment::from_args(&alone),
            Err(SimulateError::ReplicasWithoutZones)
        ));
    }

    #[test]
    fn json_has_the_fixed_shape_and_ids() {
        let r = report(&args(2_000));
        let text = serde_json::to_string(&r).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["keys"], 2_000);
        assert_eq!(v["nodes_before"], 10);
        assert_eq!(v["nodes_after"], 11);
        let rows = v["rows"].as_array().unwrap();
        let ids: Vec<&str> = rows.iter().map(|x| x["scheme"].as_str().unwrap()).collect();
        assert_eq!(
            ids,
            [
                "mod-n",
                "ring-1",
                "ring-10",
                "ring-100",
                "ring-1000",
                "rendezvous",
                "jump",
                "bounded-ring",
                "maglev"
            ]
        );
        for x in rows {
            assert!(x["moved"].as_f64().unwrap() > 0.0);
            assert!(x["only_to_new"].is_boolean());
            assert!(x["peak_before"].as_f64().unwrap() >= 1.0);
            assert!(x["peak_after"].as_f64().unwrap() >= 1.0);
            // Options not given leave no trace.
            assert!(x.get("went_to").is_none() && x.get("load_peak_before").is_none());
        }
        let table = render(&r);
        for id in SCHEMES {
            assert!(table.lines().any(|l| l.starts_with(id)), "{id}");
        }
    }

    /// The lab follows the fixed conventions; values from an independent
    /// Python transcription over `hashlib.blake2b(digest_size=8)`.
    #[test]
    fn lab_conventions_golden() {
        let e = Experiment::from_args(&args(10)).unwrap();
        let (pool, _) = e.pools().unwrap();
        let keys: Vec<Key> = ["user:0", "user:1", "user:42", "user:99999", "session-abc"]
            .iter()
            .map(|t| Key {
                text: t.to_string(),
                hash: h64(t.as_bytes()),
                load: 1.0,
            })
            .collect();
        let got = |s: &str| place(s, &pool, &keys).unwrap();
        assert_eq!(got("mod-n"), [1, 8, 2, 8, 3]);
        assert_eq!(got("jump"), [2, 1, 9, 3, 3]);
        assert_eq!(got("rendezvous"), [4, 4, 8, 9, 0]);
        assert_eq!(got("ring-100"), [8, 0, 6, 6, 4]);
    }
}
