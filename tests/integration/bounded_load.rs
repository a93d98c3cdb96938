//! Bounded load: one hot key spills to the next candidates, stays where it
//! spilled while its primary is loaded, and no backend ever holds more than
//! its cap.

use std::collections::BTreeMap;

use magpie_core::key;
use magpie_core::placement::bounded;

use crate::support::*;

async fn hot_key_respects_the_cap(factor: f64, excess: u64, connections: u64) {
    let backends = HttpBackends::start(&["a", "b", "c"]).await;
    let settings = format!(
        "placement:\n  bounded_load: {factor}\n  spill_min_excess: {excess}\n{SESSION_KEY}"
    );
    let magpie = Magpie::with(&settings, &backends.list).await;
    let candidates = magpie.candidates(key::text_key(b"hot"));
    let total_weight = 3;

    // Connections stay open (keep-alive), so each one holds its slot.
    let mut held = Vec::new();
    let mut landed: BTreeMap<String, u64> = BTreeMap::new();
    // Where the key spilled to, if it stays there (see `expected_landing`).
    let mut spilled_to: Option<String> = None;
    for k in 0..connections {
        let cap = bounded::spill_cap(factor, excess, k, 1, total_weight);
        let expected = expected_landing(&candidates, &landed, &mut spilled_to, k, cap);

        let mut stream = connect(magpie.addr).await;
        let body = http_keepalive(&mut stream, Some("hot")).await;
        let got = backend_of(&body);
        assert_eq!(
            got, expected,
            "factor {factor}, connection {k}: landed {landed:?}, cap {cap}"
        );
        *landed.entry(got).or_default() += 1;
        held.push(stream);

        let active = magpie.active();
        let total: u64 = active.iter().map(|(_, n)| n).sum();
        assert_eq!(total, k + 1, "active counts {active:?}");
        for (name, n) in &active {
            assert!(
                *n <= cap,
                "factor {factor}: {name} holds {n} connections, cap {cap}: {active:?}"
            );
            assert_eq!(
                *n,
                landed.get(name).copied().unwrap_or(0),
                "live count of {name} disagrees with where connections landed"
            );
        }
    }
    assert!(
        landed.len() == 3,
        "factor {factor}: the hot key should have spilled to every backend: {landed:?}"
    );
    assert!(
        magpie.metric(
            "magpie_backend_spills_total",
            &[
                &format!("backend=\"{}\"", candidates[0]),
                "reason=\"at_cap\""
            ]
        ) > 0,
        "spills on the primary were not counted"
    );
    drop(held);
}

/// Where connection `k` of the hot key must go, given the `k` open ones:
/// where it spilled to while its primary is not below its mean share and
/// that backend has room; else the first candidate below its cap. Updates
/// `spilled_to` as magpie's memory of the key does.
fn expected_landing(
    candidates: &[String],
    landed: &BTreeMap<String, u64>,
    spilled_to: &mut Option<String>,
    k: u64,
    cap: u64,
) -> String {
    let load = |name: &str| landed.get(name).copied().unwrap_or(0);
    let primary = &candidates[0];
    let home_has_room = (load(primary) as f64) < bounded::mean(k, 1, 3);
    if let Some(to) = spilled_to.clone()
        && !home_has_room
        && load(&to) < cap
    {
        return to;
    }
    let first = candidates
        .iter()
        .find(|name| load(name) < cap)
        .expect("caps sum above the total")
        .clone();
    *spilled_to = (first != *primary).then(|| first.clone());
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_load_1_0_spills_and_never_exceeds_the_cap() {
    hot_key_respects_the_cap(1.0, 0, 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_load_1_25_spills_and_never_exceeds_the_cap() {
    hot_key_respects_the_cap(1.25, 0, 15).await;
}

/// With the default absolute threshold the primary takes 13 connections of
/// a burst before one spills, where the cap alone spilled the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_excess_spills_a_hot_key_only_far_above_its_mean() {
    hot_key_respects_the_cap(1.25, 8, 60).await;
}
