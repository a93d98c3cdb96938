//! The same key reaches the same backend; different keys spread.

use std::collections::{BTreeMap, BTreeSet};

use magpie_core::key;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_session_reaches_same_backend_over_100_connections() {
    let backends = HttpBackends::start(&["a", "b", "c"]).await;
    let magpie = Magpie::with(SESSION_KEY, &backends.list).await;
    let expected = magpie.primary(key::text_key(b"alice"));

    for i in 0..100 {
        let body = http_get(magpie.addr, Some("alice")).await;
        assert_eq!(backend_of(&body), expected, "connection {i}: {body}");
        // The backend saw the request as sent: the bytes read for the key were replayed.
        assert_eq!(session_of(&body), "alice");
    }
    let backend = format!("backend=\"{expected}\"");
    let connections = magpie.metric("magpie_backend_connections_total", &[&backend]);
    assert_eq!(connections, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_spread_evenly_over_equal_backends() {
    let backends = HttpBackends::start(&["a", "b", "c"]).await;
    let magpie = Magpie::with(SESSION_KEY, &backends.list).await;

    let mut landed: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..300 {
        let session = format!("session-{i}");
        let body = http_get(magpie.addr, Some(&session)).await;
        let got = backend_of(&body);
        assert_eq!(
            got,
            magpie.primary(key::text_key(session.as_bytes())),
            "{session} did not land on its primary"
        );
        *landed.entry(got).or_default() += 1;
    }
    assert_eq!(
        landed.len(),
        3,
        "every backend should get sessions: {landed:?}"
    );
    for (name, count) in &landed {
        // 25% to 42% of 300.
        assert!(
            (75..=126).contains(count),
            "backend {name} got {count} of 300 sessions: {landed:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_ip_mode_is_sticky_per_address_and_spreads_across_addresses() {
    let backends = HttpBackends::start(&["a", "b", "c"]).await;
    let magpie = Magpie::with("", &backends.list).await;

    let mut chosen = BTreeSet::new();
    for last in 2..=13u8 {
        let source = loopback(last);
        let expected = magpie.primary(key::source_ip_key(source));
        for round in 0..3 {
            // A session header must not matter in source_ip mode.
            let session = format!("{last}-{round}");
            let body = http_get_from(source, magpie.addr, Some(&session)).await;
            assert_eq!(
                backend_of(&body),
                expected,
                "{source}, round {round}: not on the primary for its address"
            );
        }
        chosen.insert(expected);
    }
    assert!(
        chosen.len() >= 2,
        "twelve source addresses all mapped to {chosen:?}: no spread"
    );
}
