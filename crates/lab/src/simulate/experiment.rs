//! The experiment `magpie simulate` runs, validated from its options: the
//! pool before and after the change (node numbers, weights, the `NodeSet`
//! the library schemes are built from) and the keys with their loads.

use serde::Serialize;

use super::{MAX_KEYS, MAX_NODES, MAX_SALT, MAX_WEIGHT, SimulateArgs, SimulateError};
use magpie_core::hash::{h64, h64_many};
use magpie_core::placement::{Node, NodeSet};

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
    pub(super) keys: u64,
    pub(super) nodes: u32,
    pub(super) change: Change,
    /// (node number, weight), sorted by node; unlisted nodes weigh 1.
    pub(super) weights: Vec<(u32, u32)>,
    pub(super) hot: Option<Hot>,
    pub(super) salt: Option<u32>,
    /// (replicas, zones).
    pub(super) replicas: Option<(u32, u32)>,
}

impl Experiment {
    /// Validates `args` into an experiment; the first bad option is the error.
    pub fn from_args(args: &SimulateArgs) -> Result<Experiment, SimulateError> {
        if !(1..=MAX_KEYS).contains(&args.keys) {
            return Err(SimulateError::Keys(args.keys));
        }
        if !(1..=MAX_NODES).contains(&args.nodes) {
            return Err(SimulateError::Nodes(args.nodes));
        }
        let change = parse_change(args.remove.as_deref(), args.nodes)?;
        let last = match change {
            Change::Add(n) => n,
            Change::Remove(_) => args.nodes - 1,
        };
        let weights = parse_weights(&args.weight, last)?;
        let hot = args.hot.as_deref().map(parse_hot).transpose()?;
        let salt = check_salt(args.salt, hot)?;
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
            check_replicas(&before, r, z)?;
        }
        Ok(experiment)
    }

    fn weight_of(&self, node: u32) -> u32 {
        self.weights
            .iter()
            .find(|&&(n, _)| n == node)
            .map_or(1, |&(_, w)| w)
    }

    pub(super) fn pools(&self) -> Result<(Pool, Pool), SimulateError> {
        let before: Vec<u32> = (0..self.nodes).collect();
        let after: Vec<u32> = match self.change {
            Change::Add(n) => (0..=n).collect(),
            Change::Remove(r) => before.iter().copied().filter(|&n| n != r).collect(),
        };
        Ok((Pool::new(self, before)?, Pool::new(self, after)?))
    }
}

/// The change `--remove` asks for on a pool of `nodes` nodes: the next node
/// joins without it.
fn parse_change(remove: Option<&str>, nodes: u32) -> Result<Change, SimulateError> {
    match remove {
        None => Ok(Change::Add(nodes)),
        Some(text) => {
            let node = parse_node(text, nodes - 1, "--remove")?;
            if nodes < 2 {
                return Err(SimulateError::RemoveLast);
            }
            Ok(Change::Remove(node))
        }
    }
}

/// Every `--weight NODE=W` for nodes up to `last`, sorted by node; a node
/// given twice is an error.
fn parse_weights(texts: &[String], last: u32) -> Result<Vec<(u32, u32)>, SimulateError> {
    let mut weights = Vec::new();
    for text in texts {
        let (node, w) = parse_weight(text, last)?;
        if weights.iter().any(|&(n, _)| n == node) {
            return Err(SimulateError::WeightTwice(node));
        }
        weights.push((node, w));
    }
    weights.sort_unstable();
    Ok(weights)
}

/// One `--weight NODE=W`: the node (up to `last`) and its weight.
fn parse_weight(text: &str, last: u32) -> Result<(u32, u32), SimulateError> {
    let (node, w) = text
        .split_once('=')
        .ok_or_else(|| SimulateError::Weight(text.to_string()))?;
    let node = parse_node(node.trim(), last, "--weight")?;
    let w: u32 = w
        .trim()
        .parse()
        .ok()
        .filter(|w| *w <= MAX_WEIGHT)
        .ok_or_else(|| SimulateError::Weight(text.to_string()))?;
    Ok((node, w))
}

/// `--salt K`, which needs `--hot` and a K from 1 to [`MAX_SALT`].
fn check_salt(salt: Option<u32>, hot: Option<Hot>) -> Result<Option<u32>, SimulateError> {
    match (salt, hot) {
        (None, _) => Ok(None),
        (Some(_), None) => Err(SimulateError::SaltWithoutHot),
        (Some(k), Some(_)) if !(1..=MAX_SALT).contains(&k) => Err(SimulateError::Salt(k)),
        (Some(k), Some(_)) => Ok(Some(k)),
    }
}

/// `--replicas r --zones z` against `pool`: `r` must be from 1 to its
/// weighted nodes, and those nodes must fill at least `r` zones (`id mod z`).
fn check_replicas(pool: &Pool, r: u32, z: u32) -> Result<(), SimulateError> {
    let weighted: Vec<u32> = pool
        .ids
        .iter()
        .zip(&pool.weights)
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
    Ok(())
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
pub(super) struct Pool {
    pub(super) ids: Vec<u32>,
    pub(super) weights: Vec<u32>,
    pub(super) set: NodeSet,
    /// `NodeSet` index → node number.
    pub(super) number_of: Vec<u32>,
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

    pub(super) fn len(&self) -> u32 {
        self.ids.len() as u32
    }

    pub(super) fn total_weight(&self) -> u64 {
        self.weights.iter().map(|&w| u64::from(w)).sum()
    }
}

/// One key: its text, `h64` of the text, and the request load it carries.
#[derive(Debug, Clone)]
pub(super) struct Key {
    pub(super) text: String,
    pub(super) hash: u64,
    pub(super) load: f64,
}

pub(super) fn plain_keys(experiment: &Experiment) -> Vec<Key> {
    let texts: Vec<String> = (0..experiment.keys).map(|i| format!("user:{i}")).collect();
    let mut hashes = Vec::with_capacity(texts.len());
    h64_many(texts.iter().map(|t| t.as_bytes()), &mut hashes);
    texts
        .into_iter()
        .zip(hashes)
        .enumerate()
        .map(|(i, (text, hash))| {
            let load = match experiment.hot {
                Some(hot) if (i as u64).is_multiple_of(hot.every) => hot.factor,
                _ => 1.0,
            };
            Key { text, hash, load }
        })
        .collect()
}

/// The key list with every hot key split into `salt` sub-keys `{key}#s{i}`,
/// each carrying `factor / salt` of the load, in index order.
pub(super) fn salted_keys(plain: &[Key], hot: Hot, salt: u32) -> Vec<Key> {
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
