//! Dead backends: the next candidate takes over, or the client is closed cleanly.

use magpie_core::key;
use magpie_proxy::routing::health::ConnectFailure;
use magpie_proxy::telemetry::stats::ClientFailure;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_primary_fails_over_to_the_next_candidate() {
    let live = HttpBackends::start(&["a", "b"]).await;
    let mut list = live.list.clone();
    list.push(("dead".to_string(), dead_addr()));
    let magpie = Magpie::with(SESSION_KEY, &list).await;

    // Sessions whose primary is the dead backend.
    let sessions: Vec<String> = (0..1000)
        .map(|i| format!("user-{i}"))
        .filter(|s| magpie.primary(key::text_key(s.as_bytes())) == "dead")
        .take(5)
        .collect();
    assert_eq!(
        sessions.len(),
        5,
        "expected a third of the keys on the dead backend"
    );

    for session in &sessions {
        let candidates = magpie.candidates(key::text_key(session.as_bytes()));
        let body = http_get(magpie.addr, Some(session)).await;
        assert_eq!(
            backend_of(&body),
            candidates[1],
            "{session}: candidates {candidates:?}"
        );
        assert_eq!(session_of(&body), *session);
    }
    let dead = magpie.backend("dead");
    assert_eq!(
        dead.live.health.connect_failures(ConnectFailure::Refused),
        5
    );
    assert_eq!(dead.live.traffic.connections(), 0);
    assert_eq!(
        magpie
            .instance
            .stats
            .client_failures(ClientFailure::NoBackend),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_dead_closes_the_client_cleanly() {
    let list = vec![
        ("x".to_string(), dead_addr()),
        ("y".to_string(), dead_addr()),
    ];
    let magpie = Magpie::with("", &list).await;
    let stats = &magpie.instance.stats;
    assert_eq!(stats.client_failures(ClientFailure::NoBackend), 0);

    let mut client = connect(magpie.addr).await;
    // EOF or a reset are both a clean close; a hang fails the read after 10 s.
    match read_until_closed(&mut client).await {
        Ok(bytes) => assert!(bytes.is_empty(), "got data from nowhere: {bytes:?}"),
        Err(e) => eprintln!("closed with an error (accepted): {e}"),
    }
    assert_eq!(stats.client_failures(ClientFailure::NoBackend), 1);
    for name in ["x", "y"] {
        assert_eq!(
            magpie
                .backend(name)
                .live
                .health
                .connect_failures(ConnectFailure::Refused),
            1,
            "{name} should have been tried once"
        );
    }
}
