//! Placement benchmarks: the hash, Maglev lookup and build, ring, rendezvous
//! and bounded-load lookups, and the candidate walks the proxy takes. Keys and their hashes are made before timing
//! starts; every lookup goes through `black_box` so nothing is folded away.
//!
//! Run with `cargo bench --bench placement`; docs/performance.md records the medians.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use magpie_core::hash::h64;
use magpie_core::placement::bounded;
use magpie_core::placement::maglev::{DEFAULT_TABLE_SIZE, Maglev};
use magpie_core::placement::rendezvous::Rendezvous;
use magpie_core::placement::ring::Ring;
use magpie_core::placement::{Node, NodeSet, Scheme};

/// A power of two, so the key index wraps with a mask.
const KEYS: usize = 4096;

fn pool(n: usize) -> NodeSet {
    NodeSet::new((0..n).map(|i| Node::new(format!("backend-{i}"), 1))).expect("valid pool")
}

/// 16-byte keys `key-0000000000…` and their hashes.
fn keys() -> (Vec<[u8; 16]>, Vec<u64>) {
    let raw: Vec<[u8; 16]> = (0..KEYS)
        .map(|i| {
            let mut k = [0u8; 16];
            k.copy_from_slice(format!("key-{i:012}").as_bytes());
            k
        })
        .collect();
    let hashes = raw.iter().map(|k| h64(k)).collect();
    (raw, hashes)
}

fn hash(c: &mut Criterion) {
    let (raw, _) = keys();
    let mut i = 0;
    c.bench_function("h64/16-byte key", |b| {
        b.iter(|| {
            i = (i + 1) & (KEYS - 1);
            h64(black_box(&raw[i]))
        })
    });
}

fn maglev_lookup(c: &mut Criterion) {
    let (_, hashes) = keys();
    let m = Maglev::new(&pool(100), DEFAULT_TABLE_SIZE).expect("table");
    let mut i = 0;
    c.bench_function("maglev/lookup N=100 M=65537", |b| {
        b.iter(|| {
            i = (i + 1) & (KEYS - 1);
            m.primary(black_box(hashes[i]))
        })
    });
}

fn maglev_build(c: &mut Criterion) {
    let mut group = c.benchmark_group("maglev/build");
    group.sample_size(20);
    for m in [DEFAULT_TABLE_SIZE, 655_373] {
        for n in [10, 100, 1000] {
            let set = pool(n);
            group.bench_with_input(
                BenchmarkId::new(format!("M={m}"), format!("N={n}")),
                &set,
                |b, set| b.iter(|| Maglev::new(black_box(set), m).expect("table")),
            );
        }
    }
    group.finish();
}

fn ring_lookup(c: &mut Criterion) {
    let (_, hashes) = keys();
    let ring = Ring::new(&pool(100), 100).expect("ring");
    let mut i = 0;
    c.bench_function("ring-100/lookup N=100", |b| {
        b.iter(|| {
            i = (i + 1) & (KEYS - 1);
            ring.primary(black_box(hashes[i]))
        })
    });
}

fn rendezvous_lookup(c: &mut Criterion) {
    let (_, hashes) = keys();
    let r = Rendezvous::new(&pool(100));
    let mut i = 0;
    c.bench_function("rendezvous/lookup N=100", |b| {
        b.iter(|| {
            i = (i + 1) & (KEYS - 1);
            r.primary(black_box(hashes[i]))
        })
    });
}

/// The candidate walk the proxy takes: its first candidate (every backend
/// healthy), and a walk to the 64-candidate limit (everything down or full),
/// for both tables the proxy serves from.
fn candidates(c: &mut Criterion) {
    let (_, hashes) = keys();
    let set = pool(100);
    let maglev = Maglev::new(&set, DEFAULT_TABLE_SIZE).expect("table");
    let ring = Ring::new(&set, 100).expect("ring");
    let mut i = 0;
    c.bench_function("maglev/candidates first N=100", |b| {
        b.iter(|| {
            i = (i + 1) & (KEYS - 1);
            maglev.candidates(black_box(hashes[i])).next()
        })
    });
    c.bench_function("maglev/candidates all N=100", |b| {
        b.iter(|| {
            i = (i + 1) & (KEYS - 1);
            maglev.candidates(black_box(hashes[i])).sum::<usize>()
        })
    });
    c.bench_function("ring-100/candidates first N=100", |b| {
        b.iter(|| {
            i = (i + 1) & (KEYS - 1);
            ring.candidates(black_box(hashes[i])).next()
        })
    });
    c.bench_function("ring-100/candidates all N=100", |b| {
        b.iter(|| {
            i = (i + 1) & (KEYS - 1);
            ring.candidates(black_box(hashes[i])).sum::<usize>()
        })
    });
}

/// Ring-100 over 100 nodes with bounded loads at c = 1.10: the mean load is
/// 1/1.10 ≈ 90% of the cap, and loads spread ±15% around the mean, so about
/// one node in six is full and some lookups walk past their primary.
fn bounded_lookup(c: &mut Criterion) {
    let (_, hashes) = keys();
    let set = pool(100);
    let ring = Ring::new(&set, 100).expect("ring");
    let loads: Vec<u64> = (0..100u64)
        .map(|i| 1000 + (h64(&i.to_le_bytes()) % 301) - 150)
        .collect();
    let total: u64 = loads.iter().sum();
    let full = loads
        .iter()
        .filter(|&&l| l >= bounded::cap(1.10, total, 1, 100))
        .count();
    eprintln!("bounded lookup: {full} of 100 nodes full");
    let mut i = 0;
    c.bench_function("bounded-ring/lookup N=100 at 90% load", |b| {
        b.iter(|| {
            i = (i + 1) & (KEYS - 1);
            // As traffic walks: the first candidate below its cap.
            ring.candidates(black_box(hashes[i]))
                .find(|&n| loads[n] < bounded::cap(1.10, total, 1, 100))
        })
    });
}

fn config() -> Criterion {
    // Two shared cores: short runs, enough samples for a stable median.
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = hash, maglev_lookup, maglev_build, ring_lookup, rendezvous_lookup, candidates, bounded_lookup
}
criterion_main!(benches);
