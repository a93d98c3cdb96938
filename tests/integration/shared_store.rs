//! What the shared session store (`sessions.store: redis`, a real
//! `redis-server`) may lose or hold that magpie must survive: every binding
//! (an empty restart or a FLUSHALL after a scale-up, healed within `ttl/4`),
//! a value far over 256 bytes, a key of the wrong type, one late answer
//! (which a later turn of a conversation waits out).

use std::sync::Arc;
use std::time::{Duration, Instant};

use magpie_core::key::group::{GroupBy, body_group_key};
use magpie_core::key::text_key;
use tokio::task::JoinHandle;

use crate::support::*;

/// How the store loses its bindings.
#[derive(Clone, Copy, Debug)]
enum Loss {
    /// Killed and started again, empty.
    Restart,
    /// `FLUSHALL` on a live connection.
    Flush,
}

const TTL: Duration = Duration::from_secs(4);

/// Conversations pinned through magpie 0, the pool scaled from 3 to 4 in
/// both configs, then the store loses every binding. Each pass sends every
/// conversation through magpie 1, then magpie 0. Within `ttl/4` (and well
/// before any pin could expire) no conversation is split between backends,
/// and none splits again.
async fn pins_heal_after(loss: Loss) {
    let mut redis = RedisServer::start().await;
    let backends = HyperBackends::start(&["a", "b", "c", "d"]).await;
    let pairs = backends.pairs();
    let settings = store_settings_ttl(redis.addr, &format!("{}s", TTL.as_secs()), "");
    let fleet = Fleet::start(&settings, &pairs[..3]).await;
    let mut clients = [
        KeepAlive::connect(fleet.magpies[0].addr).await,
        KeepAlive::connect(fleet.magpies[1].addr).await,
    ];
    let keys: Vec<String> = (0..60).map(|s| format!("conv-{s}")).collect();
    let mut placed = Vec::new();
    for key in &keys {
        placed.push(clients[0].get_session(key).await);
    }
    fleet.reload(&settings, &pairs).await;
    let moved = keys
        .iter()
        .zip(&placed)
        .filter(|(key, before)| fleet.magpies[1].primary(text_key(key.as_bytes())) != **before)
        .count();
    assert!(moved > 0, "the new table moves none of the pinned keys");
    match loss {
        Loss::Restart => {
            redis.kill();
            redis.restart().await;
        }
        Loss::Flush => {
            redis.command(&[b"FLUSHALL"]).await;
        }
    }
    let lost = Instant::now();
    let mut splits = Vec::new();
    let healed = loop {
        let mut split = 0;
        for key in &keys {
            let second = clients[1].get_session(key).await;
            let first = clients[0].get_session(key).await;
            split += usize::from(first != second);
        }
        splits.push(split);
        if split == 0 {
            break lost.elapsed();
        }
        assert!(
            lost.elapsed() < TTL / 4 + Duration::from_millis(1500),
            "{loss:?}: still split after {:?}, split keys per pass: {splits:?}",
            lost.elapsed()
        );
    };
    assert!(healed < TTL, "{loss:?}: healed only after {healed:?}");
    for _ in 0..3 {
        for key in &keys {
            let second = clients[1].get_session(key).await;
            assert_eq!(
                clients[0].get_session(key).await,
                second,
                "{loss:?}: {key} split again"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_heal_after_the_store_restarts_empty() {
    pins_heal_after(Loss::Restart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_heal_after_the_store_is_flushed() {
    pins_heal_after(Loss::Flush).await;
}

/// One routing decision for `session` through magpie `m` (its pin, the
/// store, the table), timed.
async fn decide(m: &Magpie, session: &str) -> (String, Duration) {
    let started = Instant::now();
    let first = m.probe.decide(text_key(session.as_bytes())).await;
    (first.expect("a backend"), started.elapsed())
}

/// What the store holds for `session`.
async fn binding(redis: &RedisServer, session: &str) -> Option<String> {
    match redis.command(&[b"GET", &store_key(session)]).await {
        redis::Value::BulkString(bytes) => Some(String::from_utf8(bytes).expect("UTF-8")),
        redis::Value::Nil => None,
        other => panic!("GET answered {other:?}"),
    }
}

async fn one_magpie(redis: &RedisServer, backends: &HyperBackends) -> Magpie {
    let yaml = config_yaml(
        "127.0.0.1:0",
        &store_settings(redis.addr, ""),
        &backends.pairs(),
    );
    let magpie = Magpie::start(&yaml).await;
    magpie.store_connected().await;
    magpie
}

/// 8 MiB under one key: its lookup answers within the 50 ms timeout, as
/// do 20 new keys looked up at the same time; the value is treated as
/// absent, replaced by the table's choice and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_value_is_absent_replaced_and_counted() {
    let redis = RedisServer::start().await;
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpie = Arc::new(one_magpie(&redis, &backends).await);
    let big = vec![b'x'; 8 << 20];
    redis.command(&[b"SET", &store_key("big"), &big]).await;
    let others = (0..20).map(|s| {
        let magpie = Arc::clone(&magpie);
        tokio::spawn(async move { decide(&magpie, &format!("other-{s}")).await })
    });
    let (got, elapsed) = decide(&magpie, "big").await;
    assert!(
        elapsed < Duration::from_millis(50),
        "the lookup took {elapsed:?}"
    );
    assert_eq!(got, magpie.primary(text_key(b"big")));
    assert_eq!(binding(&redis, "big").await.as_deref(), Some(got.as_str()));
    for (s, other) in others.enumerate() {
        let (got, _) = other.await.expect("the lookup runs");
        let key = format!("other-{s}");
        assert_eq!(binding(&redis, &key).await, Some(got), "{key} is not bound");
    }
    assert_eq!(store_fallbacks(&magpie), 0, "a lookup went by the table");
    assert_eq!(store_ops(&magpie, "timeout"), 0);
    assert_eq!(bad_values(&magpie), 1);
    let mut client = KeepAlive::connect(magpie.addr).await;
    assert_eq!(client.get_session("big").await, got);
}

/// A list and a hash where bindings live: each is absent for its own key
/// only (bound over, counted), and the next key's lookup still uses the
/// store: nothing backs off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_type_key_is_absent_for_that_key_only() {
    let redis = RedisServer::start().await;
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpie = one_magpie(&redis, &backends).await;
    redis
        .command(&[b"RPUSH", &store_key("listed"), b"a", b"b"])
        .await;
    redis
        .command(&[b"HSET", &store_key("hashed"), b"backend", b"a"])
        .await;
    for (n, key) in ["listed", "next-1", "hashed", "next-2"].iter().enumerate() {
        let (got, _) = decide(&magpie, key).await;
        assert_eq!(got, magpie.primary(text_key(key.as_bytes())), "{key}");
        assert_eq!(binding(&redis, key).await, Some(got), "{key} is not bound");
        assert_eq!(bad_values(&magpie), (n as u64 + 2) / 2, "after {key}");
    }
    assert_eq!(store_ops(&magpie, "skipped"), 0, "the store backed off");
    assert_eq!(store_ops(&magpie, "error"), 0);
    assert_eq!(store_fallbacks(&magpie), 0);
    assert_eq!(bad_values(&magpie), 2);
}

/// The store stalls past the timeout (`DEBUG SLEEP`) under one lookup: that
/// one goes by the table, counted as a timeout; nothing backs off, and the
/// next lookup uses the store at once, over the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_late_answer_backs_nothing_off() {
    let redis = Arc::new(RedisServer::start().await);
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpie = one_magpie(&redis, &backends).await;
    let (before, _) = decide(&magpie, "before").await;
    assert_eq!(binding(&redis, "before").await, Some(before));
    let connections = connections_received(&redis).await;
    let stall = stall(&redis, "0.25");
    // Lookups answer until the server sleeps; the first one then goes by
    // the table.
    until_fallbacks(&magpie, 1).await;
    stall.await.expect("DEBUG SLEEP runs");
    let (after, _) = decide(&magpie, "after").await;
    assert_eq!(binding(&redis, "after").await, Some(after), "not looked up");
    assert_eq!(store_ops(&magpie, "skipped"), 0, "the store backed off");
    assert_eq!(
        (store_ops(&magpie, "timeout"), store_ops(&magpie, "error")),
        (1, 0)
    );
    assert_eq!(store_fallbacks(&magpie), 1);
    // The stall's, the binding's read and this one's: magpie did not
    // reconnect.
    assert_eq!(connections_received(&redis).await, connections + 3);
}

/// The store stalls (`DEBUG SLEEP`) under three lookups in a row: each goes
/// by the table after the timeout, and then the store is left alone (the
/// next lookup, in the stall, does not ask it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_late_answers_in_a_row_back_off() {
    let redis = Arc::new(RedisServer::start().await);
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpie = one_magpie(&redis, &backends).await;
    decide(&magpie, "before").await;
    let stall = stall(&redis, "2");
    until_fallbacks(&magpie, 3).await;
    assert_eq!(store_ops(&magpie, "timeout"), 3);
    decide(&magpie, "skipped").await;
    assert_eq!(store_ops(&magpie, "skipped"), 1, "the store was asked");
    stall.await.expect("DEBUG SLEEP runs");
}

/// The store pauses for 120 ms (`CLIENT PAUSE`), past the 50 ms timeout,
/// under a queue and with conversation groups. A later turn of a
/// conversation that an earlier turn bound off the table's choice (through
/// another magpie) waits for that binding and goes there; a conversation's
/// first request, bound off the table's choice the same way, does not wait
/// and goes by the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_turn_waits_out_a_late_answer_for_its_binding() {
    let redis = RedisServer::start().await;
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let settings = store_settings_by_opening(redis.addr);
    let yaml = config_yaml("127.0.0.1:0", &settings, &backends.pairs());
    let magpie = Magpie::start(&yaml).await;
    magpie.store_connected().await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let turns = |user: &str, more: &str| {
        format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"s"}},{{"role":"user","content":"{user}"}}{more}]}}"#
        )
    };
    let answered = r#",{"role":"assistant","content":"hi"},{"role":"user","content":"more"}"#;
    for (session, later) in [("later", true), ("first", false)] {
        let body = turns(session, if later { answered } else { "" });
        let opening = turns(session, "");
        let group = body_group_key(opening.as_bytes(), &GroupBy::Conversation).expect("a group");
        let order = magpie.candidates(group);
        let elsewhere = order[1].as_bytes();
        redis
            .command(&[b"SET", &store_key(session), elsewhere])
            .await;
        redis.command(&[b"CLIENT", b"PAUSE", b"120", b"ALL"]).await;
        let goes = if later { &order[1] } else { &order[0] };
        assert_eq!(
            &client.post_json(&body, Some(session)).await,
            goes,
            "{session}"
        );
    }
    assert_eq!(
        store_fallbacks(&magpie),
        1,
        "the first request went by the table"
    );
}

/// Stalls `redis` for `seconds` (`DEBUG SLEEP`), as a busy host would.
fn stall(redis: &Arc<RedisServer>, seconds: &'static str) -> JoinHandle<redis::Value> {
    let redis = Arc::clone(redis);
    tokio::spawn(async move {
        redis
            .command(&[b"DEBUG", b"SLEEP", seconds.as_bytes()])
            .await
    })
}

/// Looks up new keys until `n` went by the table.
async fn until_fallbacks(magpie: &Magpie, n: u64) {
    within("lookups to go by the table", async {
        for k in 0.. {
            decide(magpie, &format!("during-{k}")).await;
            if store_fallbacks(magpie) >= n {
                break;
            }
        }
    })
    .await;
}

/// The connections `redis` accepted so far (this one's included).
async fn connections_received(redis: &RedisServer) -> u64 {
    let info = match redis.command(&[b"INFO", b"stats"]).await {
        redis::Value::BulkString(bytes) => String::from_utf8(bytes).expect("UTF-8"),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("INFO answered {other:?}"),
    };
    (info.lines())
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no connection count in {info}"))
}

/// Lookups that went by the table because the store did not answer.
fn store_fallbacks(magpie: &Magpie) -> u64 {
    magpie.metric("magpie_session_store_fallbacks_total", &[])
}

/// Bindings the store held that were no backend's name.
fn bad_values(magpie: &Magpie) -> u64 {
    magpie.metric("magpie_session_store_bad_values_total", &[])
}
