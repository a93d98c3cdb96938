//! Health checks through real sockets: a killed backend goes down within
//! interval × fall, its keys go to their next candidates while nobody else's
//! move, and it comes back after `rise` good checks.
//!
//! These run on the real clock with short intervals: with a paused clock, a
//! loopback connect that the kernel delivers a moment late lets the runtime
//! jump to the next timer and fail a healthy check.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use magpie_core::key::text_key;

use crate::support::*;

const INTERVAL: Duration = Duration::from_millis(200);
const FALL: u32 = 3;
const RISE: u32 = 2;

async fn until_up_is(magpie: &Magpie, name: &str, up: bool, limit: Duration) -> Duration {
    let started = Instant::now();
    let backend = magpie.backend(name);
    while backend.is_up() != up {
        assert!(
            started.elapsed() <= limit,
            "{name} not {} within {limit:?}",
            if up { "up" } else { "down" }
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_backend_goes_down_and_comes_back() {
    let keep = HttpBackends::start(&["a", "c"]).await;
    let victim = HttpBackends::start(&["b"]).await;
    let b_addr = victim.list[0].1;
    let mut list = keep.list.clone();
    list.insert(1, victim.list[0].clone());
    let settings = format!(
        "{SESSION_KEY}health:\n  interval: 200ms\n  timeout: 100ms\n  rise: {RISE}\n  fall: {FALL}\n  passive_failures: 0\n"
    );
    let magpie = Magpie::with(&settings, &list).await;
    let sessions: Vec<String> = (0..120).map(|i| format!("user-{i}")).collect();
    let mut before = HashMap::new();
    for s in &sessions {
        before.insert(s.clone(), backend_of(&http_get(magpie.addr, Some(s)).await));
    }
    assert!(
        before.values().any(|b| b == "b"),
        "some sessions must live on b"
    );

    // Kill b: its listener closes, connects are refused.
    drop(victim);
    // Slack: one interval's jitter (10%), the checks' own time, and a busy
    // machine's scheduling.
    let slack = INTERVAL / 10 + Duration::from_millis(1500);
    let took = until_up_is(&magpie, "b", false, INTERVAL * FALL + slack).await;
    assert!(took >= INTERVAL * (FALL - 1), "down too early: {took:?}");
    eprintln!("b was marked down {took:?} after it was killed");

    for s in &sessions {
        let now = backend_of(&http_get(magpie.addr, Some(s)).await);
        if before[s] == "b" {
            let next = magpie.candidates(text_key(s.as_bytes()))[1].clone();
            assert_eq!(now, next, "{s} must go to its next candidate");
        } else {
            assert_eq!(now, before[s], "{s} must not move");
        }
    }

    // b comes back on the same address after RISE good checks.
    let revived = HttpBackends::start_on(b_addr, &["b"]).await;
    let took = until_up_is(&magpie, "b", true, INTERVAL * RISE + slack).await;
    assert!(took >= INTERVAL * (RISE - 1), "up too early: {took:?}");
    eprintln!("b was marked up {took:?} after it came back");
    for s in &sessions {
        assert_eq!(
            backend_of(&http_get(magpie.addr, Some(s)).await),
            before[s],
            "{s} returns home"
        );
    }
    drop(revived);
    magpie.stop().await;
}

/// Passive marking: consecutive failed connects on the data path take a
/// backend down before any check runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failures_mark_a_backend_down() {
    let alive = HttpBackends::start(&["a"]).await;
    let list = vec![alive.list[0].clone(), ("b".to_string(), dead_addr())];
    let settings =
        format!("{SESSION_KEY}health:\n  interval: 1h\n  timeout: 1s\n  passive_failures: 2\n");
    let magpie = Magpie::with(&settings, &list).await;
    // The round of checks at start fails b once, short of `fall` (3).
    let on_b: Vec<String> = (0..200)
        .map(|i| format!("k{i}"))
        .filter(|k| magpie.primary(text_key(k.as_bytes())) == "b")
        .take(3)
        .collect();
    assert_eq!(on_b.len(), 3);
    for k in &on_b {
        assert_eq!(
            backend_of(&http_get(magpie.addr, Some(k)).await),
            "a",
            "failover to a"
        );
    }
    assert!(
        !magpie.backend("b").is_up(),
        "two failed connects mark b down"
    );
    assert!(
        magpie.backend_metric("magpie_backend_spills_total", "b", &["reason=\"down\""]) >= 1,
        "later keys of b are counted as spills"
    );
    magpie.stop().await;
}

/// When every candidate is down, the default tries them anyway (fail open);
/// `when_all_down: refuse` closes the client instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_down_fails_open_unless_told_to_refuse() {
    let backends = HttpBackends::start(&["a", "b"]).await;
    for (policy, serves) in [("try_anyway", true), ("refuse", false)] {
        let settings = format!(
            "{SESSION_KEY}health:\n  interval: 1h\n  timeout: 1s\n  when_all_down: {policy}\n"
        );
        let magpie = Magpie::with(&settings, &backends.list).await;
        for b in magpie.probe.backends() {
            b.set_up(false);
        }
        let primary = magpie.primary(text_key(b"s1"));
        if serves {
            assert_eq!(
                backend_of(&http_get(magpie.addr, Some("s1")).await),
                primary
            );
        } else {
            let mut stream = connect(magpie.addr).await;
            tokio::io::AsyncWriteExt::write_all(&mut stream, request(Some("s1"), true).as_bytes())
                .await
                .expect("send the request");
            let got = read_until_closed(&mut stream).await.unwrap_or_default();
            assert!(got.is_empty(), "refused, not served: {got:?}");
            assert_eq!(magpie.client_failures("no_backend"), 1);
        }
        magpie.stop().await;
    }
}
