//! `key.group`: the table is looked up by a conversation's group (its head,
//! or a tenant header) for its first request, and the session key's pin
//! keeps it there. Conversations of one head land together, a hot head
//! spreads along its own candidates and back, magpies agree, and the redis
//! store shares the pin.

use std::collections::BTreeMap;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use magpie_core::key::group::{GroupBy, GroupMiss, body_group_key};
use magpie_core::key::text_key;
use magpie_core::placement::bounded;

use crate::support::*;

const BY_HEAD: &str = "mode: http\nkey:\n  from: conversation\n  header: x-session-id\n  group: system\nsessions:\n  ttl: 10m\n";

fn by_tenant(extra: &str) -> String {
    format!(
        "mode: http\nkey:\n  from: header\n  header: x-session-id\n  group: {{header: x-tenant-id}}\nsessions:\n  ttl: 10m\nplacement:\n  bounded_load: 1.25\n  spill_min_excess: 2\n{extra}"
    )
}

fn chat(system: &str, turns: &[&str]) -> String {
    let mut messages = vec![format!(r#"{{"role":"system","content":"{system}"}}"#)];
    for (i, text) in turns.iter().enumerate() {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(format!(r#"{{"role":"{role}","content":"{text}"}}"#));
    }
    format!(
        r#"{{"model":"llama","tools":[{{"type":"function","function":{{"name":"search"}}}}],"messages":[{}]}}"#,
        messages.join(",")
    )
}

fn head_group(body: &str) -> u64 {
    body_group_key(body.as_bytes(), &GroupBy::System).expect("a group")
}

/// `key.group: conversation` beside a header session key: conversations
/// that open with one document land on that opening's primary whatever
/// their session keys (which alone would spread them), turn after turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_that_open_alike_land_together_whatever_their_keys() {
    let backends = HyperBackends::start(&["a", "b", "c", "d"]).await;
    let config = "mode: http\nkey:\n  from: header\n  header: x-session-id\n  group: conversation\nsessions:\n  ttl: 10m\n";
    let magpie = Magpie::with(config, &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let mut homes = std::collections::BTreeSet::new();
    for d in 0..6 {
        let document = format!("document {d}");
        let opening = chat("summarize", &[&document]);
        let group = body_group_key(opening.as_bytes(), &GroupBy::Conversation).expect("a group");
        let home = magpie.primary(group);
        homes.insert(home.clone());
        let sessions: Vec<String> = (0..5).map(|s| format!("reader-{d}-{s}")).collect();
        let by_session: std::collections::BTreeSet<String> = (sessions.iter())
            .map(|s| magpie.primary(text_key(s.as_bytes())))
            .collect();
        assert!(by_session.len() > 1, "document {d}: {by_session:?}");
        for session in &sessions {
            let mut turns = vec![document.as_str()];
            for turn in 0..3 {
                let got = client
                    .post_json(&chat("summarize", &turns), Some(session))
                    .await;
                assert_eq!(got, home, "{session}, turn {turn}");
                turns.extend(["noted", "go on"]);
            }
        }
    }
    assert!(
        homes.len() > 1,
        "the openings spread over the pool: {homes:?}"
    );
    // A body without a user message has no group: its session key places it.
    let no_user = r#"{"model":"llama","messages":[{"role":"system","content":"s"}]}"#;
    let got = client.post_json(no_user, Some("lonely")).await;
    assert_eq!(got, magpie.primary(text_key(b"lonely")));
    let misses = group_misses(&magpie, GroupMiss::NoUserMessage);
    assert_eq!(misses, 1);
    magpie.stop().await;
}

/// 8 heads × 6 conversations × 3 turns: each conversation lands on its
/// head's primary, turn after turn, whatever its opening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_of_one_head_land_together() {
    let backends = HyperBackends::start(&["a", "b", "c", "d"]).await;
    let magpie = Magpie::with(BY_HEAD, &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let mut heads_on: BTreeMap<String, usize> = BTreeMap::new();
    for h in 0..8 {
        let system = format!("you are agent {h}");
        let home = magpie.primary(head_group(&chat(&system, &["x"])));
        *heads_on.entry(home.clone()).or_default() += 1;
        for c in 0..6 {
            let opening = format!("task {c} for agent {h}");
            let mut turns = vec![opening.as_str()];
            for turn in 0..3 {
                let got = client.post_json(&chat(&system, &turns), None).await;
                assert_eq!(got, home, "agent {h}, conversation {c}, turn {turn}");
                turns.extend(["done", "next"]);
            }
        }
    }
    let placed: u64 = backends
        .list
        .iter()
        .map(|b| placements(&magpie, &b.name, "1"))
        .sum();
    assert_eq!(placed, 48, "one placement per conversation, all at rank 1");
    for (name, heads) in &heads_on {
        let seen = magpie.backend_metric("magpie_backend_groups_seen", name, &[]);
        assert_eq!(seen as usize, *heads, "{name}");
    }
    // A body without instructions or tools has no group: its session key
    // (here the conversation's own head) places it.
    let plain = r#"{"model":"llama","messages":[{"role":"user","content":"hi"}]}"#;
    let by_session =
        magpie_core::key::conversation::conversation_key(plain.as_bytes()).expect("a key");
    assert_eq!(
        client.post_json(plain, None).await,
        magpie.primary(by_session)
    );
    assert_eq!(group_misses(&magpie, GroupMiss::NoHead), 1);
    magpie.stop().await;
}

/// With a session header, the body is still read for the group: the head
/// places the first request, and the session's pin keeps later ones even
/// when their head changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_header_keeps_the_pin_its_head_placed() {
    let backends = HyperBackends::start(&["a", "b", "c", "d", "e"]).await;
    let magpie = Magpie::with(BY_HEAD, &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    // A head and a session whose own primaries differ.
    let (session, body) = (0..100)
        .map(|i| (format!("s-{i}"), chat(&format!("head {i}"), &["hi"])))
        .find(|(s, b)| magpie.primary(text_key(s.as_bytes())) != magpie.primary(head_group(b)))
        .expect("a session and a head on different backends");
    let home = magpie.primary(head_group(&body));
    assert_eq!(client.post_json(&body, Some(&session)).await, home);
    let other = (0..100)
        .map(|i| chat(&format!("other {i}"), &["hi"]))
        .find(|b| magpie.primary(head_group(b)) != home)
        .expect("another head elsewhere");
    assert_eq!(client.post_json(&other, Some(&session)).await, home);
    assert_eq!(group_misses(&magpie, GroupMiss::NotJson), 0);
    magpie.stop().await;
}

/// A held `/slow` request of `session` in `tenant`: the client, the
/// streaming response, and the backend that took it.
async fn hold(magpie: &Magpie, tenant: &str, session: &str) -> (KeepAlive, Response, String) {
    let mut client = KeepAlive::connect(magpie.addr).await;
    let request = get("/slow")
        .header("x-tenant-id", tenant)
        .header("x-session-id", session)
        .body(Full::default())
        .expect("a request");
    let mut response = client.start(request).await;
    let frame = within("the first chunk", response.body_mut().frame())
        .await
        .expect("a frame")
        .expect("a good frame");
    let text = String::from_utf8_lossy(frame.data_ref().expect("data")).into_owned();
    let name = text
        .trim()
        .strip_prefix("first from ")
        .unwrap_or_else(|| panic!("not a slow answer: {text:?}"))
        .to_string();
    (client, response, name)
}

type Response = hyper::Response<Incoming>;

/// A fast request of `session` in `tenant` (or no tenant): the backend.
async fn ask(client: &mut KeepAlive, tenant: Option<&str>, session: &str) -> String {
    let mut request = get("/").header("x-session-id", session);
    if let Some(t) = tenant {
        request = request.header("x-tenant-id", t);
    }
    let (response, body) = client
        .send(request.body(Full::<Bytes>::default()).expect("a request"))
        .await;
    assert_eq!(response.status(), 200);
    backend_in(&body)
}

/// Waits until magpie has `n` requests in flight in all.
async fn settle(magpie: &Magpie, n: u64) {
    within("the in-flight count to settle", async {
        while magpie.active().iter().map(|(_, k)| k).sum::<u64>() != n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Holds `n` slow conversations of tenant `hot` (`conv-0`, …), checking
/// each lands on the first of `candidates` under its bounded-load cap;
/// returns them and how many each backend holds.
async fn fill(
    magpie: &Magpie,
    candidates: &[String],
    n: u64,
) -> (Vec<(KeepAlive, Response)>, BTreeMap<String, u64>) {
    let mut active: BTreeMap<String, u64> = BTreeMap::new();
    let mut held = Vec::new();
    for s in 0..n {
        let total = active.values().sum();
        let cap = bounded::spill_cap(1.25, 2, total, 1, 3);
        let expected = candidates
            .iter()
            .find(|c| active.get(*c).copied().unwrap_or(0) < cap)
            .expect("a candidate with room")
            .clone();
        let (client, response, got) = hold(magpie, "hot", &format!("conv-{s}")).await;
        assert_eq!(got, expected, "conversation {s}: {active:?}, cap {cap}");
        *active.entry(got).or_default() += 1;
        held.push((client, response));
        settle(magpie, s + 1).await;
    }
    (held, active)
}

/// A hot tenant's new conversations fill its first candidate, then its
/// second, then its third, each one where the bounded-load cap says; once
/// the load is gone a new conversation is back on the first, and every
/// conversation placed meanwhile stays on its pin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_group_spreads_along_its_candidates_and_back() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let yaml = config_yaml_with_admin("127.0.0.1:0", &by_tenant(""), &backends.pairs());
    let magpie = Magpie::start(&yaml).await;
    let admin = magpie.admin.expect("admin is on");
    let candidates = magpie.candidates(text_key(b"hot"));
    let (held, active) = fill(&magpie, &candidates, 20).await;
    let rank = |r: &str| -> u64 { candidates.iter().map(|c| placements(&magpie, c, r)).sum() };
    assert!(rank("2") > 0 && rank("3") > 0, "{active:?}");
    assert_eq!(rank("1") + rank("2") + rank("3"), 20);
    let second = &candidates[1];
    let mut on_second = Vec::new();
    for s in (0..20).map(|s| format!("conv-{s}")) {
        let (_, route) = admin_get(admin, &format!("/route?key={s}")).await;
        let route: serde_json::Value = serde_json::from_str(&route).expect("/route is JSON");
        if route["pinned"].as_str() == Some(second.as_str()) {
            on_second.push(s);
        }
    }
    assert!(!on_second.is_empty());
    let (_, route) = admin_get(admin, &format!("/route?key={}&group=hot", on_second[0])).await;
    assert!(route.contains("\"pin_rank\": 2"), "{route}");
    assert!(route.contains("\"table_key\": \"group\""), "{route}");

    // The load ends: a new conversation is back on the first candidate,
    // and the ones placed on the second stay there.
    backends.release(held.len());
    for (_, response) in held {
        within("a released response", response.into_body().collect())
            .await
            .expect("its body");
    }
    settle(&magpie, 0).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    assert_eq!(ask(&mut client, Some("hot"), "new").await, candidates[0]);
    for s in &on_second {
        assert_eq!(&ask(&mut client, Some("hot"), s).await, second, "{s} moved");
    }
    // The group's last request is remembered by its session: /route finds it.
    let (_, route) = admin_get(admin, &format!("/route?key={}", on_second[0])).await;
    assert!(route.contains("\"from\": \"last_request\""), "{route}");
    assert!(route.contains("\"pin_rank\": 2"), "{route}");

    // Without the tenant header, the session key places the conversation.
    assert_eq!(
        ask(&mut client, None, "alone").await,
        magpie.primary(text_key(b"alone"))
    );
    let (_, metrics) = admin_get(admin, "/metrics").await;
    let misses = metric_sum(
        &metrics,
        "magpie_group_fallbacks_total",
        &["reason=\"missing_header\""],
    );
    assert_eq!(misses, 1.0, "{metrics}");
    let placed = metric_sum(&metrics, "magpie_group_placements_total", &["rank=\"2\""]);
    assert_eq!(placed, rank("2") as f64);
    let seen = metric_sum(
        &metrics,
        "magpie_backend_groups_seen",
        &[&format!("backend=\"{}\"", candidates[0])],
    );
    assert_eq!(seen, 1.0, "{metrics}");
    crate::engine_load::promtool_accepts(&metrics);
    magpie.stop().await;
}

/// Two magpies with one config and no shared store place every
/// conversation of every head alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_magpies_agree_on_placements() {
    let backends = HyperBackends::start(&["a", "b", "c", "d", "e"]).await;
    let magpies = [
        Magpie::with(BY_HEAD, &backends.pairs()).await,
        Magpie::with(BY_HEAD, &backends.pairs()).await,
    ];
    let mut clients = [
        KeepAlive::connect(magpies[0].addr).await,
        KeepAlive::connect(magpies[1].addr).await,
    ];
    let mut homes = BTreeMap::new();
    for h in 0..12 {
        for c in 0..3 {
            let body = chat(&format!("head {h}"), &[&format!("opening {c}")]);
            let first = clients[0].post_json(&body, None).await;
            assert_eq!(clients[1].post_json(&body, None).await, first, "head {h}");
            assert_eq!(*homes.entry(h).or_insert_with(|| first.clone()), first);
        }
    }
    let distinct: std::collections::BTreeSet<&String> = homes.values().collect();
    assert!(distinct.len() >= 3, "12 heads on {distinct:?}");
    for m in magpies {
        m.stop().await;
    }
}

/// Through a shared redis store: a conversation placed on its group's
/// second candidate by a loaded magpie is served there by the other one
/// too, where a new conversation of the group takes the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_store_shares_the_session_pin() {
    let redis = RedisServer::start().await;
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let settings = by_tenant("reload:\n  watch: false\n").replace(
        "  ttl: 10m\n",
        &format!(
            "  ttl: 10m\n  store: redis\n  redis: {{addr: \"{}\", timeout: 500ms}}\n",
            redis.addr
        ),
    );
    let magpies = [
        Magpie::with(&settings, &backends.pairs()).await,
        Magpie::with(&settings, &backends.pairs()).await,
    ];
    for m in &magpies {
        m.store_connected().await;
    }
    let candidates = magpies[0].candidates(text_key(b"hot"));
    // Load the first candidate through magpie 0 until it is full.
    let mut held = Vec::new();
    for s in 0..4 {
        let (client, response, got) = hold(&magpies[0], "hot", &format!("load-{s}")).await;
        assert_eq!(got, candidates[0]);
        held.push((client, response));
    }
    settle(&magpies[0], 4).await;
    let mut first = KeepAlive::connect(magpies[0].addr).await;
    let placed = ask(&mut first, Some("hot"), "spread").await;
    assert_eq!(
        placed, candidates[1],
        "a full first candidate takes no new conversation"
    );
    // Magpie 1 sees no load: a new conversation goes to the first
    // candidate, the one magpie 0 placed stays where it was bound.
    let mut second = KeepAlive::connect(magpies[1].addr).await;
    assert_eq!(ask(&mut second, Some("hot"), "fresh").await, candidates[0]);
    assert_eq!(ask(&mut second, Some("hot"), "spread").await, placed);
    backends.release(held.len());
    for (_, response) in held {
        within("a released response", response.into_body().collect())
            .await
            .expect("its body");
    }
    settle(&magpies[0], 0).await;
    assert_eq!(ask(&mut first, Some("hot"), "spread").await, placed);
    assert_eq!(placements(&magpies[0], &placed, "2"), 1);
    for m in magpies {
        m.stop().await;
    }
}

/// Conversations first placed on `backend` at its group's candidate `rank`.
fn placements(magpie: &Magpie, backend: &str, rank: &str) -> u64 {
    let rank = format!("rank=\"{rank}\"");
    magpie.backend_metric("magpie_group_placements_total", backend, &[&rank])
}

/// Requests without a group, for `why`.
fn group_misses(magpie: &Magpie, why: GroupMiss) -> u64 {
    let reason = format!("reason=\"{}\"", why.as_str());
    magpie.metric("magpie_group_fallbacks_total", &[&reason])
}
