//! Bounded load: one hot key spills to the next candidates and no backend
//! ever holds more than its cap.

use std::collections::BTreeMap;

use magpie::key;
use magpie::placement::bounded;

use crate::support::*;

async fn hot_key_respects_the_cap(factor: f64, connections: u64) {
    let backends = HttpBackends::start(&["a", "b", "c"]).await;
    let settings = format!("placement:\n  bounded_load: {factor}\n{SESSION_KEY}");
    let magpie = Magpie::with(&settings, &backends.list).await;
    let candidates = magpie.candidates(key::text_key(b"hot"));
    let total_weight = 3;

    // Connections stay open (keep-alive), so each one holds its slot.
    let mut held = Vec::new();
    let mut landed: BTreeMap<String, u64> = BTreeMap::new();
    for k in 0..connections {
        // Where this connection must go: the first candidate below its cap,
        // given the k connections already open.
        let cap = bounded::cap(factor, k, 1, total_weight);
        let expected = candidates
            .iter()
            .find(|name| landed.get(*name).copied().unwrap_or(0) < cap)
            .expect("caps sum above the total")
            .clone();

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
        magpie
            .backend(&candidates[0])
            .live
            .traffic
            .spills(magpie::backend::Spill::AtCap)
            > 0,
        "spills on the primary were not counted"
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_load_1_0_spills_and_never_exceeds_the_cap() {
    hot_key_respects_the_cap(1.0, 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_load_1_25_spills_and_never_exceeds_the_cap() {
    hot_key_respects_the_cap(1.25, 15).await;
}
