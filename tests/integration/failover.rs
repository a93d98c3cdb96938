//! Dead backends: the next candidate takes over, or the client is closed cleanly.

use crate::support::*;
use magpie_core::key;

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
    let dead = ["backend=\"dead\""];
    let refused = [dead[0], "reason=\"refused\""];
    assert_eq!(
        magpie.metric("magpie_backend_connect_failures_total", &refused),
        5
    );
    assert_eq!(magpie.metric("magpie_backend_connections_total", &dead), 0);
    assert_eq!(no_backend(&magpie), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_dead_closes_the_client_cleanly() {
    let list = vec![
        ("x".to_string(), dead_addr()),
        ("y".to_string(), dead_addr()),
    ];
    let magpie = Magpie::with("", &list).await;
    assert_eq!(no_backend(&magpie), 0);

    let mut client = connect(magpie.addr).await;
    // EOF or a reset are both a clean close; a hang fails the read after 10 s.
    match read_until_closed(&mut client).await {
        Ok(bytes) => assert!(bytes.is_empty(), "got data from nowhere: {bytes:?}"),
        Err(e) => eprintln!("closed with an error (accepted): {e}"),
    }
    assert_eq!(no_backend(&magpie), 1);
    for name in ["x", "y"] {
        let refused = [&format!("backend=\"{name}\""), "reason=\"refused\""];
        assert_eq!(
            magpie.metric("magpie_backend_connect_failures_total", &refused),
            1,
            "{name} should have been tried once"
        );
    }
}

/// Clients that got no backend at all.
fn no_backend(magpie: &Magpie) -> u64 {
    magpie.metric("magpie_client_failures_total", &["reason=\"no_backend\""])
}
