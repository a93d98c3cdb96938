//! Placement: which backend owns a key, and who is next in line.
//!
//! This is the pure core of magpie: synchronous, no tokio, no I/O, and no
//! allocation per lookup. Every scheme is built once from a [`NodeSet`] (nodes
//! sorted by name, so the order of a config file never changes a table) and then
//! answers [`Scheme::candidates`]: the distinct nodes for a key hash, primary
//! first, as indices into the `NodeSet`.
//!
//! The proxy uses [`maglev`] (default) or [`ring`], optionally with
//! [`bounded`] loads on top; the others exist for the lab (`magpie simulate`).
//! [`limits`] bounds what a build may cost; config validation checks the same
//! numbers. [`slow_start`] says which of a joining backend's keys have moved
//! to it yet.

pub mod bounded;
pub mod jump;
pub mod limits;
pub mod maglev;
pub mod modn;
pub mod rendezvous;
pub mod ring;
pub mod slow_start;
pub mod walk;

pub use limits::{MAX_LAB_RING_POINTS, MAX_RING_POINTS, MAX_TABLE_SIZE, MAX_WEIGHT};

/// The most candidates a lookup yields. Deduplication uses an inline array of
/// this size, so a lookup never allocates; a pool larger than this is still
/// served, but a walk past full or down backends gives up after this many.
pub const MAX_CANDIDATES: usize = 64;

/// One member of a pool, as placement sees it: a name (its identity, hashed)
/// and a weight (0 means no share of new keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub weight: u32,
}

impl Node {
    pub fn new(name: impl Into<String>, weight: u32) -> Self {
        Node {
            name: name.into(),
            weight,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlacementError {
    #[error("no nodes to place keys on")]
    Empty,
    #[error("duplicate node name {0:?}")]
    DuplicateName(String),
    #[error("empty node name")]
    EmptyName,
    #[error("every node has weight 0: nothing can take a key")]
    AllWeightsZero,
    #[error("table size {0} is not prime")]
    TableSizeNotPrime(u64),
    #[error("table size {size} is smaller than the number of nodes ({nodes})")]
    TableTooSmall { size: u64, nodes: usize },
    #[error("table size {0} is too large (at most {MAX_TABLE_SIZE})")]
    TableTooLarge(u64),
    #[error("points per weight must be at least 1")]
    NoPoints,
    #[error("ring would have {0} points (at most {MAX_RING_POINTS})")]
    TooManyPoints(u64),
    #[error("lab ring would have {0} points (at most {MAX_LAB_RING_POINTS})")]
    TooManyLabPoints(u64),
    #[error("bounded-load factor {0} must be a number >= 1.0")]
    BadLoadFactor(f64),
}

/// A validated pool: nodes sorted by name, names unique and non-empty, at least
/// one node with a positive weight. Candidate indices refer to this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSet {
    nodes: Vec<Node>,
}

impl NodeSet {
    pub fn new(nodes: impl IntoIterator<Item = Node>) -> Result<Self, PlacementError> {
        let mut nodes: Vec<Node> = nodes.into_iter().collect();
        if nodes.is_empty() {
            return Err(PlacementError::Empty);
        }
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        if nodes.iter().any(|n| n.name.is_empty()) {
            return Err(PlacementError::EmptyName);
        }
        if let Some(pair) = nodes.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(PlacementError::DuplicateName(pair[0].name.clone()));
        }
        if nodes.iter().all(|n| n.weight == 0) {
            return Err(PlacementError::AllWeightsZero);
        }
        Ok(NodeSet { nodes })
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn total_weight(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.weight)).sum()
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes
            .binary_search_by(|n| n.name.as_str().cmp(name))
            .ok()
    }
}

/// A placement scheme: built once, then asked for the candidates of a key hash.
pub trait Scheme {
    type Candidates<'a>: Iterator<Item = usize>
    where
        Self: 'a;

    /// Distinct node indices for `key`, primary first, at most
    /// [`MAX_CANDIDATES`]; never allocates.
    fn candidates(&self, key: u64) -> Self::Candidates<'_>;

    /// The node that owns `key` when nobody is skipped.
    fn primary(&self, key: u64) -> Option<usize> {
        self.candidates(key).next()
    }
}

/// The inline set behind candidate deduplication: at most `MAX_CANDIDATES`
/// entries, linear scan (tiny, and in cache).
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    ids: [u32; MAX_CANDIDATES],
    len: usize,
}

impl Seen {
    pub(crate) fn new() -> Self {
        Seen {
            ids: [0; MAX_CANDIDATES],
            len: 0,
        }
    }

    /// Records `id`; false if it was already there.
    pub(crate) fn insert(&mut self, id: u32) -> bool {
        if self.ids[..self.len].contains(&id) {
            return false;
        }
        if !self.is_full() {
            self.ids[self.len] = id;
            self.len += 1;
        }
        true
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len == MAX_CANDIDATES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_set_sorts_and_validates() {
        let set = NodeSet::new([Node::new("b", 1), Node::new("a", 2)]).unwrap();
        assert_eq!(set.nodes()[0].name, "a");
        assert_eq!(set.index_of("b"), Some(1));
        assert_eq!(set.total_weight(), 3);
        assert_eq!(NodeSet::new([]), Err(PlacementError::Empty));
        assert_eq!(
            NodeSet::new([Node::new("a", 1), Node::new("a", 2)]),
            Err(PlacementError::DuplicateName("a".into()))
        );
        assert_eq!(
            NodeSet::new([Node::new("a", 0)]),
            Err(PlacementError::AllWeightsZero)
        );
    }

    #[test]
    fn seen_deduplicates() {
        let mut seen = Seen::new();
        assert!(seen.insert(3));
        assert!(!seen.insert(3));
        assert!(seen.insert(4));
        assert_eq!(seen.len(), 2);
        assert!(!seen.is_full());
    }
}
