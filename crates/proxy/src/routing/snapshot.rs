//! The routing snapshot: one immutable picture of the pool, and the one
//! `ArcSwap` it is published through.
//!
//! `Config ──build──▶ Snapshot ──publish──▶ ArcSwap<Snapshot>`. A snapshot holds
//! the backends (sorted by name, the order placement indexes), the built
//! table, the settings the data path reads, a version and a fingerprint. The
//! proxy loads it once per connection, takes the `Arc<Backend>`s it needs and
//! drops it before any `.await`. Only a config change builds a new one; health
//! never does (a down backend is skipped at lookup instead).
//!
//! The fingerprint is a BLAKE2b-128 digest of how keys are read (and
//! `key.group`, when set), the load bound, the algorithm, the backend
//! names in order, and the table (Maglev: each slot's owner index; ring: each
//! point's hash and owner index). Identical backend sets give identical
//! fingerprints on every instance, so a fleet can prove it agrees.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blake2b_simd::Params;

use crate::config::{Algorithm, Config, KeyConfig, Role};
use crate::routing::backend::{Backend, Live};
use magpie_core::key::Fallback;
use magpie_core::placement::maglev::Maglev;
use magpie_core::placement::ring::Ring;
use magpie_core::placement::{Node, NodeSet, PlacementError, Scheme};

/// The table behind a snapshot.
#[derive(Debug)]
pub enum Table {
    Maglev(Maglev),
    Ring(Ring),
}

/// Candidates from either table, without boxing.
pub(crate) enum Candidates<'a> {
    Maglev(<Maglev as Scheme>::Candidates<'a>),
    Ring(<Ring as Scheme>::Candidates<'a>),
}

impl Iterator for Candidates<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match self {
            Candidates::Maglev(c) => c.next(),
            Candidates::Ring(c) => c.next(),
        }
    }
}

impl Table {
    pub(crate) fn candidates(&self, key: u64) -> Candidates<'_> {
        match self {
            Table::Maglev(m) => Candidates::Maglev(m.candidates(key)),
            Table::Ring(r) => Candidates::Ring(r.candidates(key)),
        }
    }

    /// Each node's share of new keys (table slots, or ring hash space).
    pub(crate) fn shares(&self) -> Vec<f64> {
        match self {
            Table::Maglev(m) => {
                let size = m.table_size() as f64;
                m.slot_counts()
                    .into_iter()
                    .map(|c| c as f64 / size)
                    .collect()
            }
            Table::Ring(r) => r.shares(),
        }
    }

    pub(crate) fn algorithm(&self) -> Algorithm {
        match self {
            Table::Maglev(_) => Algorithm::Maglev,
            Table::Ring(_) => Algorithm::Ring,
        }
    }
}

#[derive(Debug)]
pub struct Snapshot {
    pub version: u64,
    /// Hex BLAKE2b-128 of the table; see the module comment.
    pub fingerprint: String,
    /// Sorted by name: `table` candidates index into this.
    pub backends: Vec<Arc<Backend>>,
    pub table: Table,
    /// Each backend's share of new keys, in `backends` order.
    pub shares: Vec<f64>,
    pub(crate) total_weight: u64,
    pub config: Arc<Config>,
    /// How long building the table took.
    pub(crate) build_time: Duration,
    /// With `disaggregation`: the pool that takes prefill halves (its own
    /// backends, table and shares; a backend of role `both` is the same
    /// `Arc<Backend>` in both). The snapshot itself is the decode pool.
    pub prefill: Option<Arc<Snapshot>>,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("cannot build the table: {0}")]
    Placement(#[from] PlacementError),
}

impl Snapshot {
    /// The first snapshot of `config` (version 1, every backend's live state
    /// fresh): what `check`, `lookup` and `plan` compute, as a magpie
    /// starting with `config` would publish it.
    pub fn of(config: Arc<Config>) -> Result<Snapshot, SnapshotError> {
        Snapshot::build(config, 1, &HashMap::new())
    }

    /// Builds a snapshot from `config`. Backends whose name and address match
    /// one in `carry` keep that live state; the others start fresh. With
    /// `disaggregation` the table is the decode pool's, and the prefill
    /// pool is built beside it; the fingerprint covers both.
    pub(crate) fn build(
        config: Arc<Config>,
        version: u64,
        carry: &HashMap<(String, SocketAddr), Arc<Live>>,
    ) -> Result<Snapshot, SnapshotError> {
        let mut decode = Snapshot::pool(Arc::clone(&config), version, carry, Role::decodes)?;
        if config.disaggregation.is_some() {
            let mut carry = carry.clone();
            carry.extend(decode.live_states());
            let prefill = Snapshot::pool(config, version, &carry, Role::prefills)?;
            let mut h = Params::new().hash_length(16).to_state();
            h.update(decode.fingerprint.as_bytes());
            h.update(b"\0prefill\0");
            h.update(prefill.fingerprint.as_bytes());
            decode.fingerprint = h.finalize().to_hex().to_string();
            decode.prefill = Some(Arc::new(prefill));
        }
        Ok(decode)
    }

    /// The pool of `config`'s backends whose role `takes`: its table and
    /// live states (carried as [`Snapshot::build`] says).
    fn pool(
        config: Arc<Config>,
        version: u64,
        carry: &HashMap<(String, SocketAddr), Arc<Live>>,
        takes: fn(Role) -> bool,
    ) -> Result<Snapshot, SnapshotError> {
        let started = Instant::now();
        let members = || config.backends.iter().filter(|b| takes(b.role));
        let nodes = NodeSet::new(members().map(|b| Node::new(b.name.clone(), b.weight)))?;
        let table = match config.placement.algorithm {
            Algorithm::Maglev => Table::Maglev(Maglev::new(&nodes, config.placement.table_size)?),
            Algorithm::Ring => Table::Ring(Ring::new(&nodes, config.placement.points_per_weight)?),
        };
        // In the node set's order (by name); a map, since a scan per node
        // would be quadratic in the pool size.
        let by_name: HashMap<&str, &crate::config::BackendConfig> =
            members().map(|b| (b.name.as_str(), b)).collect();
        let backends: Vec<Arc<Backend>> = nodes
            .nodes()
            .iter()
            .filter_map(|n| by_name.get(n.name.as_str()).copied())
            .map(|b| {
                let live = carry.get(&(b.name.clone(), b.addr)).cloned();
                let live = live.unwrap_or_else(|| {
                    let fresh = Arc::new(Live::default());
                    // Added by a reload: it joins the pool now (slow start).
                    if version > 1 {
                        fresh.health.joined_at(tokio::time::Instant::now());
                    }
                    fresh
                });
                Arc::new(Backend::new(b, live))
            })
            .collect();
        let fingerprint = fingerprint(&config, &table, &backends);
        let shares = table.shares();
        let build_time = started.elapsed();
        Ok(Snapshot {
            version,
            fingerprint,
            total_weight: members().map(|b| u64::from(b.weight)).sum(),
            backends,
            table,
            shares,
            config,
            build_time,
            prefill: None,
        })
    }

    /// Every backend of either pool, each once: the decode pool's, then
    /// those that only prefill.
    pub fn every_backend(&self) -> impl Iterator<Item = &Arc<Backend>> + '_ {
        let prefill_only = (self.prefill.iter())
            .flat_map(|p| p.backends.iter())
            .filter(|b| !b.role.decodes());
        self.backends.iter().chain(prefill_only)
    }

    /// The live state of every backend, keyed by identity, for the next build.
    pub(crate) fn live_states(&self) -> HashMap<(String, SocketAddr), Arc<Live>> {
        self.every_backend()
            .map(|b| ((b.name.clone(), b.addr), Arc::clone(&b.live)))
            .collect()
    }

    pub fn backend(&self, name: &str) -> Option<&Arc<Backend>> {
        self.backends
            .binary_search_by(|b| b.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.backends[i])
    }

    /// The backends for `key`, primary first, ignoring health and load.
    pub fn candidates(&self, key: u64) -> impl Iterator<Item = &Arc<Backend>> + '_ {
        self.table.candidates(key).map(|i| &self.backends[i])
    }

    /// Active connections across the pool (for bounded-load caps).
    pub(crate) fn total_active(&self) -> u64 {
        self.backends.iter().map(|b| b.live.load.active()).sum()
    }
}

fn fingerprint(config: &Config, table: &Table, backends: &[Arc<Backend>]) -> String {
    let mut h = Params::new().hash_length(16).to_state();
    // Everything that decides where a key goes: how keys are read, the
    // table's owners and their addresses, and the load bound.
    h.update(config.mode.as_str().as_bytes());
    h.update(b"\0");
    h.update(key_identity(&config.key).as_bytes());
    h.update(b"\0");
    // Only when set, so configs without groups keep their fingerprints.
    if let Some(group) = &config.group {
        h.update(b"group:");
        h.update(group.describe().as_bytes());
        h.update(b"\0");
        if config.group_choices != 1 {
            h.update(format!("choices:{}\0", config.group_choices).as_bytes());
        }
    }
    match config.placement.bounded_load {
        Some(c) => {
            h.update(&c.to_bits().to_be_bytes());
            h.update(&config.placement.spill_min_excess.to_be_bytes())
        }
        None => h.update(b"unbounded"),
    };
    for b in backends {
        h.update(b.name.as_bytes());
        h.update(b"\0");
        h.update(b.addr.to_string().as_bytes());
        h.update(b"\0");
        h.update(&b.weight.to_be_bytes());
    }
    match table {
        Table::Maglev(m) => {
            h.update(b"maglev\0");
            for &owner in m.table() {
                h.update(&owner.to_be_bytes());
            }
        }
        Table::Ring(r) => {
            h.update(b"ring\0");
            for &(point, owner) in r.points() {
                h.update(&point.to_be_bytes());
                h.update(&owner.to_be_bytes());
            }
        }
    }
    h.finalize().to_hex().to_string()
}

/// Where a key comes from, as text (see [`crate::config::KeySources`]).
fn key_identity(key: &KeyConfig) -> String {
    let k = key.sources();
    format!(
        "{}:{}:{}:{}",
        k.from,
        k.header.unwrap_or(""),
        k.body_field.map_or("", |f| f.text.as_str()),
        key.read().map_or("", |r| Fallback::as_str(r.fallback))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(text: &str) -> Arc<Config> {
        Arc::new(Config::parse(Path::new("t.yaml"), text).unwrap())
    }

    #[test]
    fn fingerprint_ignores_file_order_and_sees_weights() {
        let a = config(
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8002}\n",
        );
        let b = config(
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: b, addr: 127.0.0.1:8002}\n  - {name: a, addr: 127.0.0.1:8001}\n",
        );
        let c = config(
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: b, addr: 127.0.0.1:8002, weight: 2}\n  - {name: a, addr: 127.0.0.1:8001}\n",
        );
        let none = HashMap::new();
        let sa = Snapshot::build(a, 1, &none).unwrap();
        let sb = Snapshot::build(b, 1, &none).unwrap();
        let sc = Snapshot::build(c, 1, &none).unwrap();
        assert_eq!(sa.fingerprint, sb.fingerprint);
        assert_ne!(sa.fingerprint, sc.fingerprint);
        assert_eq!(sa.fingerprint.len(), 32);
        assert_eq!(sa.backends[0].name, "a");
        assert!((sa.shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }

    /// Two configs that route a key differently never share a fingerprint;
    /// settings that move no key do not change it.
    #[test]
    fn the_fingerprint_covers_everything_that_routes_a_key() {
        let base = "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8002}\n";
        let print = |text: &str| {
            Snapshot::build(config(text), 1, &HashMap::new())
                .unwrap()
                .fingerprint
        };
        let reference = print(base);
        let routing = [
            base.replace("8002", "8003"),
            base.replace("listen", "key: {from: header, header: x-a}\nlisten"),
            base.replace("listen", "key: {from: source_addr}\nlisten"),
            base.replace("listen", "placement: {bounded_load: 1.25}\nlisten"),
            base.replace("listen", "mode: http\nkey: {from: header, header: x-a}\nlisten"),
            base.replace(
                "listen",
                "mode: http\nkey: {from: header, header: x-a, group: system}\nsessions: {}\nlisten",
            ),
            base.replace(
                "listen",
                "mode: http\nkey: {from: header, header: x-a, group: {prefix_bytes: 64}}\nsessions: {}\nlisten",
            ),
            base.replace(
                "listen",
                "mode: http\nkey: {from: header, header: x-a, group: {header: x-t}}\nsessions: {}\nlisten",
            ),
        ];
        let mut seen = vec![reference.clone()];
        for text in &routing {
            let f = print(text);
            assert!(!seen.contains(&f), "same fingerprint for:\n{text}");
            seen.push(f);
        }
        let header_a = print(&routing[1]);
        assert_ne!(
            header_a,
            print(&base.replace("listen", "key: {from: header, header: x-b}\nlisten"))
        );
        for moves_no_key in ["idle_timeout: 5m", "copy: splice", "copy: buffered"] {
            assert_eq!(
                reference,
                print(&base.replace("listen", &format!("{moves_no_key}\nlisten"))),
                "{moves_no_key}"
            );
        }
    }

    #[test]
    fn live_state_carries_over_only_for_same_name_and_address() {
        let first = Snapshot::build(
            config("listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8002}\n"),
            1,
            &HashMap::new(),
        )
        .unwrap();
        first.backends[0].live.traffic.count_connection();
        first.backends[1].live.traffic.count_connection();
        let second = Snapshot::build(
            config("listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8003}\n"),
            2,
            &first.live_states(),
        )
        .unwrap();
        assert!(Arc::ptr_eq(
            &first.backends[0].live,
            &second.backends[0].live
        ));
        assert_eq!(second.backend("a").unwrap().live.traffic.connections(), 1);
        assert_eq!(second.backend("b").unwrap().live.traffic.connections(), 0);
    }
}
