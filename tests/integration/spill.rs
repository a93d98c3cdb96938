//! Spill that does not scatter (mode http): a key spills only far above its
//! mean, stays on the backend it spilled to while its primary is loaded,
//! goes home once the primary is below its mean, and every decision is
//! counted by why it was made.

use crate::support::*;
use http_body_util::{BodyExt, Full};
use magpie_core::key;

/// `count` keys other than `except` whose primary is `primary`.
fn keys_on(magpie: &Magpie, primary: &str, except: &str, count: usize) -> Vec<String> {
    (0..10_000)
        .map(|i| format!("load-{i}"))
        .filter(|k| k != except && magpie.primary(key::text_key(k.as_bytes())) == primary)
        .take(count)
        .collect()
}

/// Waits until `backend` has `n` requests in flight.
async fn in_flight(magpie: &Magpie, backend: &str, n: u64) {
    let b = magpie.backend(backend);
    within("the in-flight count to settle", async {
        while b.active() != n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spilled_key_stays_until_its_primary_is_below_its_mean() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let settings = format!(
        "mode: http\n{SESSION_KEY}placement:\n  bounded_load: 1.25\n  spill_min_excess: 2\nhttp:\n  expose_backend: true\n"
    );
    let magpie = Magpie::start(&config_yaml_with_admin(
        "127.0.0.1:0",
        &settings,
        &backends.pairs(),
    ))
    .await;
    let admin = magpie.admin.expect("admin is on");
    let hot = key::text_key(b"hot");
    let home = magpie.primary(hot);

    // Four slow requests of other keys load the hot key's primary: with 4 in
    // flight its cap is max(ceil(1.25 · 5/3), ceil(5/3 + 2)) = 4, so it is full.
    // Each holder's body is read in a task of its own: the backend lets
    // them go in the order they reached its gate, not the order they began.
    let mut held = tokio::task::JoinSet::new();
    for k in keys_on(&magpie, &home, "hot", 4) {
        let mut client = KeepAlive::connect(magpie.addr).await;
        let request = get("/slow").header("x-session-id", k).body(Full::default());
        let response = client.start(request.expect("a request")).await;
        held.spawn(async move {
            let body = response.into_body().collect().await;
            drop(client);
            body.is_ok()
        });
    }
    in_flight(&magpie, &home, 4).await;

    let mut client = KeepAlive::connect(magpie.addr).await;
    let spilled = client.get_session("hot").await;
    assert_ne!(spilled, home, "a full primary keeps no new request");
    let (_, last) = admin_get(admin, "/route?key=hot").await;
    assert!(last.contains("\"how\": \"spilled_at_cap\""), "{last}");

    // One holder ends: the primary has room (3 < 4) but is above its mean
    // (4/3): the key stays where it spilled.
    backends.release(1);
    let first = within("a released response", held.join_next()).await;
    assert!(matches!(first, Some(Ok(true))), "its body");
    in_flight(&magpie, &home, 3).await;
    assert_eq!(
        client.get_session("hot").await,
        spilled,
        "the spill bounced back"
    );
    let (_, last) = admin_get(admin, "/route?key=hot").await;
    assert!(last.contains("\"how\": \"pinned\""), "{last}");
    assert!(last.contains("\"stays_after_spill\": true"), "{last}");

    // Everything ends: the primary is below its mean, the key goes home.
    backends.release(held.len());
    while let Some(done) = within("a released response", held.join_next()).await {
        assert!(matches!(done, Ok(true)), "its body");
    }
    in_flight(&magpie, &home, 0).await;
    assert_eq!(client.get_session("hot").await, home);

    let (_, metrics) = admin_get(admin, "/metrics").await;
    let routed = |how: &str| {
        let label = format!("how=\"{how}\"");
        metric_sum(&metrics, "magpie_requests_routed_total", &[label.as_str()])
    };
    assert_eq!(routed("spilled_at_cap"), 1.0, "{metrics}");
    assert_eq!(routed("pinned"), 1.0, "{metrics}");
    // The four holders, and the hot key's way home.
    assert_eq!(routed("primary"), 5.0, "{metrics}");
    magpie.stop().await;
}
