//! `magpie plan OLD NEW`: what a config change will move, before it is made.
//!
//! Operators of inference pools need to know how many sessions lose their KV
//! cache before they add or remove a replica. This compares two built
//! snapshots with every backend up:
//!
//! * the share of the key space whose owner changes. Two Maglev tables of the
//!   same size are compared slot by slot (exact); otherwise (ring, or a table
//!   size change) ownership is compared at [`SAMPLES`] evenly spaced points of
//!   the 64-bit hash space;
//! * the ideal minimum: the share that must move for the new shares to hold at
//!   all, the sum over backends of max(0, old share − new share);
//! * each backend's slots (or share), before → after;
//! * with a key list, the share of those keys whose backend changes;
//! * with `placement.slow_start` in the new config, the ramp of the backends
//!   it adds: the share of their keys that has moved to them at each quarter.

use serde::Serialize;

use magpie_core::key::KeyTextError;
use magpie_proxy::{Snapshot, Table};

/// Points of the hash space compared when tables cannot be compared slot by slot.
pub const SAMPLES: u64 = 1 << 20;

#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    pub old_fingerprint: String,
    pub new_fingerprint: String,
    /// Share of the key space that changes owner.
    pub moved: f64,
    /// The least any table could move for the new weights.
    pub ideal: f64,
    /// `slots` (exact) or `sampled`.
    pub method: &'static str,
    pub backends: Vec<BackendChange>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeysMoved>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_start: Option<Ramp>,
}

/// How the backends a change adds take their keys over (`placement.slow_start`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Ramp {
    pub seconds: f64,
    pub added: Vec<String>,
    /// (seconds after the change, share of their keys moved to them):
    /// measured at [`SAMPLES`] points of the hash space.
    pub steps: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BackendChange {
    pub name: String,
    /// Maglev slots; `None` when absent on that side or not a Maglev table.
    pub slots_before: Option<u64>,
    pub slots_after: Option<u64>,
    pub share_before: f64,
    pub share_after: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KeysMoved {
    pub total: usize,
    pub moved: usize,
    pub share: f64,
}

/// Compares `old` and `new`; `keys` are key texts in the new config's key mode.
pub fn compare(
    old: &Snapshot,
    new: &Snapshot,
    keys: &[String],
) -> Result<PlanReport, KeyTextError> {
    let (moved, method) = moved_share(old, new);
    let backends = backend_changes(old, new);
    let ideal = ideal_share(&backends);
    let keys = keys_moved(old, new, keys)?;
    Ok(PlanReport {
        old_fingerprint: old.fingerprint.clone(),
        new_fingerprint: new.fingerprint.clone(),
        moved,
        ideal,
        method,
        backends,
        keys,
        slow_start: ramp(old, new),
    })
}

/// The ramp of the backends `new` adds, with `placement.slow_start`: at each
/// quarter of it, the share of the keys they own in `new` that has moved to
/// them (the rest stay where they were).
fn ramp(old: &Snapshot, new: &Snapshot) -> Option<Ramp> {
    use magpie_core::placement::slow_start::moved;
    let length = new.config.placement.slow_start?;
    let added: Vec<String> = (new.backends.iter())
        .filter(|b| old.backend(&b.name).is_none())
        .map(|b| b.name.clone())
        .collect();
    if added.is_empty() {
        return None;
    }
    let step = u64::MAX / SAMPLES;
    let theirs: Vec<(u64, String)> = (0..SAMPLES)
        .map(|i| i * step + step / 2)
        .filter_map(|key| {
            owner(new, key)
                .filter(|o| added.contains(o))
                .map(|o| (key, o))
        })
        .collect();
    let steps = [0.25, 0.5, 0.75, 1.0]
        .map(|p| {
            let n = theirs
                .iter()
                .filter(|(k, o)| p >= 1.0 || moved(*k, o, p))
                .count();
            (
                length.as_secs_f64() * p,
                n as f64 / theirs.len().max(1) as f64,
            )
        })
        .to_vec();
    Some(Ramp {
        seconds: length.as_secs_f64(),
        added,
        steps,
    })
}

/// The name of the backend that owns `key` in `s`.
fn owner(s: &Snapshot, key: u64) -> Option<String> {
    s.candidates(key).next().map(|b| b.name.clone())
}

/// The share of the key space whose owner changes, and how it was measured:
/// slot by slot (`slots`) for two Maglev tables of the same size, else at
/// [`SAMPLES`] points (`sampled`).
fn moved_share(old: &Snapshot, new: &Snapshot) -> (f64, &'static str) {
    match (&old.table, &new.table) {
        (Table::Maglev(a), Table::Maglev(b)) if a.table_size() == b.table_size() => {
            let changed = a
                .table()
                .iter()
                .zip(b.table())
                .filter(|&(&x, &y)| old.backends[x as usize].name != new.backends[y as usize].name)
                .count();
            (changed as f64 / a.table_size() as f64, "slots")
        }
        _ => (sampled_moved_share(old, new), "sampled"),
    }
}

/// The share of [`SAMPLES`] evenly spaced points of the 64-bit hash space
/// whose owner changes.
fn sampled_moved_share(old: &Snapshot, new: &Snapshot) -> f64 {
    let step = u64::MAX / SAMPLES;
    let changed = (0..SAMPLES)
        .filter(|i| {
            let key = i * step + step / 2;
            owner(old, key) != owner(new, key)
        })
        .count();
    changed as f64 / SAMPLES as f64
}

/// Maglev slots per backend, in backend order; `None` for a ring.
fn slot_counts(s: &Snapshot) -> Option<Vec<u64>> {
    match &s.table {
        Table::Maglev(m) => Some(m.slot_counts()),
        Table::Ring(_) => None,
    }
}

/// Every backend of either side, by name, with its slots and share before
/// and after.
fn backend_changes(old: &Snapshot, new: &Snapshot) -> Vec<BackendChange> {
    let (old_slots, new_slots) = (slot_counts(old), slot_counts(new));
    let mut names: Vec<&str> = old
        .backends
        .iter()
        .chain(&new.backends)
        .map(|b| b.name.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    let find = |s: &Snapshot, name: &str| s.backends.iter().position(|b| b.name == name);
    names
        .iter()
        .map(|&name| {
            let (o, n) = (find(old, name), find(new, name));
            BackendChange {
                name: name.to_string(),
                slots_before: o.and_then(|i| old_slots.as_ref().map(|s| s[i])),
                slots_after: n.and_then(|i| new_slots.as_ref().map(|s| s[i])),
                share_before: o.map(|i| old.shares[i]).unwrap_or(0.0),
                share_after: n.map(|i| new.shares[i]).unwrap_or(0.0),
            }
        })
        .collect()
}

/// The least share any table could move for the new shares to hold: the sum
/// over backends of max(0, share before − share after).
fn ideal_share(backends: &[BackendChange]) -> f64 {
    backends
        .iter()
        .map(|b| (b.share_before - b.share_after).max(0.0))
        .sum()
}

/// How many of the listed key texts change backend; `None` without keys.
fn keys_moved(
    old: &Snapshot,
    new: &Snapshot,
    keys: &[String],
) -> Result<Option<KeysMoved>, KeyTextError> {
    if keys.is_empty() {
        return Ok(None);
    }
    let mut moved = 0;
    for text in keys {
        let key = new.config.key.key_of_text(text)?;
        if owner(old, key) != owner(new, key) {
            moved += 1;
        }
    }
    Ok(Some(KeysMoved {
        total: keys.len(),
        moved,
        share: moved as f64 / keys.len() as f64,
    }))
}

impl std::fmt::Display for PlanReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "fingerprint: {} -> {}",
            self.old_fingerprint, self.new_fingerprint
        )?;
        let how = if self.method == "slots" {
            "of table slots"
        } else {
            "of the key space (sampled)"
        };
        writeln!(
            f,
            "moved:       {:.2}% {how} change owner (ideal minimum {:.2}%)",
            self.moved * 100.0,
            self.ideal * 100.0
        )?;
        if let Some(k) = &self.keys {
            writeln!(
                f,
                "keys:        {} of {} listed keys move ({:.2}%)",
                k.moved,
                k.total,
                k.share * 100.0
            )?;
        }
        writeln!(f, "backends:")?;
        for b in &self.backends {
            let side = |slots: Option<u64>, share: f64, present: bool| match (present, slots) {
                (false, _) => "-".to_string(),
                (true, Some(s)) => format!("{s} ({:.2}%)", share * 100.0),
                (true, None) => format!("{:.2}%", share * 100.0),
            };
            let before = side(
                b.slots_before,
                b.share_before,
                b.share_before > 0.0 || b.slots_before.is_some(),
            );
            let after = side(
                b.slots_after,
                b.share_after,
                b.share_after > 0.0 || b.slots_after.is_some(),
            );
            writeln!(f, "  {:<20} {:>18} -> {}", b.name, before, after)?;
        }
        if let Some(r) = &self.slow_start {
            let steps: Vec<String> = (r.steps.iter())
                .map(|(at, share)| format!("{:.0}% at {at:.0}s", share * 100.0))
                .collect();
            writeln!(
                f,
                "slow start:  {} take their keys over {:.0}s: {}; the rest stay where they are until then",
                r.added.join(", "),
                r.seconds,
                steps.join(", ")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magpie_proxy::config::Config;
    use std::sync::Arc;

    fn snapshot(algorithm: &str, n: usize) -> Snapshot {
        snapshot_with(&format!("algorithm: {algorithm}"), n)
    }

    fn snapshot_with(placement: &str, n: usize) -> Snapshot {
        let mut yaml = format!(
            "listen: 127.0.0.1:7000\nplacement: {{{placement}}}\nkey: {{from: header, header: x-session-id}}\nbackends:\n"
        );
        for i in 0..n {
            yaml.push_str(&format!(
                "  - {{name: gpu-{i}, addr: '127.0.0.1:{}'}}\n",
                8000 + i
            ));
        }
        let config = Config::parse(std::path::Path::new("t.yaml"), &yaml).unwrap();
        Snapshot::of(Arc::new(config)).unwrap()
    }

    #[test]
    fn the_slow_start_ramp_of_an_added_backend_is_shown() {
        let r = compare(
            &snapshot("maglev", 3),
            &snapshot_with("slow_start: 60s", 4),
            &[],
        )
        .unwrap();
        let ramp = r.slow_start.clone().unwrap();
        assert_eq!(
            (ramp.seconds, ramp.added.as_slice()),
            (60.0, &["gpu-3".to_string()][..])
        );
        for ((at, share), (want_at, want)) in
            ramp.steps
                .iter()
                .zip([(15.0, 0.25), (30.0, 0.5), (45.0, 0.75), (60.0, 1.0)])
        {
            assert_eq!(*at, want_at);
            assert!((share - want).abs() < 0.01, "{share} at {at}");
        }
        assert!(
            r.to_string()
                .contains("slow start:  gpu-3 take their keys over 60s: 25% at 15s"),
            "{r}"
        );
        // Without slow_start, or without an added backend: no ramp.
        assert!(
            compare(&snapshot("maglev", 3), &snapshot("maglev", 4), &[])
                .unwrap()
                .slow_start
                .is_none()
        );
        let same = snapshot_with("slow_start: 60s", 4);
        assert!(compare(&same, &same, &[]).unwrap().slow_start.is_none());
    }

    #[test]
    fn one_joining_backend_moves_about_one_in_n_plus_one() {
        for algorithm in ["maglev", "ring"] {
            let (old, new) = (snapshot(algorithm, 10), snapshot(algorithm, 11));
            let keys: Vec<String> = (0..5000).map(|i| format!("session-{i}")).collect();
            let r = compare(&old, &new, &keys).unwrap();
            let ideal = 1.0 / 11.0;
            assert!(
                (r.ideal - ideal).abs() < 0.02,
                "{algorithm}: ideal {}",
                r.ideal
            );
            assert!(
                r.moved >= r.ideal - 0.01 && r.moved < ideal + 0.03,
                "{algorithm}: moved {}",
                r.moved
            );
            let k = r.keys.unwrap();
            assert!(
                (k.share - r.moved).abs() < 0.03,
                "{algorithm}: keys {} vs {}",
                k.share,
                r.moved
            );
            assert_eq!(r.backends.len(), 11);
            let joined = r.backends.iter().find(|b| b.name == "gpu-10").unwrap();
            assert_eq!(joined.share_before, 0.0);
            assert!(joined.share_after > 0.08);
        }
        let r = compare(&snapshot("maglev", 10), &snapshot("maglev", 11), &[]).unwrap();
        assert_eq!(r.method, "slots");
        assert_eq!(
            r.backends.iter().filter_map(|b| b.slots_after).sum::<u64>(),
            65537
        );
    }

    #[test]
    fn identical_configs_move_nothing() {
        let r = compare(
            &snapshot("maglev", 5),
            &snapshot("maglev", 5),
            &["a".into()],
        )
        .unwrap();
        assert_eq!(r.moved, 0.0);
        assert_eq!(r.ideal, 0.0);
        assert_eq!(r.old_fingerprint, r.new_fingerprint);
        assert_eq!(r.keys.unwrap().moved, 0);
    }
}
